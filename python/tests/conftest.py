"""Fixtures: real `felix serve` brokers (and an etcd for the cluster test) on loopback.

The broker binary is $FELIX_BIN, else target/debug/felix of the repository (python/run-tests.sh
builds it). Each broker gets free ports, its own data directory (its development certificate
is generated there) and its stderr in <data dir>.log, printed when a test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FELIX_BIN = os.environ.get("FELIX_BIN") or str(REPO / "target" / "debug" / "felix")
START_TIMEOUT_S = 30.0


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("FELIX_") or k == "FELIX_LOG"}


class Broker:
    """One `felix serve` process; `kill9()` and `start()` again keep its port and data."""

    def __init__(self, root: Path, name: str = "b", cores: int = 1, extra: tuple = (),
                 port: int | None = None) -> None:
        self.dir = root / name
        self.port = port or free_port(socket.SOCK_DGRAM)
        self.metrics_port = free_port(socket.SOCK_STREAM)
        self.cores = cores
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> str:
        return str(self.dir / "dev-cert.pem")

    @property
    def log_path(self) -> Path:
        return self.dir.with_suffix(".log")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def start(self, wait: bool = True) -> "Broker":
        args = [FELIX_BIN, "serve", "--listen", self.addr, "--cores", str(self.cores),
                "--no-pin", "--data-dir", str(self.dir),
                "--metrics", f"127.0.0.1:{self.metrics_port}", *self.extra]
        if "--min-free-bytes" not in self.extra:
            args += ["--min-free-bytes", "0"]
        self._served = self._serving_lines()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log,
                                     env=clean_env())
        log.close()
        if wait:
            self.wait_ready()
        return self

    def _serving_lines(self) -> int:
        try:
            return self.log_path.read_text(errors="replace").count("felix: serving on")
        except OSError:
            return 0

    def wait_ready(self) -> None:
        """Until this start's "serving on" line is in the log."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"felix exited ({self.proc.returncode}):\n{self.log_tail()}")
            if self._serving_lines() > self._served and os.path.exists(self.ca_file):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"felix did not become healthy:\n{self.log_tail()}")
            time.sleep(0.05)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session", autouse=True)
def _felix_binary() -> None:
    if not os.access(FELIX_BIN, os.X_OK):
        pytest.exit(f"{FELIX_BIN} is missing: build it with "
                    "`cargo build -p felix-broker --bin felix` (python/run-tests.sh does)", 2)


@pytest.fixture
def make_broker(tmp_path):
    """A factory of brokers, all stopped at the end of the test."""
    started: list[Broker] = []

    def make(name: str = "b", **kw) -> Broker:
        b = Broker(tmp_path, name, **kw)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(make_broker) -> Broker:
    """One broker with two cores, started."""
    return make_broker("b", cores=2).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        for name in ("broker", "make_broker"):
            b = item.funcargs.get(name)
            if isinstance(b, Broker):
                rep.sections.append((f"felix log ({b.addr})", b.log_tail(60)))


class Etcd:
    """An etcd of the test's own (Debian's etcd-server), on free ports."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "etcd"
        client, peer = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
        self.client_url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.log_path = root / "etcd.log"
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "t", "--data-dir", str(self.dir),
             "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"t={peer_url}"],
            stdout=subprocess.DEVNULL, stderr=log)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(self.client_url + "/health", timeout=1) as r:
                    if b"true" in r.read():
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("etcd did not start:\n" + self.log_path.read_text()[-2000:])
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def etcd(tmp_path):
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server): no cluster test")
    e = Etcd(tmp_path)
    yield e
    e.stop()
