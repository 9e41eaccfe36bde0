#!/usr/bin/env bash
# Replication factor 1 vs 3 on one 3-broker cluster (one core each) on etcd, driven by
# felix-loadgen through one seed: durable keyed publish, 4 KiB records, 64 per batch, 12 keys,
# a 12-shard stream created by brokers started with --default-replicas 1 or 3; and the peer
# row, NATS JetStream R3: three clustered nats-server (Debian's package, file store, one CPU
# like the brokers), a 12-subject R3 stream, 4 KiB messages from bench's nats_pub (async acks,
# $NATS_IN_FLIGHT in flight, default 256). The series alternate (rf1, rf3, nats3, rf1, ...) so
# drift in the machine's load hits all alike; the end prints each series' median and spread
# and the ratios the replication issue sets targets on.
#
# Per run it records: the payload bytes the leaders stored (their storage_append_bytes
# counters, before and after the run), the CPU time of the three broker processes over the
# same interval (/proc/<pid>/stat), and the generator's publish-to-ack p50/p99 (its JSON).
# "MB stored per broker CPU-second" is the acked payload (each byte once, however many
# replicas hold it) over the CPU of all three brokers.
#
#   bench/replication.sh [runs=3] [duration_s=5]
#   SERIES="1 3" bench/replication.sh     (leave NATS out; "nats3" names it)
#
# CAVEAT: on a 2-CPU machine the three brokers, etcd and the generator share two CPUs (brokers
# on CPU 0, the generator on CPU 1), so RF 3's extra work (two more copies written and
# fdatasync'd, the fetches) competes with the leaders for the same CPU: this measures the cost
# of replication, not how a cluster of real hosts scales.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
DURATION=${2:-5}
DATA_ROOT=${DATA_ROOT:-/tmp/felix-replication-bench}
ETCD_PORT=${ETCD_PORT:-2579}
GEN_CPU=${GEN_CPU:-1}
DATE=$(date -u +%F)
OUT=${OUT:-bench/results/$DATE-replication}
T=target/release
SERIES=${SERIES:-"1 3 nats3"}
NATS_IN_FLIGHT=${NATS_IN_FLIGHT:-256}
NATS_PORT_BASE=${NATS_PORT_BASE:-423}
command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 2; }
case " $SERIES " in *" nats3 "*)
  command -v nats-server >/dev/null || { echo "nats-server not found: apt-get install nats-server (or SERIES=\"1 3\")" >&2; exit 2; } ;;
esac
cargo build --release -p felix-broker -p felix-loadgen -p felix-bench --bin nats_pub
mkdir -p "$OUT" "$DATA_ROOT"
PORT_BASE=770 METRICS_BASE=970
. bench/cluster-lib.sh

