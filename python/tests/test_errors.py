"""Every broker or client error reaches Python as its typed exception, with code and message."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

import felix
import felix.blocking


def test_broker_errors_are_typed(broker):
    with felix.blocking.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
        with pytest.raises(felix.StreamNotFound) as e:
            c.describe_stream("t/py/missing")
        assert e.value.code == "StreamNotFound" and e.value.message
        assert isinstance(e.value, felix.FelixError)
        c.create_stream("t/py/exists", shards=1)
        with pytest.raises(felix.StreamExists) as e:
            c.create_stream("t/py/exists", shards=3)
        assert e.value.code == "StreamExists"
        with pytest.raises(felix.InvalidName):
            c.create_stream("no-slashes")
        with pytest.raises(felix.InvalidArgument):
            c.create_stream("no-slashes")
        with pytest.raises(felix.InvalidShard):
            with c.subscribe("t/py/exists", start="earliest", shards=[7]) as sub:
                sub.poll(timeout=5)
        with pytest.raises(felix.Unsupported):
            c.create_stream("t/py/replicated", replicas=3)
        with pytest.raises(ValueError):
            c.publish("t/py/exists", b"x", ack="sometimes")
        with pytest.raises(TypeError):
            c.publish("t/py/exists", 42)
        with pytest.raises(felix.InvalidArgument) as e:
            c.subscribe("t/py/exists", start="earliest").commit(0, 1)
        assert "group" in e.value.message

    async def main():
        async with await felix.Client.connect(broker.addr, ca_file=broker.ca_file) as c:
            with pytest.raises(felix.StreamNotFound):
                await c.describe_stream("t/py/missing")

    asyncio.run(main())


def test_closed_client(broker):
    c = felix.blocking.Client.connect(broker.addr, ca_file=broker.ca_file)
    c.close()
    with pytest.raises(felix.FelixError) as e:
        c.list_streams()
    assert isinstance(e.value, (felix.Closed, felix.ConnectionLost)), e.value


def test_connect_errors(broker, tmp_path):
    with pytest.raises(felix.CertificateRejected) as e:
        felix.blocking.Client.connect(broker.addr, fingerprint="00" * 32)
    assert isinstance(e.value, felix.ConnectError)
    with pytest.raises(felix.ConfigError):
        felix.blocking.Client.connect(broker.addr, fingerprint="not hex")
    with pytest.raises(felix.ConfigError):
        felix.blocking.Client.connect(broker.addr, ca_file=str(tmp_path / "none.pem"))
    # Nothing listens there.
    from conftest import free_port
    import socket
    dead = f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
    with pytest.raises((felix.ConnectError, felix.Timeout)):
        felix.blocking.Client.connect(dead, ca_file=broker.ca_file, connect_timeout_ms=1000)


def test_storage_full(make_broker):
    # A free-space floor larger than any disk: every publish is refused.
    b = make_broker("full", extra=("--min-free-bytes", str(1 << 60))).start()
    with felix.blocking.Client.connect(b.addr, ca_file=b.ca_file) as c:
        with pytest.raises(felix.StorageFull) as e:
            c.create_stream("t/py/full", shards=1)
        assert e.value.code == "StorageFull"
        with pytest.raises(felix.StorageFull) as e:
            c.publish("t/py/full", b"x")  # auto-created on first publish: refused too
        assert "free-space floor" in e.value.message


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_unauthorized(make_broker, tmp_path):
    key = tmp_path / "k.pem"
    pub = tmp_path / "k.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True)
    b = make_broker("auth", extra=("--auth-keys", str(pub))).start()
    with pytest.raises(felix.Unauthorized) as e:
        felix.blocking.Client.connect(b.addr, ca_file=b.ca_file)
    assert e.value.code == "Unauthenticated"
    with pytest.raises(felix.Unauthorized) as e:
        felix.blocking.Client.connect(b.addr, ca_file=b.ca_file, token="not-a-token")
    assert e.value.code == "InvalidToken"
