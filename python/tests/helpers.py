"""Helpers shared by the tests."""

from __future__ import annotations

import time

from felix.blocking import Subscription


def read_n(sub: Subscription, n: int, timeout: float = 30.0) -> list:
    """Exactly the next `n` records of `sub` (fails after `timeout` seconds without them)."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(out)} of {n} records within {timeout} s"
        out.extend(sub.poll(timeout=min(left, 1.0), max=n - len(out)))
    return out


def read_quiet(sub: Subscription, quiet: float = 1.0) -> list:
    """Every record until none came for `quiet` seconds."""
    out: list = []
    while True:
        got = sub.poll(timeout=quiet)
        if not got:
            return out
        out.extend(got)