# Sum of the brokers' CPU seconds (utime + stime).
brokers_cpu_s() {
  local ticks=0 hz
  hz=$(getconf CLK_TCK)
  for p in "${brokers[@]}"; do
    ticks=$((ticks + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "scale=3; $ticks / $hz" | bc
}

# Sum of the leaders' stored payload bytes.
stored_bytes() {
  local sum=0 v
  for i in 1 2 3; do
    v=$(curl -sf "127.0.0.1:970$i/metrics" | awk '/^felix_storage_append_bytes_total/ {s += $2} END {printf "%d", s}')
    sum=$((sum + v))
  done
  echo "$sum"
}

# start_nats_cluster: three nats-server with JetStream (file store under $DATA_ROOT) in one
# cluster, routes on 127.0.0.1, all on CPU 0 like the brokers; their pids in nats_pids.
start_nats_cluster() {
  rm -rf "$DATA_ROOT"; mkdir -p "$DATA_ROOT"; sync
  nats_pids=()
  local routes="nats://127.0.0.1:${NATS_PORT_BASE}51,nats://127.0.0.1:${NATS_PORT_BASE}52,nats://127.0.0.1:${NATS_PORT_BASE}53"
  for i in 1 2 3; do
    taskset -c 0 nats-server -js -sd "$DATA_ROOT/n$i" -n "n$i" -a 127.0.0.1 -p "${NATS_PORT_BASE}$i" \
      --cluster_name bench --cluster "nats://127.0.0.1:${NATS_PORT_BASE}5$i" --routes "$routes" \
      > "$DATA_ROOT/n$i.log" 2>&1 &
    pids+=($!); nats_pids+=($!)
  done
  for _ in $(seq 1 400); do
    grep -qs "JetStream cluster new metadata leader\|Self is new JetStream cluster metadata leader" "$DATA_ROOT"/n*.log && return 0
    sleep 0.05
  done
  echo "the nats-server cluster did not form:"; tail -5 "$DATA_ROOT"/n*.log; exit 1
}

printf "rf\trun\tstored_mb\tbroker_cpu_s\tmb_per_broker_cpu_s\tp50_us\tp99_us\n" > "$OUT/raw.tsv"
for run in $(seq 1 "$RUNS"); do
  for rf in $SERIES; do
    if [ "$rf" = nats3 ]; then
      start_nats_cluster
      json="$OUT/nats3-run$run.json"
      pid_list=$(IFS=,; echo "${nats_pids[*]}")
      taskset -c "$GEN_CPU" $T/nats_pub --server "127.0.0.1:${NATS_PORT_BASE}1" --server-pid "$pid_list" \
        --replicas 3 --subjects 12 --payload-bytes 4096 --in-flight "$NATS_IN_FLIGHT" --warmup-s 1 \
        --duration-s "$DURATION" --label "nats3-run$run" --json "$json" > "${json%.json}.txt" 2>&1 \
        || { echo "nats_pub failed:"; tail "${json%.json}.txt"; }
      nats-server --version > "$OUT/nats-server-version.txt" 2>&1 || true
      python3 - "$json" "$run" >> "$OUT/raw.tsv" <<'EOF'
import json, sys
path, run = sys.argv[1:]
try:
    r = json.load(open(path))
    mb, cpu = r["broker"]["stored_bytes"] / 1e6, r["broker"]["cpu_s"]
    p50, p99 = r["ack"]["p50_us"], r["ack"]["p99_us"]
except Exception:
    mb, cpu, p50, p99 = 0.0, 0.0, None, None
print(f"nats3\t{run}\t{mb:.1f}\t{cpu:.2f}\t{mb / cpu if cpu else 0:.1f}\t{p50}\t{p99}")
EOF
      tail -1 "$OUT/raw.tsv"
      stop_all
      continue
    fi
    BROKER_FLAGS="--default-replicas $rf" start_cluster 3
    $T/felix streams create --stream bench/repl/s12 --shards 12 --addr 127.0.0.1:7701 \
      --ca-file "$DATA_ROOT/b1/dev-cert.pem" >/dev/null
    # Wait until every shard has a live leader (RF 3: a group per shard).
    sleep 2
    json="$OUT/rf$rf-run$run.json"
    cpu0=$(brokers_cpu_s); st0=$(stored_bytes)
    taskset -c "$GEN_CPU" $T/felix-loadgen run --addr 127.0.0.1:7701 \
      --ca-file "$DATA_ROOT/b1/dev-cert.pem" --label "rf$rf-run$run" --warmup-s 0 \
      --json "$json" --quiet --workload publish --stream bench/repl/s12 --shards 12 --keys 12 \
      --payload-bytes 4096 --batch-records 64 --ack durable --duration-s "$DURATION" \
      --workers 1 --cpus "$GEN_CPU" > "${json%.json}.txt" 2>&1 || { echo "loadgen failed:"; tail "${json%.json}.txt"; }
    cpu1=$(brokers_cpu_s); st1=$(stored_bytes)
    $T/felix cluster status --etcd "http://127.0.0.1:$ETCD_PORT" > "$OUT/rf$rf-run$run.status.txt" || true
    python3 - "$json" "$rf" "$run" "$st0" "$st1" "$cpu0" "$cpu1" >> "$OUT/raw.tsv" <<'EOF'
import json, sys
path, rf, run, st0, st1, cpu0, cpu1 = sys.argv[1:]
mb = (int(st1) - int(st0)) / 1e6
cpu = float(cpu1) - float(cpu0)
try:
    r = json.load(open(path))
    p50, p99 = r["ack"]["p50_us"], r["ack"]["p99_us"]
except Exception:
    p50 = p99 = None
print(f"{rf}\t{run}\t{mb:.1f}\t{cpu:.2f}\t{mb / cpu if cpu else 0:.1f}\t{p50}\t{p99}")
EOF
    tail -1 "$OUT/raw.tsv"
    stop_all
  done
done
python3 - "$OUT/raw.tsv" "$DURATION" <<'EOF' | tee "$OUT/summary.txt"
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
duration = float(sys.argv[2])
series = {}
for r in rows:
    series.setdefault(r[0], []).append(r)
def med(xs):
    return statistics.median(xs) if xs else float("nan")
per_cpu = {}
print(f"{'series':8} {'runs':>4} {'acked MB/s':>18} {'MB per server CPU-s':>22} {'ack p50/p99 ms':>20}")
for name, rs in series.items():
    mbs = [float(r[2]) / duration for r in rs]
    eff = [float(r[4]) for r in rs]
    p50 = [float(r[5]) / 1000 for r in rs if r[5] != "None"]
    p99 = [float(r[6]) / 1000 for r in rs if r[6] != "None"]
    per_cpu[name] = med(eff)
    print(f"{name:8} {len(rs):>4} {med(mbs):>7.1f} ({min(mbs):.1f}-{max(mbs):.1f}) "
          f"{med(eff):>9.1f} ({min(eff):.1f}-{max(eff):.1f}) {med(p50):>8.1f} / {med(p99):.1f}")
if "1" in per_cpu and "3" in per_cpu and per_cpu["3"]:
    print(f"RF 3 costs {per_cpu['1'] / per_cpu['3']:.2f}x RF 1's CPU per acked byte (target <= 3.5)")
if "3" in per_cpu:
    print(f"RF 3: {per_cpu['3']:.0f} MB acked per summed server CPU-s (target >= 250)")
if "3" in per_cpu and per_cpu.get("nats3"):
    print(f"RF 3 vs NATS JetStream R3 per server CPU-s: {per_cpu['3'] / per_cpu['nats3']:.2f}x (target >= 4)")
EOF
echo "results in $OUT"
