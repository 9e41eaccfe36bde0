#!/usr/bin/env bash
# Half-load publish, one broker binary, two generator settings alternating.
# usage: gen-ab.sh OUT RUNS RATE "argsA" "argsB"
# (LOADGEN_A / LOADGEN_B: a felix-loadgen binary per side, LOADGEN for both by default)
set -euo pipefail
cd /work/main
OUT=$1; RUNS=$2; RATE=$3; ARGS_A=$4; ARGS_B=$5
FELIX=${FELIX:-target/release/felix}; LOADGEN=${LOADGEN:-target/release/felix-loadgen}
PORT=7730; MPORT=9730; WORK=/tmp/felix-genab; DURATION=${DURATION:-4}
mkdir -p "$OUT" "$WORK"
one_run() {
  local label=$1; shift
  local data=$WORK/data
  for _ in $(seq 1 100); do ss -ulpn | grep -q ":$PORT " || break; sleep 0.1; done
  rm -rf "$data"; mkdir -p "$data"
  nice -n -15 taskset -c 0 "${BIN:-$FELIX}" serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 \
    --data-dir "$data" --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 --min-free-bytes 0 \
    >"$OUT/$label.broker.log" 2>&1 &
  local bp=$!
  for _ in $(seq 1 200); do
    [ -f "$data/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05
  done
  nice -n -15 taskset -c 1 "${LG:-$LOADGEN}" run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT \
    --ca-file "$data/dev-cert.pem" --broker-pid "$bp" --label "$label" --warmup-s 1 \
    --json "$OUT/$label.json" --quiet --workload publish --stream bench/publish/s12 --shards 12 \
    --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --duration-s "$DURATION" \
    --workers 1 --cpus 1 --max-udp-payload 1452 --rate "$RATE" "$@" >"$OUT/$label.txt" 2>&1 \
    || echo "loadgen failed: $label"
  curl -s 127.0.0.1:$MPORT/metrics > "$OUT/$label.metrics.txt" || true
  kill "$bp"; wait "$bp" 2>/dev/null || true
  rm -rf "$data"
}
for run in $(seq 1 "$RUNS"); do
  LG=${LOADGEN_A:-$LOADGEN} one_run "A-$run" $ARGS_A
  LG=${LOADGEN_B:-$LOADGEN} BIN=${FELIX_B:-$FELIX} one_run "B-$run" $ARGS_B
  echo "run $run done (load $(cut -d' ' -f1 /proc/loadavg))"
done
