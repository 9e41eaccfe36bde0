#!/usr/bin/env bash
# A subscriber catching up on a 2-core broker: the subscription split by core (the client's
# default, `subscribe_per_core`) against one connection for every shard, side by side.
#
#   bench/catchup-cores.sh <out dir> [runs=5]
#
# Each run: a fresh broker with --cores 2 (pinned to CPUs $BROKER_CPUS) fills a backlog with
# $BACKLOG_S s of the suite's saturated 12-shard durable keyed publish (4 KiB x 64, 12 keys);
# then, for each side in turn (the order alternates from run to run), the broker is restarted
# on the same data, the page cache dropped, and one subscriber (felix-loadgen, pinned to
# $GEN_CPUS) reads the backlog from the earliest offset for $CATCHUP_S s with
# `--subscribe-per-core true` or `false`. Per run and side: the drain rate (MB/s over the full
# seconds of the drain), the broker's and the generator's busy %, and the EventBatch bytes each
# broker core sent (the broker's felix_broker_event_bytes_total). summary.md: median (min-max).
#
# On a 2-CPU machine the subscriber shares CPU $GEN_CPUS with broker core 1, so this shows
# which cores did the sending, not how the drain scales with cores: that needs a host where
# broker cores and subscriber each have CPUs of their own.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:?usage: bench/catchup-cores.sh <out dir> [runs]}
RUNS=${2:-5}
BROKER_CPUS=${BROKER_CPUS:-0,1}
GEN_CPUS=${GEN_CPUS:-1}
BACKLOG_S=${BACKLOG_S:-3}
CATCHUP_S=${CATCHUP_S:-5}
PORT=${PORT:-7650}
MPORT=${MPORT:-9650}
D=${DATA_ROOT:-/tmp/felix-catchup-cores}
T=target/release
mkdir -p "$OUT" "$D"
if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release -p felix-broker -p felix-loadgen
fi

bp=""
stop_broker() {
  if [ -n "$bp" ]; then
    kill "$bp" 2> /dev/null || true
    wait "$bp" 2> /dev/null || true
    bp=""
  fi
}
cleanup() {
  stop_broker
  rm -rf "$D"
}
trap cleanup EXIT

start_broker() {
  taskset -c "$BROKER_CPUS" $T/felix serve --listen 127.0.0.1:"$PORT" --cores 2 \
    --cpus "$BROKER_CPUS" --data-dir "$D/data" --metrics 127.0.0.1:"$MPORT" \
    --max-udp-payload 1452 > "$D/broker.log" 2>&1 &
  bp=$!
  for _ in $(seq 1 200); do
    [ -f "$D/data/dev-cert.pem" ] && curl -sf 127.0.0.1:"$MPORT"/health > /dev/null && return
    sleep 0.05
  done
  echo "broker did not start:"
  tail -20 "$D/broker.log"
  exit 1
}

# gen <json> <label> <args...>
gen() {
  local json=$1 label=$2
  shift 2
  taskset -c "$GEN_CPUS" $T/felix-loadgen run --addr 127.0.0.1:"$PORT" \
    --metrics 127.0.0.1:"$MPORT" --ca-file "$D/data/dev-cert.pem" --broker-pid "$bp" \
    --max-udp-payload 1452 --quiet --stream bench/catchup/s --shards 12 --keys 12 \
    --payload-bytes 4096 --ack durable --workers 1 --cpus "$GEN_CPUS" --label "$label" \
    --json "$json" "$@" > "${json%.json}.txt" 2>&1
}

echo "catchup-cores: runs=$RUNS broker_cpus=$BROKER_CPUS gen_cpus=$GEN_CPUS" \
  "backlog=${BACKLOG_S}s window=${CATCHUP_S}s load=$(cut -d' ' -f1-3 /proc/loadavg)" |
  tee "$OUT/run.txt"
git rev-parse --short HEAD >> "$OUT/run.txt"
for run in $(seq 1 "$RUNS"); do
  rm -rf "$D/data"
  mkdir -p "$D/data"
  start_broker
  gen "$OUT/fill-$run.json" "fill-$run" --workload publish --batch-records 64 --warmup-s 1 \
    --duration-s "$BACKLOG_S" --outstanding 8192 --in-flight-batches 256
  stop_broker
  du -sb "$D/data" | cut -f1 > "$OUT/backlog-$run.bytes"
  sides="true false"
  [ $((run % 2)) = 0 ] && sides="false true"
  for per_core in $sides; do
    start_broker
    sync
    echo 1 > /proc/sys/vm/drop_caches || echo "page cache NOT dropped" >> "$OUT/run.txt"
    gen "$OUT/catchup-$per_core-$run.json" "catchup-$per_core-$run" --workload subscribe \
      --subscribers 1 --subscribe-from earliest --publishers 0 --warmup-s 0 \
      --duration-s "$CATCHUP_S" --subscribe-per-core "$per_core"
    stop_broker
  done
  echo "  run $run done (backlog $(cat "$OUT/backlog-$run.bytes") bytes)"
done

python3 - "$OUT" "$RUNS" << 'PY' | tee "$OUT/summary.md"
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])

def spread(xs, fmt="{:.0f}"):
    xs = sorted(xs)
    return (fmt + " (" + fmt + "-" + fmt + ")").format(statistics.median(xs), xs[0], xs[-1])

print("| subscription | drain MB/s | broker busy % (of 2 cores) | generator busy % | event bytes core 0 / core 1 % | runs |")
print("|---|---|---|---|---|---|")
rates = {}
for side in ("true", "false"):
    rate, broker, gen, share = [], [], [], []
    for run in range(1, runs + 1):
        r = json.load(open(f"{out}/catchup-{side}-{run}.json"))
        t = [x.get("delivered_records") or 0 for x in r["timeline"]]
        full = [x for x in t if x][:-1] or [x for x in t if x]
        rate.append(sum(full) / len(full) * 4096 / 1e6)
        broker.append(r.get("broker_busy_pct") or 0)
        gen.append(r["generator_busy_pct"])
        per_core = (r.get("broker") or {}).get("event_bytes_per_core") or [0, 0]
        total = sum(per_core) or 1
        share.append(100 * per_core[0] / total)
    rates[side] = rate
    name = "split by core (2 parts)" if side == "true" else "one connection (1 part)"
    shares = ", ".join(f"{s:.0f}/{100 - s:.0f}" for s in share)
    print(f"| {name} | {spread(rate)} | {spread(broker)} | {spread(gen)} | {shares} | {runs} |")
ratio = [a / b for a, b in zip(rates["true"], rates["false"])]
print()
print(f"Split over one connection, run by run: {spread(ratio, '{:.2f}')}x")
PY
