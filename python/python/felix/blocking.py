"""The blocking twin of :mod:`felix`: the same API without ``await``.

Each call blocks the calling thread with the GIL released (other Python threads run), on the
Rust client's own threads; several threads may share one client.

    from felix.blocking import Client

    with Client.connect("127.0.0.1:7400", ca_file="felix-data/dev-cert.pem") as c:
        c.publish("acme/app/orders", b"hello", key=b"k1")
        for r in c.subscribe("acme/app/orders", start="earliest"):
            print(r.offset, r.value)
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional, Sequence, Union

from . import BATCH_MAX, Data, Start, _felix
from ._felix import Record, StreamInfo

__all__ = ["Client", "Subscription", "Record", "StreamInfo"]


class Subscription:
    """A subscription: an iterator of :class:`Record` (opened by ``Client.subscribe``);
    a context manager that closes it at the end."""

    def __init__(self, native: _felix.NativeSubscription) -> None:
        self._native = native
        self._buf: list = []
        self._i = 0
        self._ended = False

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Record]:
        return self

    def __next__(self) -> Record:
        if self._i < len(self._buf):
            r = self._buf[self._i]
            self._i += 1
            return r
        if self._ended:
            raise StopIteration
        batch = self._native.next_batch_blocking(BATCH_MAX)
        if not batch:
            self._ended = True
            raise StopIteration
        self._buf = batch
        self._i = 1
        return batch[0]

    def poll(self, timeout: Optional[float] = None, max: int = BATCH_MAX) -> list:
        """The records already received, at most ``max``, waiting at most ``timeout`` seconds
        for the first (None: no limit). An empty list after a timeout, or at the end."""
        if self._i < len(self._buf):
            out = self._buf[self._i:self._i + max]
            self._i += len(out)
            return out
        return self._native.next_batch_blocking(max, timeout)

    def commit(self, shard: Optional[int] = None, offset: Optional[int] = None) -> None:
        """See :meth:`felix.Subscription.commit`."""
        self._native.commit_blocking(shard, offset)

    def positions(self) -> dict:
        """Per shard, the offset of the next record to be returned."""
        return self._native.positions_blocking()

    def close(self) -> None:
        """Ends the subscription."""
        self._native.close_blocking()
        self._ended = True
        self._buf, self._i = [], 0


class Client:
    """A connected client, blocking. See :class:`felix.Client` for each method."""

    def __init__(self, native: _felix.NativeClient) -> None:
        self._native = native

    @classmethod
    def connect(
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
        """See :meth:`felix.Client.connect`."""
        return cls(_felix.NativeClient.connect_blocking(
            addrs, ca_file, fingerprint, insecure, token, server_name, connect_timeout_ms,
            connections))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def brokers(self) -> list:
        return self._native.brokers()

    @property
    def is_cluster(self) -> bool:
        return self._native.is_cluster()

    def publish(self, stream: str, value: Data, key: Optional[Data] = None,
                ack: str = "durable") -> Optional[int]:
        """See :meth:`felix.Client.publish`."""
        return self._native.publish_blocking(stream, value, key, ack)

    def publish_many(self, stream: str, records: Iterable[Union[Data, tuple]],
                     key: Optional[Data] = None, ack: str = "durable") -> Optional[list]:
        """See :meth:`felix.Client.publish_many`."""
        return self._native.publish_many_blocking(stream, records, key, ack)

    def flush(self) -> None:
        self._native.flush_blocking()

    def subscribe(self, stream: str, start: Start = "latest", group: Optional[str] = None,
                  shards: Optional[Sequence[int]] = None) -> Subscription:
        """Opens a subscription (see :meth:`felix.Client.subscribe`)."""
        return Subscription(self._native.subscribe_blocking(
            stream, start, group, None if shards is None else list(shards)))

    def create_stream(self, name: str, shards: int = 1, replicas: Optional[int] = None,
                      retention_bytes: Optional[int] = None,
                      retention_ms: Optional[int] = None) -> StreamInfo:
        return self._native.create_stream_blocking(name, shards, replicas, retention_bytes,
                                                   retention_ms)

    def describe_stream(self, name: str) -> StreamInfo:
        return self._native.describe_stream_blocking(name)

    def list_streams(self, prefix: str = "") -> list:
        return self._native.list_streams_blocking(prefix)

    def close(self) -> None:
        """Flushes the publishers, then closes every connection."""
        self._native.close_blocking()
