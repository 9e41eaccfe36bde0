#!/usr/bin/env bash
# The Python client (python/, docs/python.md) against the Rust load generator, side by side on
# the same broker: records/s and MB/s of `publish_many` (asyncio, ack durable) and of a
# subscription read from Python (`async for r in sub`, each record's value a Python bytes),
# and of felix-loadgen's publish and subscribe workloads with the same client settings, for
# 4 KiB and 100-byte records. The broker is pinned to one CPU, the generator (loadgen, or the
# Python process with the Rust client's runtime threads) to another, with taskset.
#
# Each run starts a fresh broker and measures, per record size: Rust publish and Python publish
# (into streams of their own, the order alternating between runs), then fills a backlog stream
# (loadgen, ack written) that Rust and Python each read from the earliest record. Every figure is
# over a measured window after a warm-up; the ratio Python/Rust is taken within each run, then
# the median and spread (min-max) over the runs.
#
#   bench/python.sh                  # RUNS=3, results in bench/results/<today>-python/
#   RUNS=5 DURATION=10 bench/python.sh
#
# Env: RUNS (3), WARMUP (1 s), DURATION (5 s), SIZES ("4096 100"), BROKER_CPU (0), GEN_CPU (1),
# SHARDS (4), FILL_S (seconds of backlog fill, 10; FILL_S_SMALL for records under 1 KiB, 30:
# the backlog must outlast both readers' warm-up and window), OUT (results directory).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=${RUNS:-3}
WARMUP=${WARMUP:-1}
DURATION=${DURATION:-5}
SIZES=${SIZES:-"4096 100"}
BROKER_CPU=${BROKER_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
SHARDS=${SHARDS:-4}
FILL_S=${FILL_S:-10}
FILL_S_SMALL=${FILL_S_SMALL:-30}
DATE=$(date -u +%Y-%m-%d)
OUT=${OUT:-$ROOT/bench/results/$DATE-python}
T=$ROOT/target/release
VENV=$ROOT/target/pybench
WORK=$(mktemp -d /tmp/felix-pybench.XXXXXX)
PORT=${PORT:-7460}
MPORT=${MPORT:-9460}
mkdir -p "$OUT/raw"

echo "== build: felix, felix-loadgen (release); pip install ./python (release) into $VENV"
cargo build -q --release -p felix-broker -p felix-loadgen --bin felix --bin felix-loadgen
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
MATURIN_PEP517_ARGS="" "$VENV/bin/pip" install -q --force-reinstall --no-deps ./python

broker_pid=
start_broker() {
  rm -rf "$WORK/data"
  taskset -c "$BROKER_CPU" "$T/felix" serve --listen 127.0.0.1:$PORT --cores 1 \
    --cpus "$BROKER_CPU" --data-dir "$WORK/data" --metrics 127.0.0.1:$MPORT \
    --min-free-bytes 0 > /dev/null 2> "$WORK/broker.log" &
  broker_pid=$!
  for _ in $(seq 1 200); do
    grep -q "felix: serving on" "$WORK/broker.log" 2> /dev/null && return 0
    sleep 0.05
  done
  echo "broker did not start:"; tail -20 "$WORK/broker.log"; exit 1
}
stop_broker() {
  kill "$broker_pid" 2> /dev/null || true
  wait "$broker_pid" 2> /dev/null || true
}
trap 'stop_broker; rm -rf "$WORK"' EXIT

# loadgen <json> <args...>: felix-loadgen on the generator CPU.
loadgen() {
  local json=$1
  shift
  taskset -c "$GEN_CPU" "$T/felix-loadgen" run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT \
    --ca-file "$WORK/data/dev-cert.pem" --broker-pid "$broker_pid" --workers 1 --cpus "$GEN_CPU" \
    --keys 0 --batch-records 1024 --quiet --json "$json" "$@" > "${json%.json}.txt" 2>&1 ||
    { echo "loadgen failed:"; tail -20 "${json%.json}.txt"; exit 1; }
}

# pybench <json> <publish|subscribe> <stream> <payload bytes>: the Python side.
pybench() {
  PYTHONFAULTHANDLER=1 taskset -c "$GEN_CPU" "$VENV/bin/python" - "$@" 127.0.0.1:$PORT "$WORK/data/dev-cert.pem" \
    "$WARMUP" "$DURATION" "$SHARDS" <<'PY'
import asyncio, json, sys, time
import felix

out, mode, stream, size, addr, ca, warmup, duration, shards = sys.argv[1:]
size, warmup, duration, shards = int(size), float(warmup), float(duration), int(shards)
# Records per publish_many call and calls in flight: 4 x 256 = 1024 records outstanding, as
# loadgen's default --outstanding.
BATCH, TASKS = 256, 4


async def publish(c):
    await c.create_stream(stream, shards=shards)
    batch = [b"x" * size] * BATCH
    state = {"n": 0, "stop": False}

    async def task():
        while not state["stop"]:
            offsets = await c.publish_many(stream, batch)
            state["n"] += len(offsets)

    tasks = [asyncio.create_task(task()) for _ in range(TASKS)]
    await asyncio.sleep(warmup)
    n0, t0, c0 = state["n"], time.monotonic(), time.process_time()
    await asyncio.sleep(duration)
    n1, t1, c1 = state["n"], time.monotonic(), time.process_time()
    state["stop"] = True
    await asyncio.gather(*tasks)
    return n1 - n0, (n1 - n0) * size, t1 - t0, c1 - c0, False


async def subscribe(c):
    n = nbytes = 0
    t_start = time.monotonic()
    begin, end = t_start + warmup, t_start + warmup + duration
    snap = None
    last = (0, 0, t_start, 0.0)
    sub = await c.subscribe(stream, start="earliest")

    async def read():
        nonlocal n, nbytes, snap, last
        async for r in sub:
            n += 1
            nbytes += len(r.value)
            if n & 255 == 0:
                now = time.monotonic()
                last = (n, nbytes, now, time.process_time())
                if snap is None and now >= begin:
                    snap = last
                elif now >= end:
                    return

    drained = False
    try:
        await asyncio.wait_for(read(), warmup + duration + 2)
    except asyncio.TimeoutError:
        drained = True  # the backlog ended first: count up to the last record read
    await sub.close()
    if snap is None:
        return 0, 0, 0.0, 0.0, True
    return last[0] - snap[0], last[1] - snap[1], last[2] - snap[2], last[3] - snap[3], drained


async def main():
    async with await felix.Client.connect(addr, ca_file=ca) as c:
        records, nbytes, secs, cpu, drained = await (publish(c) if mode == "publish" else subscribe(c))
    json.dump({"mode": mode, "payload_bytes": size, "records": records, "bytes": nbytes,
               "measured_s": secs, "cpu_s": cpu, "drained": drained}, open(out, "w"))

asyncio.run(main())
PY
}

echo "== $RUNS runs, sizes $SIZES, warm-up $WARMUP s, window $DURATION s, broker CPU $BROKER_CPU," \
  "generator CPU $GEN_CPU, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for run in $(seq 1 "$RUNS"); do
  for size in $SIZES; do
    start_broker
    r=$OUT/raw/run$run-$size
    rust_pub() {
      loadgen "$r-rust-publish.json" --workload publish --stream "bench/py/rust$size" \
        --shards "$SHARDS" --payload-bytes "$size" --ack durable --warmup-s "$WARMUP" \
        --duration-s "$DURATION"
    }
    py_pub() { pybench "$r-python-publish.json" publish "bench/py/python$size" "$size"; }
    if [ $((run % 2)) = 1 ]; then rust_pub; py_pub; else py_pub; rust_pub; fi
    # The backlog both read from the earliest record (page cache warm for both).
    loadgen "$r-fill.json" --workload publish --stream "bench/py/backlog$size" --shards "$SHARDS" \
      --payload-bytes "$size" --ack written --warmup-s 0 \
      --duration-s "$([ "$size" -lt 1024 ] && echo "$FILL_S_SMALL" || echo "$FILL_S")"
    rust_sub() {
      loadgen "$r-rust-subscribe.json" --workload subscribe --stream "bench/py/backlog$size" \
        --publishers 0 --subscribers 1 --subscribe-from earliest --payload-bytes "$size" \
        --warmup-s "$WARMUP" --duration-s "$DURATION"
    }
    py_sub() { pybench "$r-python-subscribe.json" subscribe "bench/py/backlog$size" "$size"; }
    if [ $((run % 2)) = 1 ]; then rust_sub; py_sub; else py_sub; rust_sub; fi
    stop_broker
    echo "  run $run, $size B: done"
  done
done

echo "== summary"
python3 - "$OUT" "$RUNS" "$SIZES" "$WARMUP" "$DURATION" "$(git rev-parse --short HEAD)" <<'PY'
import json, statistics, sys
out, runs, sizes, warmup, duration, commit = sys.argv[1:]
runs = int(runs)
rows, lines = [], []
def load(p):
    return json.load(open(p))
for size in sizes.split():
    for mode in ("publish", "subscribe"):
        rust, py, ratio, pycpu = [], [], [], []
        notes = []
        for run in range(1, runs + 1):
            base = f"{out}/raw/run{run}-{size}"
            rj, pj = load(f"{base}-rust-{mode}.json"), load(f"{base}-python-{mode}.json")
            if mode == "publish":
                rr, rb = rj["acked_records"], rj["sent_bytes"] * rj["acked_records"] / max(1, rj["sent_records"])
            else:
                rr, rb = rj["delivered_records"], rj["delivered_bytes"]
                fill = load(f"{base}-fill.json")
                read_all = sum(s["delivered_records"] for s in rj["timeline"])
                if read_all >= 0.97 * fill["sent_records"]:
                    notes.append(f"run {run}, {size} B: Rust reached the end of the backlog")
            rrate, rmb = rr / rj["measured_s"], rb / rj["measured_s"] / 1e6
            prate, pmb = pj["records"] / pj["measured_s"], pj["bytes"] / pj["measured_s"] / 1e6
            if pj["drained"]:
                notes.append(f"run {run}, {size} B, {mode}: Python reached the end of the backlog")
            rust.append((rrate, rmb)); py.append((prate, pmb)); ratio.append(pmb / rmb)
            pycpu.append(100 * pj["cpu_s"] / pj["measured_s"])
        def fmt(v, f):
            return f"{f(statistics.median(v))} ({f(min(v))}-{f(max(v))})"
        recs = lambda v: f"{v / 1000:.0f}k"
        mb = lambda v: f"{v:.0f}"
        rat = lambda v: f"{v:.2f}"
        rows.append(f"| {mode} | {size} B | {fmt([x[0] for x in rust], recs)} | {fmt([x[1] for x in rust], mb)} "
                    f"| {fmt([x[0] for x in py], recs)} | {fmt([x[1] for x in py], mb)} | {fmt(ratio, rat)} "
                    f"| {statistics.median(pycpu):.0f} % |")
        lines += notes
        print(f"{mode:9} {size:>5} B: Rust {statistics.median([x[1] for x in rust]):7.1f} MB/s, "
              f"Python {statistics.median([x[1] for x in py]):7.1f} MB/s, "
              f"ratio {statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})")
table = ["| workload | record | Rust records/s | Rust MB/s | Python records/s | Python MB/s | Python/Rust (MB/s) | Python CPU |",
         "|---|---|---|---|---|---|---|---|"] + rows
open(f"{out}/table.md", "w").write("\n".join(table) + "\n" + "".join(f"\n- {l}" for l in lines) + "\n")
print("\n".join(table))
for l in lines:
    print("note:", l)
PY
echo "== raw numbers in $OUT/raw, table in $OUT/table.md"
