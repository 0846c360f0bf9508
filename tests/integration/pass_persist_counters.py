"""net-snmp pass_persist helper for the fabric lab: serves OIDs and values from a JSON file the test writes
({"1.3.6...": ["counter64", 123]}), re-read on every request. Protocol: PING/PONG, get, getnext (snmpd(8))."""

from __future__ import annotations

import json
import sys


def _key(oid: str) -> tuple[int, ...]:
    return tuple(int(p) for p in oid.strip(".").split(".") if p)


def main() -> None:
    path = sys.argv[1]
    while True:
        command = sys.stdin.readline().strip()
        if not command:
            return
        if command == "PING":
            print("PONG", flush=True)
            continue
        oid = sys.stdin.readline().strip()
        try:
            with open(path) as fh:
                values = {_key(k): v for k, v in json.load(fh).items()}
        except (OSError, ValueError):
            values = {}
        wanted = _key(oid)
        if command == "get":
            found = wanted if wanted in values else None
        elif command == "getnext":
            found = next((k for k in sorted(values) if k > wanted), None)
        else:  # set: read-only
            print("not-writable", flush=True)
            continue
        if found is None:
            print("NONE", flush=True)
            continue
        kind, value = values[found]
        print("." + ".".join(map(str, found)), kind, value, sep="\n", flush=True)


if __name__ == "__main__":
    main()
