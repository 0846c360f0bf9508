"""Certificates for a bus with TLS on one's own machines (`kvbench up --nats-tls`): a certificate authority made
here, and the NATS servers' certificate it signs for the addresses they listen on. Clients trust the authority's
certificate (``KVBENCH_NATS_CA_FILE``). Made with the ``cryptography`` package; the keys never leave the state
directory (mode 600)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["TlsFiles", "make_certificates"]


@dataclass(frozen=True)
class TlsFiles:
    ca_file: Path  # the authority's certificate: what clients trust
    cert_file: Path  # the servers' certificate
    key_file: Path  # its key (mode 600)


def _write(path: Path, data: bytes, private: bool) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)


def make_certificates(directory: Path, hosts: list[str], days: int = 825) -> TlsFiles:
    """An authority and a server certificate for ``hosts`` (addresses or names), in ``directory``; kept when they are
    there and cover the same hosts."""
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    wanted = sorted(set(hosts) | {"127.0.0.1", "localhost"})
    marker = directory / "hosts"
    kept = all(f.exists() for f in (files.ca_file, files.cert_file, files.key_file, marker))
    if kept and marker.read_text().split() == wanted:
        return files
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvbench bus authority")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in wanted:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvbench bus")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(files.ca_file, ca.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.cert_file, server.public_bytes(serialization.Encoding.PEM), private=False)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    _write(files.key_file, key_pem, private=True)
    marker.write_text("\n".join(wanted) + "\n")
    return files
