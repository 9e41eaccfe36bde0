"""Publishing and reading back, every start position, groups and commits."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import felix
import felix.blocking
from helpers import read_n, read_quiet


def test_async_publish_returns_offsets_and_reads_back(broker):
    async def main():
        async with await felix.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
            info = await c.create_stream("t/py/one", shards=1)
            assert (info.name, info.shards) == ("t/py/one", 1)
            offsets = [await c.publish("t/py/one", f"v{i}".encode(), key=b"k") for i in range(5)]
            assert offsets == [0, 1, 2, 3, 4]
            assert await c.publish("t/py/one", b"w", ack="written") == 5
            assert await c.publish("t/py/one", b"n", ack="none") is None
            await c.flush()
            # Unkeyed records keep their order; a keyed one goes into its key's batch.
            assert await c.publish_many("t/py/one", [b"a", bytearray(b"b"), "c"]) == [7, 8, 9]
            assert await c.publish_many("t/py/one", [(b"k2", b"d")]) == [10]
            got = []
            async with c.subscribe("t/py/one", start="earliest") as sub:
                async for r in sub:
                    got.append(r)
                    if len(got) == 11:
                        break
            assert [r.offset for r in got] == list(range(11))
            assert [r.value for r in got[:5]] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
            assert got[0].key == b"k" and got[7].key is None and got[10].key == b"k2"
            assert [r.value for r in got[7:]] == [b"a", b"b", b"c", b"d"]
            r = got[0]
            assert r.stream == "t/py/one" and r.shard == 0 and isinstance(r.value, bytes)
            assert abs(r.timestamp.timestamp() * 1000 - r.timestamp_ms) < 1
            assert r.timestamp.tzinfo is not None
            assert "t/py/one" in await c.list_streams("t/py/")
            assert (await c.describe_stream("t/py/one")).shards == 1

    asyncio.run(main())


def test_ten_thousand_keyed_records_back_once_and_in_order_per_key(broker):
    stream, keys, n = "t/py/many", 37, 10_000
    with felix.blocking.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
        c.create_stream(stream, shards=4)
        sent = 0
        while sent < n:
            batch = [(f"k{i % keys}".encode(), f"{i % keys}:{i}".encode())
                     for i in range(sent, min(sent + 1000, n))]
            offsets = c.publish_many(stream, batch)
            assert offsets is not None and len(offsets) == len(batch)
            sent += len(batch)
        with c.subscribe(stream, start="earliest") as sub:
            got = read_n(sub, n)
            assert read_quiet(sub, 0.5) == []
    seen = set()
    last = {}
    per_shard_last = {}
    for r in got:
        k, i = r.value.decode().split(":")
        assert r.key == f"k{k}".encode()
        i = int(i)
        assert i not in seen, f"record {i} twice"
        seen.add(i)
        assert last.get(k, -1) < i, f"key {k}: {i} after {last.get(k)}"
        last[k] = i
        assert per_shard_last.get(r.shard, -1) < r.offset
        per_shard_last[r.shard] = r.offset
    assert seen == set(range(n))
    # One key, one shard.
    shards_of_key = {}
    for r in got:
        shards_of_key.setdefault(r.key, set()).add(r.shard)
    assert all(len(s) == 1 for s in shards_of_key.values())


def test_every_start_position(broker):
    stream = "t/py/starts"
    with felix.blocking.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
        c.create_stream(stream, shards=1)
        c.publish_many(stream, [f"a{i}".encode() for i in range(5)])
        time.sleep(0.05)
        middle = datetime.now(timezone.utc)
        time.sleep(0.05)
        c.publish_many(stream, [f"b{i}".encode() for i in range(5)])

        with c.subscribe(stream, start="earliest") as sub:
            assert [r.offset for r in read_n(sub, 10)] == list(range(10))
        with c.subscribe(stream, start=7) as sub:
            assert [r.offset for r in read_n(sub, 3)] == [7, 8, 9]
        with c.subscribe(stream, start=middle) as sub:
            got = read_n(sub, 5)
            assert [r.value for r in got] == [f"b{i}".encode() for i in range(5)]
        with c.subscribe(stream, start="latest") as sub:
            assert sub.poll(timeout=0.3) == []
            assert c.publish(stream, b"after") == 10
            (r,) = read_n(sub, 1)
            assert (r.offset, r.value) == (10, b"after")
        with c.subscribe(stream) as sub:  # the default: latest
            assert sub.poll(timeout=0.2) == []

    async def main():
        async with await felix.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
            got = []
            async for r in c.subscribe(stream, start=middle):
                got.append(r.offset)
                if len(got) == 6:
                    break
            assert got == [5, 6, 7, 8, 9, 10]

    asyncio.run(main())


def test_groups_resume_from_commits(broker):
    stream = "t/py/groups"
    with felix.blocking.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
        c.create_stream(stream, shards=2)
        c.publish_many(stream, [(f"k{i % 4}".encode(), f"{i}".encode()) for i in range(40)])
        with c.subscribe(stream, start="earliest", group="g1") as sub:
            first = read_n(sub, 15)
            sub.commit()
        with c.subscribe(stream, start="earliest", group="g1") as sub:
            rest = read_n(sub, 25)
            assert read_quiet(sub, 0.5) == []
        values = sorted(int(r.value) for r in first + rest)
        assert values == list(range(40)), "each record once across the two subscriptions"

        # An explicit commit of one shard's position.
        with c.subscribe(stream, start="earliest", group="g2", shards=[0]) as sub:
            read_n(sub, 1)
            sub.commit(0, 3)
        with c.subscribe(stream, start="earliest", group="g2", shards=[0]) as sub:
            (r,) = read_n(sub, 1)
            assert (r.shard, r.offset) == (0, 3)

    async def main():
        async with await felix.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
            sub = await c.subscribe(stream, start="earliest", group="g3")
            n = 0
            async for _ in sub:
                n += 1
                if n == 40:
                    break
            await sub.commit()
            await sub.close()
            sub = await c.subscribe(stream, start="earliest", group="g3")
            await c.publish(stream, b"40", key=b"k0")
            r = await sub.__anext__()
            assert r.value == b"40"
            await sub.close()

    asyncio.run(main())
