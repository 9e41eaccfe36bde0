#!/usr/bin/env bash
# The broker's publish receive span (felix_publish_receive_span_us) beside its ack latency and
# the client's, at fixed rates and saturated (issue 13, target 3: where the client's extra
# latency goes). Durable keyed publish, 4 KiB x 64, 12 keys, 12 shards; a fresh broker per run,
# `--cores 1` on CPU 0, felix-loadgen on CPU 1; 1500-byte path.
#   run.sh <felix> <felix-loadgen> <out dir> [runs=3]
set -euo pipefail
FELIX=${1:?felix}; LOADGEN=${2:?felix-loadgen}; OUT=${3:?out dir}; RUNS=${4:-3}
PORT=${PORT:-7730}; MPORT=${MPORT:-9730}; WORK=${WORK:-/tmp/felix-span}
mkdir -p "$OUT" "$WORK"
one() {
  local label=$1; shift
  local data=$WORK/data
  rm -rf "$data"; mkdir -p "$data"
  nice -n -15 taskset -c 0 "$FELIX" serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 \
    --data-dir "$data" --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 --min-free-bytes 0 \
    >"$OUT/$label.broker.log" 2>&1 &
  local bp=$!
  for _ in $(seq 1 200); do
    [ -f "$data/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break
    sleep 0.05
  done
  nice -n -15 taskset -c 1 "$LOADGEN" run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT \
    --ca-file "$data/dev-cert.pem" --broker-pid "$bp" --label "$label" --warmup-s 1 \
    --json "$OUT/$label.json" --quiet --workload publish --stream bench/publish/s12 --shards 12 \
    --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --duration-s 4 --workers 1 \
    --cpus 1 --max-udp-payload 1452 "$@" >"$OUT/$label.txt" 2>&1 || echo "loadgen failed: $label"
  kill "$bp"; wait "$bp" 2>/dev/null || true
  rm -rf "$data"
}
# SUMMARY_ONLY=1: only the table, from the JSONs already in <out dir>.
[ "${SUMMARY_ONLY:-0}" = 1 ] && RUNS=0
for run in $(seq 1 "$RUNS"); do
  one "rate10000-$run" --rate 10000
  one "rate28400-$run" --rate 28400
  one "rate55000-$run" --rate 55000
  one "rate55000-write-order-$run" --rate 55000 --send-in-write-order
  one "sat-$run" --outstanding 8192 --in-flight-batches 256
  echo "run $run done (load $(cut -d' ' -f1 /proc/loadavg))"
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary-table.md"
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows = {}
for p in sorted(glob.glob(f"{out}/*.json")):
    kind = re.sub(r"-\d+$", "", os.path.basename(p)[:-5])
    r = json.load(open(p)); b = r.get("broker") or {}
    rows.setdefault(kind, []).append(r)
def med0(xs):
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"
def med(xs):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-"
print("| case | client p50 / p99 ms | broker ack p50 / p99 ms | receive span p50 / p99 us | write p99 / flush p99 ms | broker CPU % |")
print("|---|---|---|---|---|---|")
for kind, rs in rows.items():
    g = lambda f: [f(r) for r in rs]
    b = lambda r: r["broker"]
    c = lambda q: g(lambda r: r["ack"][q] / 1000)
    print(f"| {kind} | {med(c('p50_us'))} / {med(c('p99_us'))} "
          f"| {med(g(lambda r: b(r)['ack_p50_us_per_core'][0] / 1000))} / {med(g(lambda r: b(r)['ack_p99_us_per_core'][0] / 1000))} "
          f"| {med0(g(lambda r: b(r)['receive_p50_us_per_core'][0]))} / {med0(g(lambda r: b(r)['receive_p99_us_per_core'][0]))} "
          f"| {med(g(lambda r: b(r)['write_p99_us_per_core'][0] / 1000))} / {med(g(lambda r: b(r)['flush_p99_us_per_core'][0] / 1000))} "
          f"| {med(g(lambda r: b(r)['cpu_pct']))} |")
PY
