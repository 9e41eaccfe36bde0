#!/usr/bin/env python3
"""Writes the `session` target's seeds (seeds/session/) from proto/tests/vectors/*.hex.

The first byte of an input is the target's mode (fuzz_targets/session.rs): 0x00 writes the
frame as it is on the `open` broker's shared connection, 0x01 on the `auth` broker's, 0x31 on
a fresh connection to the `auth` broker after a valid Hello, 0x38 on a fresh connection to the
`open` broker without Hello, 0x02 as the target's frame list (type, flags, length, body), 0x04
resets the stream instead of finishing. Fresh connections are few: a handshake costs as much as
a few inputs on a shared connection.
Run from anywhere: python3 broker/fuzz/make-seeds.py

`--leak-repro FILE` writes instead the input that showed a subscription leak (README, "Found"):
on a fresh connection, 400 Publishes of one 4,000-byte record to a/b/leak, then a Subscribe from
earliest; the connection closes while the subscription's queue is full.
"""
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent
VECTORS = HERE.parent.parent / "proto" / "tests" / "vectors"
OUT = HERE / "seeds" / "session"

# Frames a client sends, in an order that makes a stream before using it.
REQUESTS = ["create_stream", "describe_stream", "list_streams", "publish", "publish_acked_keyed",
            "publish_keyed_empty_key", "subscribe", "commit_offset", "ping", "pong"]


def frame_list(frame: bytes) -> bytes:
    """One frame in the target's frame-list form: type, low flag byte, length, body."""
    body = frame[10:]
    length = bytes([len(body)]) if len(body) < 255 else b"\xff" + len(body).to_bytes(2, "big")
    return bytes([frame[3], frame[5]]) + length + body


def renamed(frame: bytes, name: bytes) -> bytes:
    """A request frame whose body is `request id u64, name u16 + bytes, ...` with another name."""
    body = frame[10:]
    old_len = int.from_bytes(body[8:10], "big")
    body = body[:8] + len(name).to_bytes(2, "big") + name + body[10 + old_len:]
    return frame[:6] + len(body).to_bytes(4, "big") + body


def leak_repro() -> bytes:
    """Mode 0x30 (fresh connection, Hello first), publishes, then Subscribe from earliest."""
    def frame(ty: int, body: bytes) -> bytes:
        return b"FX\x01" + bytes([ty]) + struct.pack(">HI", 0, len(body)) + body

    name = struct.pack(">H", 8) + b"a/b/leak"
    out = b"\x30"
    for i in range(400):
        out += frame(0x10, name + struct.pack(">II", 1, 4000) + bytes([i % 256]) * 4000)
    # request id 1, every shard, start earliest, no group
    return out + frame(0x20, struct.pack(">Q", 1) + name + b"\x00\x00\x00")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--leak-repro":
        pathlib.Path(sys.argv[2]).write_bytes(leak_repro())
        return
    vectors = {p.stem: bytes.fromhex("".join(c for c in p.read_text() if c in "0123456789abcdefABCDEF"))
               for p in sorted(VECTORS.glob("*.hex"))}
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    seeds = {}
    # The vectors create acme/app/orders but use a/b/c, which the `auth` broker (no auto-create;
    # the token reaches a/b*/*) needs created first.
    vectors["create_stream_abc"] = renamed(vectors["create_stream"], b"a/b/c")
    for name, frame in vectors.items():
        seeds[f"raw-{name}"] = b"\x00" + frame
        seeds[f"auth-{name}"] = b"\x01" + frame
        if not name.startswith("reject_"):
            seeds[f"frames-{name}"] = b"\x02" + frame_list(frame)
    for name in ["hello", "ping", "publish", "create_stream"]:
        seeds[f"bare-{name}"] = b"\x38" + vectors[name]
    requests = b"".join(vectors[n] for n in ["create_stream_abc"] + REQUESTS if n in vectors)
    seeds["raw-all-requests"] = b"\x00" + requests
    seeds["auth-all-requests"] = b"\x01" + requests
    seeds["auth-fresh-all-requests"] = b"\x31" + requests
    seeds["reset-all-requests"] = b"\x04" + requests
    seeds["bare-hello-then-requests"] = b"\x38" + vectors["hello"] + requests
    seeds["frames-all-requests"] = b"\x02" + b"".join(
        frame_list(vectors[n]) for n in ["create_stream_abc"] + REQUESTS if n in vectors)
    for name, data in seeds.items():
        (OUT / name).write_bytes(data)
    print(f"{len(seeds)} seeds in {OUT}")


if __name__ == "__main__":
    main()
