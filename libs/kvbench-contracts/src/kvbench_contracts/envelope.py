"""The envelope every bus message carries, and subject derivation from the model itself."""

from __future__ import annotations

import re
import string
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from ulid import ULID

__all__ = ["Envelope", "new_id", "utc_now"]

_SUBJECT_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


def new_id() -> str:
    """A ULID string: sortable by creation time and free of dots, so it is safe in subjects."""
    return str(ULID())


def utc_now() -> datetime:
    return datetime.now(UTC)


MESSAGES: dict[str, type[Envelope]] = {}  # by schema id; filled as each message class is defined


class Envelope(BaseModel):
    """Base of every message on the bus.

    Subclasses set ``SCHEMA`` (``"kvbench.job.started/1"``) and ``SUBJECT`` (a template such as
    ``"kvbench.job.{job_id}.started"`` whose placeholders are fields of the model). Wire models are
    tolerant readers (unknown fields are ignored) so additive changes never break a consumer.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    SCHEMA: ClassVar[str]
    SUBJECT: ClassVar[str]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        # every message registers itself where it is defined: the one list of messages (MESSAGES) is never
        # written by hand, so a new message is always checked against the streams
        super().__pydantic_init_subclass__(**kwargs)
        schema = cls.__dict__.get("SCHEMA")
        if schema is not None:
            known = MESSAGES.get(schema)
            if known is not None and known.__qualname__ != cls.__qualname__:
                raise TypeError(f"{cls.__name__} and {known.__name__} both declare the schema {schema}")
            MESSAGES[schema] = cls

    event_id: str = Field(default_factory=new_id, description="ULID; also sent as Nats-Msg-Id for dedup")
    occurred_at: datetime = Field(default_factory=utc_now, description="When the fact happened (UTC)")
    schema_name: str = Field(
        default="", alias="schema", description="Schema id with version, e.g. kvbench.job.started/1"
    )

    def model_post_init(self, __context: Any) -> None:
        if not self.schema_name:
            object.__setattr__(self, "schema_name", type(self).SCHEMA)

    @classmethod
    def subject_fields(cls) -> list[str]:
        return [name for _, name, _, _ in string.Formatter().parse(cls.SUBJECT) if name]

    def subject(self) -> str:
        values = {name: str(getattr(self, name)) for name in self.subject_fields()}
        for name, value in values.items():
            if not _SUBJECT_TOKEN.match(value):
                raise ValueError(f"{type(self).__name__}.{name}={value!r} cannot be a subject token")
        return type(self).SUBJECT.format(**values)

    @classmethod
    def subject_filter(cls, **known: str) -> str:
        """The subject with the given ids filled in and every other placeholder a ``*`` wildcard."""
        values = {name: known.get(name, "*") for name in cls.subject_fields()}
        return cls.SUBJECT.format(**values)

    def to_bytes(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()
