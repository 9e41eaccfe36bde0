#!/usr/bin/env bash
# Replication factor 1 vs 3 on one 3-broker cluster (one core each) on etcd, driven by
# felix-loadgen through one seed: durable keyed publish, 4 KiB records, 64 per batch, 12 keys,
# a 12-shard stream created by brokers started with --default-replicas 1 or 3. The series
# alternate (rf1, rf3, rf1, ...) so drift in the machine's load hits both alike.
#
# Per run it records: the payload bytes the leaders stored (their storage_append_bytes
# counters, before and after the run), the CPU time of the three broker processes over the
# same interval (/proc/<pid>/stat), and the generator's publish-to-ack p50/p99 (its JSON).
# "MB stored per broker CPU-second" is the acked payload (each byte once, however many
# replicas hold it) over the CPU of all three brokers.
#
#   bench/replication.sh [runs=3] [duration_s=5]
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
command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 2; }
cargo build --release -p felix-broker -p felix-loadgen
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

printf "rf\trun\tstored_mb\tbroker_cpu_s\tmb_per_broker_cpu_s\tp50_us\tp99_us\n" > "$OUT/raw.tsv"
for run in $(seq 1 "$RUNS"); do
  for rf in 1 3; do
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
echo "results in $OUT"
