"""Felix: the Python client of the Felix pub/sub log broker.

asyncio first (this module); ``felix.blocking`` has the same API without ``await``.

    import asyncio, felix

    async def main():
        async with await felix.Client.connect("127.0.0.1:7400", ca_file="felix-data/dev-cert.pem") as c:
            await c.create_stream("acme/app/orders", shards=4)
            offset = await c.publish("acme/app/orders", b"hello", key=b"k1")
            async for r in c.subscribe("acme/app/orders", start="earliest"):
                print(r.shard, r.offset, r.key, r.value)
                break

    asyncio.run(main())

Everything runs in the Rust client (felix-client) underneath, on its own tokio threads: the
GIL is released while an operation waits. See docs/python.md.
"""

from __future__ import annotations

import atexit
from datetime import datetime
from typing import AsyncIterator, Iterable, Optional, Sequence, Union

from . import _felix
from ._errors import (
    CertificateRejected,
    Closed,
    ConfigError,
    ConnectError,
    ConnectionLost,
    FelixError,
    Forbidden,
    FrameTooLarge,
    Internal,
    InvalidArgument,
    InvalidName,
    InvalidShard,
    InvalidStreamName,
    InvalidToken,
    KeyTooLong,
    LimitReached,
    NotOwner,
    OffsetOutOfRange,
    OutcomeUnknown,
    Overloaded,
    ProtocolError,
    RecordTooLarge,
    SequenceError,
    ShardUnavailable,
    ShuttingDown,
    SlowConsumer,
    StorageFailed,
    StorageFull,
    StreamExists,
    StreamNotFound,
    Timeout,
    TokenExpired,
    TooManyRecords,
    Unauthenticated,
    Unauthorized,
    UnknownSubscription,
    Unsupported,
)
from ._felix import Record, StreamInfo

__all__ = [
    "Client",
    "Subscription",
    "Record",
    "StreamInfo",
    "FelixError",
    "CertificateRejected",
    "Closed",
    "ConfigError",
    "ConnectError",
    "ConnectionLost",
    "Forbidden",
    "FrameTooLarge",
    "Internal",
    "InvalidArgument",
    "InvalidName",
    "InvalidShard",
    "InvalidStreamName",
    "InvalidToken",
    "KeyTooLong",
    "LimitReached",
    "NotOwner",
    "OffsetOutOfRange",
    "OutcomeUnknown",
    "Overloaded",
    "ProtocolError",
    "RecordTooLarge",
    "SequenceError",
    "ShardUnavailable",
    "ShuttingDown",
    "SlowConsumer",
    "StorageFailed",
    "StorageFull",
    "StreamExists",
    "StreamNotFound",
    "Timeout",
    "TokenExpired",
    "TooManyRecords",
    "Unauthenticated",
    "Unauthorized",
    "UnknownSubscription",
    "Unsupported",
]

# At exit, let the tokio threads finish handing results to asyncio (see `_at_exit` in
# python/src/lib.rs): a handover cut by the interpreter's finalization aborts the process.
atexit.register(_felix._at_exit)

#: A record's key or value: ``bytes`` (``bytearray`` and ``str``, as UTF-8, are taken too).
Data = Union[bytes, bytearray, str]
#: Where a subscription starts: "earliest", "latest", an offset, or a datetime.
Start = Union[str, int, datetime]
#: How many records a subscription takes from the Rust client per wait.
BATCH_MAX = 1024


class Subscription:
    """A subscription: an async iterator of :class:`Record`.

    ``async for r in client.subscribe(...)`` opens it on first use; ``await
    client.subscribe(...)`` or ``async with client.subscribe(...) as sub`` opens it at once
    (and the ``async with`` form closes it at the end). Records of a shard come in offset
    order; a lost connection is resumed by the Rust client without loss or duplicates.
    """

    def __init__(self, client: "Client", stream: str, start: Start, group: Optional[str],
                 shards: Optional[Sequence[int]]) -> None:
        self._client = client
        self._args = (stream, start, group, None if shards is None else list(shards))
        self._native: Optional[_felix.NativeSubscription] = None
        self._buf: list = []
        self._i = 0
        self._ended = False

    async def _open(self) -> "Subscription":
        if self._native is None:
            stream, start, group, shards = self._args
            self._native = await self._client._native.subscribe(stream, start, group, shards)
        return self

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> "Subscription":
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self

    async def __anext__(self) -> Record:
        if self._i < len(self._buf):
            r = self._buf[self._i]
            self._i += 1
            return r
        if self._ended:
            raise StopAsyncIteration
        if self._native is None:
            await self._open()
        assert self._native is not None
        batch = await self._native.next_batch(BATCH_MAX)
        if not batch:
            self._ended = True
            raise StopAsyncIteration
        self._buf = batch
        self._i = 1
        return batch[0]

    async def next_batch(self, max: int = BATCH_MAX) -> list:
        """The records already received (waiting for the first), at most ``max``, skipping
        the one-by-one iteration; an empty list once the subscription has ended."""
        if self._i < len(self._buf):
            out = self._buf[self._i:self._i + max]
            self._i += len(out)
            return out
        if self._native is None:
            await self._open()
        assert self._native is not None
        return await self._native.next_batch(max)

    async def commit(self, shard: Optional[int] = None, offset: Optional[int] = None) -> None:
        """Commits the group's position: without arguments, for every shard, the offset after
        the last record this subscription returned; with ``shard`` and ``offset``, that
        ``offset`` (the next one to read) for that shard. Needs ``group=``."""
        if self._native is None:
            await self._open()
        assert self._native is not None
        await self._native.commit(shard, offset)

    async def close(self) -> None:
        """Ends the subscription."""
        if self._native is not None:
            await self._native.close()
        self._ended = True
        self._buf, self._i = [], 0


