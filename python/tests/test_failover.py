"""A broker killed (kill -9) and restarted under a publisher; a 3-broker cluster (with etcd)."""

from __future__ import annotations

import shutil
import threading
import time

import felix
import felix.blocking
from conftest import Broker
from helpers import read_n, read_quiet


def test_kill9_and_restart_under_a_publisher(make_broker):
    b = make_broker("crash", cores=2).start()
    stream = "t/py/crash"
    published: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    with felix.blocking.Client.connect(b.addr, ca_file=b.ca_file) as c:
        c.create_stream(stream, shards=2)

        def publisher() -> None:
            i = 0
            try:
                while not stop.is_set():
                    batch = [(f"k{j % 8}".encode(), str(j).encode()) for j in range(i, i + 50)]
                    offsets = c.publish_many(stream, batch)
                    assert offsets is not None and len(offsets) == 50
                    published.extend(range(i, i + 50))
                    i += 50
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        t = threading.Thread(target=publisher)
        t.start()
        time.sleep(1.0)
        before = len(published)
        b.kill9()
        time.sleep(0.5)
        b.start()
        time.sleep(1.5)
        stop.set()
        t.join(timeout=60)
        assert not t.is_alive(), "the publisher is stuck"
        assert not errors, f"the publisher failed: {errors[0]!r}"
        assert before > 0 and len(published) > before, (before, len(published))

    # Read back with a fresh client: every acked record once, in order per key.
    with felix.blocking.Client.connect(b.addr, ca_file=b.ca_file) as c:
        with c.subscribe(stream, start="earliest") as sub:
            got = read_n(sub, len(published), timeout=60)
            got += read_quiet(sub, 1.0)
    values = [int(r.value) for r in got]
    assert len(values) == len(set(values)), "a record was stored twice"
    assert set(values) == set(published), "an acked record is missing"
    last: dict = {}
    for r in got:
        v = int(r.value)
        assert last.get(r.key, -1) < v
        last[r.key] = v


def test_three_broker_cluster(etcd, make_broker):
    nodes: list[Broker] = []
    for i in range(3):
        b = make_broker(f"n{i + 1}", extra=(
            "--cluster-etcd", etcd.client_url, "--node-id", f"n{i + 1}",
            "--lease-ttl-s", "2", "--default-replicas", "1"))
        b.extra += ["--advertise", b.addr]
        if nodes:
            # One development certificate for the three (as a cluster's shared CA would be):
            # the client and the brokers trust it.
            b.dir.mkdir(parents=True, exist_ok=True)
            for f in ("dev-cert.pem", "dev-key.pem"):
                shutil.copy(nodes[0].dir / f, b.dir / f)
        nodes.append(b.start())
    seeds = [n.addr for n in nodes]
    stream = "t/py/cluster"
    deadline = time.monotonic() + 30
    while True:
        try:
            c = felix.blocking.Client.connect(seeds, ca_file=nodes[0].ca_file)
            c.create_stream(stream, shards=6)
            break
        except felix.FelixError:
            assert time.monotonic() < deadline, nodes[0].log_tail()
            time.sleep(0.5)
    with c:
        assert c.is_cluster
        n = 600
        offsets = c.publish_many(stream, [(f"k{i % 12}".encode(), str(i).encode())
                                          for i in range(n)])
        assert offsets is not None and len(offsets) == n
        assert len(c.brokers) >= 2, c.brokers
        with c.subscribe(stream, start="earliest") as sub:
            got = read_n(sub, n)
            assert read_quiet(sub, 0.5) == []
    assert sorted(int(r.value) for r in got) == list(range(n))
    assert len({r.shard for r in got}) > 1
