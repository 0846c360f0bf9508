"""Fabric contracts: switches, counter samples, LLDP links (reference/fabric.md section 7).

Counter values are integers (64-bit counters never become floats); every sample says where it came from
and when it was read, so deltas can be aligned to a job's window with guard bands.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvbench_contracts.envelope import Envelope

__all__ = [
    "CounterSample",
    "LldpNeighbor",
    "NicSampled",
    "SwitchConfig",
    "SwitchSampled",
    "SwitchSpec",
    "SwitchUnread",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SwitchSpec(_Frozen):
    """How to read one switch, without its login (the API takes the login; the registry stores it as a secret)."""

    # a JetStream KV key and one token of the subjects its readings are published on (kvbench.switch.<name>.sampled):
    # no dot, space, '*' or '>' (a dotted name was stored, then every polling round failed to publish)
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        max_length=63,
        description="Switch name: letters, digits, '-' and '_' (its sysName's host part: leaf1 for leaf1.lab)",
    )
    address: str = Field(min_length=1, description="Poll endpoint: host or IP")
    port: int = Field(161, ge=1, le=65535, description="SNMP UDP port, or gNMI TCP port (default 9339 for gNMI)")
    protocol: Literal["snmp", "gnmi"] = Field("snmp", description="Driver: SNMP, or gNMI (OpenConfig paths)")
    gnmi_tls: Literal["tls", "tls_skip_verify", "plaintext"] = Field(
        "tls", description="gNMI transport: TLS trusting the switch's certificate, TLS unverified, or plaintext"
    )
    snmp_version: Literal["2c", "3"] = Field("3", description="SNMP version")
    auth_protocol: Literal["SHA", "SHA256", "MD5"] = Field("SHA", description="SNMPv3 authentication")
    priv_protocol: Literal["AES", "AES256", "DES"] = Field("AES", description="SNMPv3 privacy")
    chassis_id: str | None = Field(None, description="LLDP chassis id, to match host LLDP neighbours")
    ignore_ports: list[str] = Field(default_factory=list, description="Ports that carry no benchmark traffic")
    no_benchmark_traffic: bool = Field(False, description="Marked as carrying none: it never blocks publishing")

    @model_validator(mode="before")
    @classmethod
    def _gnmi_port(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("protocol") == "gnmi" and "port" not in data:
            return {**data, "port": 9339}  # the IANA-registered gNMI port
        return data


class SwitchConfig(SwitchSpec):
    """One connected switch. Credentials are not here: ``secret`` names the stored secret that holds them."""

    secret: str = Field(
        description="Name of the stored secret: v2c community, v3 'user:authkey:privkey', or gNMI 'user:password'"
    )


class CounterSample(_Frozen):
    device: str = Field(description="Switch name or host name")
    device_kind: Literal["switch", "host"]
    port: str = Field(description="Switch ifName, host netdev, or RDMA 'mlx5_0/1'")
    counter: str = Field(description="Canonical name, e.g. if.in_octets, if.oper_status, pause.in_frames")
    qualifier: dict[str, Any] = Field(default_factory=dict, description="{'priority': 3} and the like")
    value: int
    unit: Literal["octets", "packets", "frames", "microseconds", "words4", "mbps", "bytes", "state", "ticks"]
    kind: Literal["counter", "gauge", "state"] = "counter"
    ts_request_ns: int = Field(description="Wall clock when the read was sent (or started)")
    ts_response_ns: int = Field(description="Wall clock when the answer came")
    ts_device_ns: int | None = Field(None, description="Device timestamp (gNMI); null for SNMP")
    source: str = Field(description="'snmp:1.3.6.1.2.1.31.1.1.1.6' | 'sysfs:.../tx_bytes' | 'ethtool:rx_prio3_pause'")
    epoch: str = Field("", description="sysUpTime-derived boot id or host boot id: a change means a counter reset")


class LldpNeighbor(_Frozen):
    """One cable as one side sees it."""

    local_port: str = Field(description="Host netdev, or the switch port whose remote table holds the entry")
    chassis_id: str
    chassis_id_subtype: str = ""
    system_name: str = ""
    port_id: str
    port_id_subtype: str = ""
    port_descr: str = ""
    mgmt_addresses: list[str] = Field(default_factory=list)


class SwitchSampled(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.switch.sampled/1"
    SUBJECT: ClassVar[str] = "kvbench.switch.{switch}.sampled"
    switch: str
    samples: list[CounterSample]
    lldp_remote: list[LldpNeighbor] = Field(default_factory=list, description="The switch's LLDP-MIB remote table")


class SwitchUnread(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.switch.unread/1"
    SUBJECT: ClassVar[str] = "kvbench.switch.{switch}.unread"
    switch: str
    reason: str


class NicSampled(Envelope):
    """A machine's own NIC and RDMA port counters, read while it serves a run (the host side of each cable)."""

    SCHEMA: ClassVar[str] = "kvbench.nic.sampled/1"
    SUBJECT: ClassVar[str] = "kvbench.nic.{node_id}.sampled"
    node_id: str
    run_id: str
    samples: list[CounterSample]
