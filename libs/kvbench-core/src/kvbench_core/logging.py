"""Structured logging through stdlib ``logging``; ids travel as fields (``extra={"run_id": ...}``)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

__all__ = ["JsonFormatter", "configure_logging", "redact"]

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_SECRET_WORDS = ("token", "password", "secret", "passphrase", "authorization", "community", "auth_key")


def redact(key: str, value: Any) -> Any:
    """Secrets never reach logs: any field whose name looks like a credential is masked."""
    if any(word in key.lower() for word in _SECRET_WORDS) and value not in (None, ""):
        return "***"
    return value


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = redact(key, value)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class _PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        fields = {k: redact(k, v) for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
        return base + ("  " + " ".join(f"{k}={v}" for k, v in fields.items()) if fields else "")


def configure_logging(service: str, level: str = "INFO", json_logs: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter(service))
    else:
        handler.setFormatter(_PlainFormatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiohttp.access", "uvicorn.access", "nats"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