class Client:
    """A connected client (asyncio). Make one with ``await Client.connect(...)``; use it as
    an async context manager to close it (publishers flushed) at the end."""

    def __init__(self, native: _felix.NativeClient) -> None:
        self._native = native

    @classmethod
    async def connect(
        cls,
        addrs: Union[str, Sequence[str]] = "127.0.0.1:7400",
        *,
        ca_file: Optional[str] = None,
        fingerprint: Optional[str] = None,
        insecure: bool = False,
        token: Optional[str] = None,
        server_name: Optional[str] = None,
        connect_timeout_ms: Optional[int] = None,
        connections: Optional[int] = None,
    ) -> "Client":
        """Connects to the first broker of ``addrs`` that answers (``"host:port"``, a
        comma-separated list of cluster seeds, or a list of them).

        Trust the broker with ``ca_file`` (its CA or dev certificate, PEM), ``fingerprint``
        (SHA-256 of its certificate, hex) or, for tests only, ``insecure=True``. ``token`` is
        the bearer token. Settings not given come from the ``FELIX_*`` environment variables
        (docs/client.md), else the Rust client's defaults."""
        native = await _felix.NativeClient.connect(
            addrs, ca_file, fingerprint, insecure, token, server_name, connect_timeout_ms,
            connections)
        return cls(native)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def brokers(self) -> list:
        """The brokers the client holds connections to (``host:port``)."""
        return self._native.brokers()

    @property
    def is_cluster(self) -> bool:
        """Whether the broker is part of a cluster."""
        return self._native.is_cluster()

    async def publish(self, stream: str, value: Data, key: Optional[Data] = None,
                      ack: str = "durable") -> Optional[int]:
        """Publishes one record and waits for its ack: the record's offset in its shard
        (``None`` with ``ack="none"``). ``ack``: ``"durable"`` (fsynced), ``"written"``, or
        ``"none"``. Records of one key go to one shard, in order."""
        return await self._native.publish(stream, value, key, ack)

    async def publish_many(self, stream: str, records: Iterable[Union[Data, tuple]],
                           key: Optional[Data] = None,
                           ack: str = "durable") -> Optional[list]:
        """Publishes a batch: each item a value, or a ``(key, value)`` tuple (``key`` applies
        to items without one). Waits for every ack; returns each record's offset, in order
        (``None`` with ``ack="none"``). Raises the first error if any record failed."""
        return await self._native.publish_many(stream, records, key, ack)

    async def flush(self) -> None:
        """Waits until every record published so far is acked (or written)."""
        await self._native.flush()

    def subscribe(self, stream: str, start: Start = "latest", group: Optional[str] = None,
                  shards: Optional[Sequence[int]] = None) -> Subscription:
        """A subscription to ``stream`` (see :class:`Subscription`): from ``start``
        ("earliest", "latest", an offset of every shard read, or a datetime: the first
        record stored at or after it). With ``group``, each shard resumes from the group's
        committed position where it has one. ``shards`` limits it to those shards."""
        return Subscription(self, stream, start, group, shards)

    async def create_stream(self, name: str, shards: int = 1, replicas: Optional[int] = None,
                            retention_bytes: Optional[int] = None,
                            retention_ms: Optional[int] = None) -> StreamInfo:
        """Creates ``name`` (``tenant/namespace/stream``); answers the existing settings if it
        exists alike (``StreamExists`` if otherwise)."""
        return await self._native.create_stream(name, shards, replicas, retention_bytes,
                                                retention_ms)

    async def describe_stream(self, name: str) -> StreamInfo:
        """The settings of ``name``."""
        return await self._native.describe_stream(name)

    async def list_streams(self, prefix: str = "") -> list:
        """The names of the streams starting with ``prefix``."""
        return await self._native.list_streams(prefix)

    async def close(self) -> None:
        """Flushes the publishers, then closes every connection."""
        await self._native.close()
