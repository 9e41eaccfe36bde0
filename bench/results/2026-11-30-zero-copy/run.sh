#!/usr/bin/env bash
# Zero-copy ingest benchmark (issue 13, target 1): MB stored per broker CPU-second.
#
#   bench/results/2026-11-30-zero-copy/run.sh <bin dir> <out dir> <runs> [perf]
#
# Each run: fresh broker and data dir, broker `--cores 1` pinned to CPU 0, felix-loadgen pinned
# to CPU 1; the durable keyed 12-shard publish of bench/run.sh (4 KiB x 64, 12 keys, 12 shards)
# with a deep closed loop (--outstanding 8192 --in-flight-batches 256) so the broker, not the
# generator's window, sets the pace. With `perf` as the 4th argument, run 1 also records the
# broker with `perf record -g` and writes perf-report.txt (flat profile by symbol).
set -euo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
RUNS=${3:-3}
PERF=${4:-}
DURATION=${DURATION:-3}
DATA=${DATA:-/tmp/felix-zc}
PORT=${PORT:-7800}
MPORT=${MPORT:-9800}
mkdir -p "$OUT" "$DATA"
bpid=""
stop() { if [ -n "$bpid" ]; then kill "$bpid" 2>/dev/null || true; wait "$bpid" 2>/dev/null || true; bpid=""; fi; }
trap stop EXIT
start() {
  rm -rf "$DATA/data"; mkdir -p "$DATA/data"; sync
  taskset -c 0 "$BIN/felix" serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 \
    --data-dir "$DATA/data" --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 > "$DATA/broker.log" 2>&1 &
  bpid=$!
  for _ in $(seq 1 200); do
    if [ -f "$DATA/data/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health > /dev/null; then return 0; fi
    sleep 0.05
  done
  echo "broker did not start"; cat "$DATA/broker.log"; exit 1
}
for r in $(seq 1 "$RUNS"); do
  start
  txt="$OUT/run$r.txt"
  echo "load before $(cut -d' ' -f1-3 /proc/loadavg)" > "$txt"
  pp=""
  if [ -n "$PERF" ] && [ "$r" = 1 ]; then
    perf record --call-graph dwarf,16384 -o "$OUT/perf.data" -p "$bpid" > "$OUT/perf-record.log" 2>&1 &
    pp=$!
  fi
  taskset -c 1 "$BIN/felix-loadgen" run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT \
    --ca-file "$DATA/data/dev-cert.pem" --broker-pid "$bpid" --warmup-s 1 --json "$OUT/run$r.json" \
    --workload publish --stream bench/zc/s --shards 12 --keys 12 --payload-bytes 4096 \
    --batch-records 64 --ack durable --workers 1 --cpus 1 --duration-s "$DURATION" \
    --outstanding 8192 --in-flight-batches 256 >> "$txt" 2>&1 || true
  if [ -n "$pp" ]; then kill -INT "$pp"; wait "$pp" || true; fi
  echo "load after $(cut -d' ' -f1-3 /proc/loadavg)" >> "$txt"
  stop
  grep -E "broker CPU|generator CPU|broker stored" "$txt" | sed "s/^/[run$r] /"
done
if [ -n "$PERF" ]; then
  perf report -i "$OUT/perf.data" -g none --no-children --sort symbol --stdio 2>/dev/null \
    | grep -v '^$' | grep -v '^#' | grep -E '^ +[0-9]' | head -60 | sed 's/ *- *- *$//' > "$OUT/perf-report.txt"
  # Who calls memmove: the call chains under it, callers first.
  [ -n "${CALLERS:-}" ] && perf report -i "$OUT/perf.data" --no-children --stdio -g caller,0.5,callee,function,percent --percent-limit 2 \
    --symbols __memmove_avx512_unaligned_erms,__memmove_avx_unaligned_erms 2>/dev/null \
    | grep -v "^$" | head -120 > "$OUT/perf-memmove-callers.txt" || true
  : # perf.data kept for inspection; delete it before committing
  head -25 "$OUT/perf-report.txt"
fi
