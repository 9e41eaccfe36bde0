#!/usr/bin/env bash
# 1 vs 2 vs 3 brokers (one core each) as one cluster on etcd, driven by felix-loadgen through
# one seed: durable keyed publish, 4 KiB records, 64 per batch, 12 keys, a 12-shard stream.
# Throughput is what the brokers stored (their own counters, summed over every broker's
# /metrics). Each run: fresh etcd, fresh brokers and data dirs.
#
#   bench/cluster.sh [runs=3] [duration_s=3]
#
# CAVEAT: on a 2-CPU machine every broker, etcd and the generator share the same two CPUs,
# so this shows that the cluster path works and what it costs, not how it scales; on a machine
# with more cores (taskset each broker to its own core) the same script is the scaling run.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
DURATION=${2:-3}
DATA_ROOT=${DATA_ROOT:-/tmp/felix-cluster-bench}
ETCD_PORT=${ETCD_PORT:-2479}
BROKER_COUNTS=${BROKER_COUNTS:-"1 2 3"}
GEN_CPU=${GEN_CPU:-1}
DATE=$(date -u +%F)
OUT=${OUT:-bench/results/$DATE-cluster}
T=target/release
command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 2; }
cargo build --release -p felix-broker -p felix-loadgen
mkdir -p "$OUT" "$DATA_ROOT"
PORT_BASE=760 METRICS_BASE=960 BROKER_FLAGS="--default-replicas 1"
. bench/cluster-lib.sh

: > "$OUT/raw.tsv"
for n in $BROKER_COUNTS; do
  for run in $(seq 1 "$RUNS"); do
    start_cluster "$n"
    metrics=$(seq -s, -f "127.0.0.1:960%g" 1 "$n")
    $T/felix streams create --stream bench/cluster/s12 --shards 12 --addr 127.0.0.1:7601 \
      --ca-file "$DATA_ROOT/b1/dev-cert.pem" >/dev/null
    json="$OUT/brokers$n-run$run.json"
    taskset -c "$GEN_CPU" $T/felix-loadgen run --addr 127.0.0.1:7601 --metrics "$metrics" \
      --ca-file "$DATA_ROOT/b1/dev-cert.pem" --label "brokers$n-run$run" --warmup-s 1 \
      --json "$json" --quiet --workload publish --stream bench/cluster/s12 --shards 12 --keys 12 \
      --payload-bytes 4096 --batch-records 64 --ack durable --duration-s "$DURATION" \
      --workers 1 --cpus "$GEN_CPU" > "${json%.json}.txt" 2>&1 || { echo "loadgen failed:"; tail "${json%.json}.txt"; }
    stored=$(grep -E "broker stored" "${json%.json}.txt" | head -1)
    echo "brokers=$n run=$run $stored" | tee -a "$OUT/raw.tsv"
    $T/felix cluster status --etcd "http://127.0.0.1:$ETCD_PORT" > "$OUT/brokers$n-run$run.status.txt" || true
    stop_all
  done
done
echo "results in $OUT"
