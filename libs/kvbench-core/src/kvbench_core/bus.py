"""A thin typed bus over nats-py JetStream.

- ``Bus.connect`` ensures the streams and KV buckets declared in ``kvbench_contracts.streams``
  (idempotently) and drains the connection on exit.
- ``publish`` derives the subject from the message and sets ``Nats-Msg-Id`` to its event id, so a
  retried publish is dropped by JetStream's duplicate window.
- ``subscribe`` runs a durable pull consumer: batches are fetched, each message is decoded by its
  ``schema`` field into the registered model; undecodable messages are terminated and counted (poison),
  handler errors are nak'ed with an exponential back-off, successes are acked; a handler that raises
  ``LeaveForOthers`` has its message redelivered after the delay it names, to whichever consumer asks first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.streams import BUCKETS, STREAMS, StreamSpec, stream_for_subject
from kvbench_core.access import inbox_prefix
from kvbench_core.bus_errors import TRANSIENT_BUS_ERRORS
from kvbench_core.kvmirror import KvMirror, kv_subject_counts
from kvbench_core.metrics import metric_name

__all__ = ["TRANSIENT_BUS_ERRORS", "Bus", "BusMetrics", "LeaveForOthers", "NatsAuth", "Subscription", "nats_servers"]

log = logging.getLogger(__name__)

_SCHEMA_FIELD = re.compile(rb'"schema"\s*:\s*"([^"\\]{1,200})"')

E = TypeVar("E", bound=Envelope)
T = TypeVar("T")
Handler = Callable[[Envelope], Awaitable[None]]
BatchHandler = Callable[[list[Envelope]], Awaitable[None]]
PoisonHandler = Callable[[bytes, str], Awaitable[None]]  # the message's bytes, why it cannot be read


@dataclass(frozen=True)
class Poisoned:
    """A message that cannot be read, and why."""

    error: str


PUBLISH_RETRY_S = 30.0
# reads of one bucket's keys sent before the first answer: enough to hide the round trip, few enough not to
# crowd out the services' own requests on a busy server
KV_READS_IN_FLIGHT = 32


def nats_servers(url: str) -> list[str]:
    """The servers of a NATS URL setting: one URL, or several separated by commas (a cluster's)."""
    return [part.strip() for part in url.split(",") if part.strip()]


@dataclass(frozen=True)
class NatsAuth:
    """How a service proves who it is to the bus: a shared token, or a NATS credentials file (nkey and JWT).
    Neither ever goes on a command line or into a log."""

    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    user: str | None = None  # a user of its own with subject permissions (kvbench_core.access), with its password
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None  # a bus with TLS: the authority its certificate is checked against

    def connect_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.token:
            options["token"] = self.token
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        if self.user:
            # replies come back on the user's own inbox prefix: its permissions let it read nobody else's
            options.update(user=self.user, password=self.password or "", inbox_prefix=inbox_prefix(self.user))
        if self.ca_file:
            options["tls"] = ssl.create_default_context(cafile=self.ca_file)
        return options


async def _retrying(operation: Callable[[], Awaitable[T]], subject: str, retry_for_s: float) -> T:
    """``operation``'s result, tried again with back-off while the bus says it is recovering, for at most
    ``retry_for_s``; its last error is raised after that (and any other error at once)."""
    deadline = time.monotonic() + retry_for_s
    attempt = 0
    while True:
        try:
            return await operation()
        except TRANSIENT_BUS_ERRORS as exc:
            attempt += 1
            if time.monotonic() + backoff_s(attempt, 0.2, 2.0) > deadline:
                raise
            log.warning("bus did not acknowledge; retrying", extra={"subject": subject, "attempt": attempt,
                                                                     "error": type(exc).__name__})  # fmt: skip
            await asyncio.sleep(backoff_s(attempt, 0.2, 2.0))


class BusMetrics:
    def __init__(self, service: str, registry: CollectorRegistry) -> None:
        self.published = Counter(
            metric_name(service, "bus_published", "total"),
            "Messages published",
            ["schema"],
            registry=registry,
        )
        self.handled = Counter(
            metric_name(service, "bus_handled", "total"),
            "Messages handled and acked",
            ["durable"],
            registry=registry,
        )
        self.poison = Counter(
            metric_name(service, "bus_poison_messages", "total"),
            "Undecodable messages terminated",
            ["durable"],
            registry=registry,
        )
        self.nacked = Counter(
            metric_name(service, "bus_nacked", "total"),
            "Messages nak'ed after a handler error",
            ["durable"],
            registry=registry,
        )


class LeaveForOthers(Exception):  # noqa: N818 (a decision, not an error)
    """Raised by a work-queue handler that would rather another consumer took this message (it is busy with the
    same job): the message is nak'ed with ``delay_s`` and comes back to whichever consumer asks first."""

    def __init__(self, delay_s: float, why: str) -> None:
        super().__init__(why)
        self.delay_s = delay_s


def backoff_s(num_delivered: int, base: float = 0.5, cap: float = 30.0) -> float:
    return float(min(cap, base * (2 ** max(0, num_delivered - 1))))


@dataclass
class Subscription:
    durable: str
    task: asyncio.Task[None]
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout=10)
            except TimeoutError:
                self.task.cancel()
                await self.task


