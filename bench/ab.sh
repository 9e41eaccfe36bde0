#!/usr/bin/env bash
# bench/ab.sh: two `felix` broker binaries side by side in one run, alternating per run, with
# the same felix-loadgen. Scenarios: the saturated durable keyed publish of bench/run.sh (4 KiB
# x 64, 12 keys, 12 shards, --outstanding 8192 --in-flight-batches 256) and the fixed-rate row
# (10,000 records/s) for latency; a fresh broker per run, `--cores 1` pinned to CPU
# $BROKER_CPU, felix-loadgen pinned to CPU $GEN_CPU.
#
# Usage: bench/ab.sh <label-a> <felix-a> <label-b> <felix-b> <felix-loadgen> <out dir>
#        (RUNS=5 DURATION=4 RATE=10000 by default; PROFILE=1 adds one `perf record` per side;
#        LOADGEN_A / LOADGEN_B give a side its own felix-loadgen; UDP_A / UDP_B a side's path MTU
#        ceiling, broker and generator both, 1452 by default: a 1500-byte path)
# Writes <out dir>: one loadgen JSON and report per run, summary.md (median, min-max, ratios).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
# The fixed-rate row's records/s.
export RATE=${RATE:-10000}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
BROKER_CPU=${BROKER_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
PORT=${PORT:-7720}
MPORT=${MPORT:-9720}
DATE=${DATE:-$(date +%F)}
WORK=${WORK:-/tmp/felix-ab}
A=${1:?label-a}; A_BIN=${2:?felix-a}; B=${3:?label-b}; B_BIN=${4:?felix-b}
LOADGEN=${5:?felix-loadgen}; OUT=${6:?out dir}
PRIO=${PRIO:-nice -n -15}
mkdir -p "$WORK" "$OUT"

declare -A BIN=([$A]=$A_BIN [$B]=$B_BIN)
# Each side may bring its own generator (bench/alloc-ab.sh switches both binaries together).
declare -A GEN=([$A]=${LOADGEN_A:-$LOADGEN} [$B]=${LOADGEN_B:-$LOADGEN})
declare -A UDP=([$A]=${UDP_A:-1452} [$B]=${UDP_B:-1452})

# one_run <variant> <label> [loadgen args...]
one_run() {
  local variant=$1 label=$2
  shift 2
  local data=$WORK/data
  for _ in $(seq 1 100); do ss -ulpn | grep -q ":$PORT " || break; sleep 0.1; done
  rm -rf "$data"
  mkdir -p "$data"
  $PRIO taskset -c "$BROKER_CPU" "${BIN[$variant]}" serve --listen 127.0.0.1:$PORT \
    --cores 1 --cpus "$BROKER_CPU" --data-dir "$data" --metrics 127.0.0.1:$MPORT \
    --max-udp-payload "${UDP[$variant]}" --min-free-bytes 0 >"$OUT/$label.broker.log" 2>&1 &
  local bp=$!
  for _ in $(seq 1 200); do
    [ -f "$data/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break
    sleep 0.05
  done
  local perf_pid=
  if [ "${PROFILE_THIS:-0}" = 1 ]; then
    (sleep "$WARMUP"; exec perf record -F 999 -g -p "$bp" -o "$WORK/$label.perf.data" \
      -- sleep "$DURATION") >/dev/null 2>&1 &
    perf_pid=$!
  fi
  $PRIO taskset -c "$GEN_CPU" "${GEN[$variant]}" run --addr 127.0.0.1:$PORT \
    --metrics 127.0.0.1:$MPORT --ca-file "$data/dev-cert.pem" --broker-pid "$bp" \
    --label "$label" --warmup-s "$WARMUP" --json "$OUT/$label.json" --quiet \
    --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 \
    --batch-records 64 --ack durable --duration-s "$DURATION" --workers 1 --cpus "$GEN_CPU" \
    --max-udp-payload "${UDP[$variant]}" "$@" >"$OUT/$label.txt" 2>&1 || echo "loadgen failed: $label (see $OUT/$label.txt)"
  [ -n "$perf_pid" ] && wait "$perf_pid" 2>/dev/null || true
  kill "$bp"
  wait "$bp" 2>/dev/null || true
  rm -rf "$data"
  if [ -n "$perf_pid" ]; then
    perf report -i "$WORK/$label.perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | head -60 >"$OUT/$label.perf-report.txt" || true
  fi
}

for run in $(seq 1 "$RUNS"); do
  for variant in "$A" "$B"; do
    one_run "$variant" "sat-$variant-$run" --outstanding 8192 --in-flight-batches 256
    one_run "$variant" "rate-$variant-$run" --rate "$RATE"
  done
  echo "run $run of $RUNS done (load $(cut -d' ' -f1 /proc/loadavg))"
done
if [ "${PROFILE:-0}" = 1 ] && command -v perf >/dev/null; then
  for variant in "$A" "$B"; do
    PROFILE_THIS=1 one_run "$variant" "profile-$variant" --outstanding 8192 --in-flight-batches 256
  done
fi

python3 - "$OUT" "$RUNS" "$A" "$B" <<'PY' | tee "$OUT/summary.md"
import glob, json, os, statistics, sys
out, runs, va, vb = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def load(kind, variant):
    rs = []
    for i in range(1, runs + 1):
        p = f"{out}/{kind}-{variant}-{i}.json"
        if os.path.exists(p):
            rs.append(json.load(open(p)))
    return rs

def fig(r, key):
    b = r.get("broker") or {}
    if key == "stored_mb_s":
        return r.get("stored_mb_s")
    if key == "mb_per_broker_cpu_s":
        return r.get("stored_mb_per_broker_cpu_s")
    if key == "mb_per_gen_cpu_s":
        return r.get("stored_mb_per_generator_cpu_s")
    if key == "broker_busy":
        return r.get("broker_busy_pct")
    if key == "gen_busy":
        return r.get("generator_busy_pct")
    if key == "client_p50":
        return r["ack"]["p50_us"] / 1000
    if key == "client_p99":
        return r["ack"]["p99_us"] / 1000
    if key == "broker_p99":
        v = b.get("ack_p99_us_per_core") or []
        return max(v) / 1000 if v else None
    if key == "flush_p99":
        v = b.get("flush_p99_us_per_core") or []
        return max(v) / 1000 if v else None
    if key == "write_p99":
        v = b.get("write_p99_us_per_core") or []
        return max(v) / 1000 if v else None
    if key == "flushes_per_gb":
        return b.get("flushes_per_gb")
    if key == "rss_max_mib":
        v = b.get("rss_max_bytes")
        return v / 2**20 if v else None
    if key == "load":
        return (r.get("load_average_1m") or [None])[0]

def spread(vals, f):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-", None
    m = statistics.median(vals)
    return f"{f.format(m)} ({f.format(min(vals))}-{f.format(max(vals))})", m

print(f"# {va} vs {vb} ({runs} runs each, alternating)\n")
print("Median (min-max). `bench/ab.sh`; broker `--cores 1` on one CPU, felix-loadgen on")
print("the other; durable keyed publish, 4 KiB x 64, 12 keys, 12 shards.\n")
for kind, keys in [
    ("sat", [("stored_mb_s", "{:.0f}"), ("mb_per_broker_cpu_s", "{:.0f}"),
             ("mb_per_gen_cpu_s", "{:.0f}"), ("broker_busy", "{:.0f}"), ("gen_busy", "{:.0f}"),
             ("flushes_per_gb", "{:.0f}"), ("rss_max_mib", "{:.0f}"), ("load", "{:.1f}")]),
    ("rate", [("client_p50", "{:.2f}"), ("client_p99", "{:.2f}"), ("broker_p99", "{:.2f}"),
              ("write_p99", "{:.2f}"), ("flush_p99", "{:.2f}"), ("flushes_per_gb", "{:.0f}"),
              ("mb_per_broker_cpu_s", "{:.0f}"), ("load", "{:.1f}")]),
]:
    title = {"sat": "Saturated (--outstanding 8192)",
             "rate": f"Fixed rate, {int(os.environ.get('RATE', '10000')):,} records/s"}[kind]
    print(f"## {title}\n")
    print("| broker | " + " | ".join(k for k, _ in keys) + " |")
    print("|---|" + "---|" * len(keys))
    meds = {}
    for variant in [va, vb]:
        rs = load(kind, variant)
        cells = []
        for k, f in keys:
            text, m = spread([fig(r, k) for r in rs], f)
            meds[(variant, k)] = m
            cells.append(text)
        print(f"| {variant} (n={len(rs)}) | " + " | ".join(cells) + " |")
    print()
    for k, _ in keys:
        a, b = meds.get((va, k)), meds.get((vb, k))
        if a and b and k != "load":
            print(f"- {k}: {vb} / {va} = {b / a:.2f}")
    print()
PY