FAILURE_LOG_EVERY_S = 30.0


class Bus:
    def __init__(self, nc: NatsClient, js: JetStreamContext, metrics: BusMetrics | None) -> None:
        self.nc = nc
        self.js = js
        self._metrics = metrics
        self._subs: list[Subscription] = []
        self._kv: dict[str, KeyValue] = {}
        self.replicas = 1  # copies of each stream and bucket this bus creates
        self._failures_logged: dict[str, tuple[float, int]] = {}  # durable -> (last logged, failures since)

    def _log_failure(self, message: str, durable: str, **extra: object) -> None:
        """A handler's failure, with its traceback, at most once every FAILURE_LOG_EVERY_S per consumer, counting
        the ones left out: a database that is down fails every batch, and the log must not fill the disk."""
        now = time.monotonic()
        last, since = self._failures_logged.get(durable, (-FAILURE_LOG_EVERY_S, 0))
        if now - last < FAILURE_LOG_EVERY_S:
            self._failures_logged[durable] = (last, since + 1)
            return
        self._failures_logged[durable] = (now, 0)
        log.exception(message, extra={"durable": durable, "failures_not_logged": since, **extra})

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        registry: CollectorRegistry | None = None,
        service: str | None = None,
        auth: NatsAuth | None = None,
        replicas: int = 1,
    ) -> AsyncIterator[Bus]:
        """``url``: one server, or several comma-separated (a cluster: the client fails over between them);
        ``replicas``: copies of every stream and KV bucket it creates (3 on a three-server cluster)."""
        nc = await nats.connect(servers=nats_servers(url), name=name, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.5, connect_timeout=5,
                                **(auth or NatsAuth()).connect_options())  # fmt: skip
        metrics = BusMetrics(service or name, registry) if registry is not None else None
        bus = cls(nc, nc.jetstream(), metrics)
        bus.replicas = replicas
        try:
            await bus.ensure_streams()
            yield bus
        finally:
            await bus.close()

    async def _stream_names(self) -> set[str]:
        """The streams that exist (buckets' included), by name only: a user may list names where it may not read
        a stream's info."""
        answer = json.loads((await self.nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=5)).data)
        if "error" in answer:
            raise nats.js.errors.APIError.from_error(answer["error"])
        return set(answer.get("streams") or ())

    async def ensure_streams(self, streams: Sequence[StreamSpec] = STREAMS) -> None:
        """Create the streams and buckets that do not exist yet (with users, only the administrator may: a service
        connecting to a deployment whose streams exist reads nothing here beyond their names)."""
        existing = await self._stream_names()
        for spec in streams:
            if spec.name in existing:
                continue
            config = StreamConfig(
                name=spec.name,
                subjects=list(spec.subjects),
                retention=RetentionPolicy.WORK_QUEUE if spec.retention == "workqueue" else RetentionPolicy.LIMITS,
                max_age=spec.max_age_s,
                duplicate_window=spec.duplicate_window_s,
                storage=StorageType.FILE,
                description=spec.description,
                num_replicas=self.replicas,
            )
            try:
                await self.js.stream_info(spec.name)
            except nats.js.errors.NotFoundError:
                with contextlib.suppress(nats.js.errors.BadRequestError):  # created concurrently elsewhere
                    await self.js.add_stream(config)
        for bucket in BUCKETS:
            if f"KV_{bucket.name}" not in existing:
                await self.kv(bucket.name)

    async def kv(self, bucket: str) -> KeyValue:
        if bucket in self._kv:
            return self._kv[bucket]
        spec = next(b for b in BUCKETS if b.name == bucket)
        try:
            store = await self.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            config = KeyValueConfig(bucket=bucket, ttl=spec.ttl_s, history=1, description=spec.description,
                                    replicas=self.replicas)  # fmt: skip
            store = await self.js.create_key_value(config)
        self._kv[bucket] = store
        return store

    async def kv_keys(self, bucket: str) -> list[str]:
        """The bucket's keys, deleted ones included (a get says which are gone), as its stream's leader counts them.
        Not ``KeyValue.keys()``: that lists through a new consumer whose first count, on a replicated bucket, can
        read zero before the consumer has caught up, and so answer "no keys" for a bucket that has some."""
        return list(await kv_subject_counts(self.js, bucket))

    async def kv_values(self, bucket: str) -> dict[str, bytes]:
        """Every live key's value, each read from the stream's leader (a direct get may be answered by a replica
        that has not caught up); deleted and purged keys left out. The reads go out together, a few dozen in
        flight (a restarted planner reads every run's state this way: one at a time was a round trip a key)."""
        in_flight = asyncio.Semaphore(KV_READS_IN_FLIGHT)

        async def read(key: str) -> bytes | None:
            async with in_flight:
                try:
                    message = await self.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}", direct=False)
                except nats.js.errors.NotFoundError:
                    return None  # expired or removed since the listing
            operation = (message.headers or {}).get("KV-Operation")
            return None if operation in ("DEL", "PURGE") else message.data or b""

        keys = await self.kv_keys(bucket)
        read_values = await asyncio.gather(*(read(key) for key in keys))
        return {key: value for key, value in zip(keys, read_values, strict=True) if value is not None}

    async def kv_mirror(self, bucket: str) -> KvMirror:
        """A started live copy of ``bucket`` (see ``KvMirror``)."""
        return await KvMirror(await self.kv(bucket), bucket, self.js).start()

    async def publish(self, message: Envelope, retry_for_s: float = PUBLISH_RETRY_S) -> None:
        """Publish and wait for JetStream's ack. A bus that does not answer for a moment (a server of the cluster
        died and the client moves to another, a stream elects a new leader) is retried with back-off for up to
        ``retry_for_s``: the message keeps its id, so JetStream stores it once however often it is sent."""
        subject = message.subject()
        body, headers = message.to_bytes(), {"Nats-Msg-Id": message.event_id}
        await _retrying(lambda: self.js.publish(subject, body, headers=headers), subject, retry_for_s)
        if self._metrics:
            self._metrics.published.labels(message.schema_name).inc()

    async def kv_put(self, bucket: str, key: str, value: bytes, retry_for_s: float = PUBLISH_RETRY_S) -> None:
        """Write one key, retried as ``publish`` is while the bus recovers: a put of the same value twice leaves
        the same state, so a put acknowledged but not answered does no harm when it is sent again."""
        kv = await _retrying(lambda: self.kv(bucket), f"$KV.{bucket}", retry_for_s)
        await _retrying(lambda: kv.put(key, value), f"$KV.{bucket}.{key}", retry_for_s)

    def subscribe(
        self,
        models: Sequence[type[Envelope]],
        handler: Handler,
        *,
        durable: str,
        filter_subject: str | None = None,
        stream: str | None = None,
        batch: int = 64,
        ack_wait_s: float = 30.0,
        max_deliver: int = 20,
        deliver_new: bool = False,
        on_poison: PoisonHandler | None = None,
    ) -> Subscription:
        """Handle one message at a time; ack on success, nak with back-off on error. A message that cannot be read
        (not JSON, or not valid for its schema) is terminated; ``on_poison`` gets its bytes and why first, so a
        service can tell the sender (an agent answers a command it cannot read, instead of leaving it unanswered)."""

        async def per_batch(items: list[tuple[Msg, Envelope]]) -> None:
            for msg, event in items:
                try:
                    await handler(event)
                except LeaveForOthers as left:
                    log.info("message left for another consumer", extra={"durable": durable, "why": str(left)})
                    await msg.nak(delay=left.delay_s)
                    continue
                except Exception:
                    delivered = msg.metadata.num_delivered if msg.metadata else 1
                    self._log_failure("handler failed; will retry", durable, schema=event.schema_name)
                    await msg.nak(delay=backoff_s(delivered))
                    if self._metrics:
                        self._metrics.nacked.labels(durable).inc()
                    continue
                await msg.ack()
                if self._metrics:
                    self._metrics.handled.labels(durable).inc()

        return self._start(
            models, per_batch, durable, filter_subject, stream, batch, ack_wait_s, max_deliver, deliver_new, on_poison
        )

    def subscribe_batch(
        self,
        models: Sequence[type[Envelope]],
        handler: BatchHandler,
        *,
        durable: str,
        filter_subject: str | None = None,
        stream: str | None = None,
        batch: int = 500,
        ack_wait_s: float = 60.0,
        max_deliver: int = 50,
    ) -> Subscription:
        """Hand a whole fetched batch to the handler; ack it all after the handler returns."""

        async def whole_batch(items: list[tuple[Msg, Envelope]]) -> None:
            if not items:
                return
            try:
                await handler([event for _, event in items])
            except Exception:
                self._log_failure("batch handler failed; will retry", durable, size=len(items))
                for msg, _ in items:
                    delivered = msg.metadata.num_delivered if msg.metadata else 1
                    await msg.nak(delay=backoff_s(delivered))
                if self._metrics:
                    self._metrics.nacked.labels(durable).inc(len(items))
                return
            # ack_sync: the reporter must know the ack landed before it forgets a batch
            await asyncio.gather(*(msg.ack_sync() for msg, _ in items))
            if self._metrics:
                self._metrics.handled.labels(durable).inc(len(items))

        return self._start(models, whole_batch, durable, filter_subject, stream, batch, ack_wait_s, max_deliver, False)

    def subscribe_raw(
        self,
        handler: Callable[[list[bytes]], Awaitable[list[int]]],
        *,
        durable: str,
        stream: str,
        batch: int = 50,
        ack_wait_s: float = 60.0,
        max_deliver: int = 50,
    ) -> Subscription:
        """Hand the raw bodies of a fetched batch to ``handler``, which decodes them itself (the reporter's hot
        path) and returns the indices of undecodable ones: those are terminated and counted, the rest acked."""

        async def raw_batch(msgs: list[Msg]) -> None:
            if not msgs:
                return
            try:
                poison = set(await handler([m.data for m in msgs]))
            except Exception:
                self._log_failure("raw batch handler failed; will retry", durable, size=len(msgs))
                for msg in msgs:
                    await msg.nak(delay=backoff_s(msg.metadata.num_delivered if msg.metadata else 1))
                if self._metrics:
                    self._metrics.nacked.labels(durable).inc(len(msgs))
                return
            for index in poison:
                self._poison(msgs[index], durable, "rejected by the handler")
                await msgs[index].term()
            # plain acks (no reply awaited): the rows are committed and idempotent, so an ack that gets lost
            # only causes a redelivery that the store skips; waiting for 100 replies would slow the hot path
            for i, m in enumerate(msgs):
                if i not in poison:
                    await m.ack()
            if self._metrics:
                self._metrics.handled.labels(durable).inc(len(msgs) - len(poison))

        return self._start_loop(raw_batch, durable, None, stream, batch, ack_wait_s, max_deliver, False, overlap=True)

    def _decode(self, msg: Msg, by_schema: dict[str, type[Envelope]], durable: str) -> Envelope | Poisoned | None:
        """The event, None for a schema we do not handle, ``Poisoned`` (why) for a message that cannot be read.

        The schema is read from the raw bytes and the model validates the bytes directly (pydantic's JSON
        parser), which is more than twice as fast as json.loads followed by model_validate.
        """
        found = _SCHEMA_FIELD.search(msg.data)
        schema = found.group(1).decode() if found else None
        if schema is None:
            try:
                raw: Any = json.loads(msg.data)
            except ValueError as exc:
                return self._poison(msg, durable, f"not JSON: {exc}")
            schema = raw.get("schema") if isinstance(raw, dict) else None
            if not isinstance(schema, str):
                return self._poison(msg, durable, "no schema field")
        model = by_schema.get(schema)
        if model is None:
            return None
        try:
            event = model.model_validate_json(msg.data)
        except ValidationError as exc:
            return self._poison(msg, durable, str(exc))
        # a message is what its subject says: the subject is what the bus's permissions check (an agent publishes
        # under its own node id only), so a body that names another node, run or deployment speaks for someone else
        try:
            subject = event.subject()
        except ValueError as exc:
            return self._poison(msg, durable, str(exc))
        if subject != msg.subject:
            return self._poison(msg, durable, f"its body belongs on {subject}, not {msg.subject}: refused")
        return event

    def _poison(self, msg: Msg, durable: str, error: str) -> Poisoned:
        log.error("poison message terminated", extra={"durable": durable, "subject": msg.subject, "error": error[:300]})
        if self._metrics:
            self._metrics.poison.labels(durable).inc()
        return Poisoned(error)

    def _start(
        self,
        models: Sequence[type[Envelope]],
        process: Callable[[list[tuple[Msg, Envelope]]], Awaitable[None]],
        durable: str,
        filter_subject: str | None,
        stream: str | None,
        batch: int,
        ack_wait_s: float,
        max_deliver: int,
        deliver_new: bool,
        on_poison: PoisonHandler | None = None,
    ) -> Subscription:
        by_schema = {m.SCHEMA: m for m in models}

        async def decode_then_process(msgs: list[Msg]) -> None:
            decoded: list[tuple[Msg, Envelope]] = []
            for msg in msgs:
                result = self._decode(msg, by_schema, durable)
                if isinstance(result, Poisoned):
                    if on_poison is not None:
                        try:
                            await on_poison(msg.data, result.error)
                        except Exception:  # the message is dropped either way; its sender hears what could be said
                            log.exception("answering a poison message failed", extra={"durable": durable})
                    await msg.term()
                elif result is None:
                    await msg.ack()  # a fact we do not handle: tolerant reader, move on
                else:
                    assert isinstance(result, Envelope)
                    decoded.append((msg, result))
            await process(decoded)

        return self._start_loop(
            decode_then_process, durable, filter_subject, stream, batch, ack_wait_s, max_deliver, deliver_new
        )

    def _start_loop(
        self,
        process: Callable[[list[Msg]], Coroutine[Any, Any, None]],
        durable: str,
        filter_subject: str | None,
        stream: str | None,
        batch: int,
        ack_wait_s: float,
        max_deliver: int,
        deliver_new: bool,
        *,
        overlap: bool = False,
    ) -> Subscription:
        """``stream`` alone consumes the whole stream; ``filter_subject`` alone finds its stream.

        ``overlap`` lets two batches be processed at once (the next one is fetched and started while the
        previous one finishes), for handlers whose work is idempotent and order-free: one batch's decoding
        then runs while the other waits on the database, instead of one after the other."""
        if stream is None:
            if filter_subject is None:
                raise ValueError("subscribe needs a stream or a filter subject")
            # a concrete subject inside the filter tells which stream holds it
            stream = stream_for_subject(filter_subject.replace(">", "x").replace("*", "x")).name
        stop = asyncio.Event()

        async def loop() -> None:
            config = ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ack_wait_s,
                max_deliver=max_deliver,
                deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
                max_ack_pending=max(1000, batch * 4),
            )
            psub = await self.js.pull_subscribe(filter_subject or "", durable=durable, stream=stream, config=config)
            in_flight: asyncio.Task[None] | None = None
            try:
                while not stop.is_set():
                    try:
                        msgs = await psub.fetch(batch, timeout=0.5)
                    except (nats.errors.TimeoutError, TimeoutError):  # an empty poll; nats-py raises either
                        continue
                    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                        await asyncio.sleep(0.5)
                        continue
                    if not overlap:
                        await process(msgs)
                        continue
                    previous, in_flight = in_flight, asyncio.create_task(process(msgs))
                    if previous is not None:
                        await previous
            finally:
                if in_flight is not None:
                    await in_flight
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

        async def guarded() -> None:
            # a consumer must never die silently: log, back off, and start the loop again
            while not stop.is_set():
                try:
                    await loop()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self._log_failure("consumer loop crashed; restarting", durable)
                    await asyncio.sleep(1.0)

        task = asyncio.create_task(guarded(), name=f"sub:{durable}")
        sub = Subscription(durable, task, stop)
        self._subs.append(sub)
        return sub

    async def close(self) -> None:
        for sub in self._subs:
            await sub.close()
        self._subs.clear()
        if self.nc.is_connected:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        with contextlib.suppress(Exception):
            await self.nc.close()
