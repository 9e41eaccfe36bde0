#!/usr/bin/env bash
# Bounded memory over a cluster's life (issue 48): a 3-broker cluster (one core each, on etcd,
# bench/cluster-lib.sh), a 4-shard stream with replication factor 3, and `soak_pub`
# (bench/src/bin) for DURATION_S: RATE steady records a second of 1 KiB beside PRODUCERS
# short-lived idempotent producers (one record each, spread over the run). Every SAMPLE_S it
# samples each broker's RSS (/proc/<pid>/status) and its gauges (/metrics): the producers the
# replicas' tables remember (felix_broker_replication_producers) and the bytes of batch
# bookkeeping they hold (felix_broker_replication_index_bytes). The brokers run with
# --producer-expiry EXPIRY, so producers expire during the run.
#
# After the soak, a restart: b2 is killed (-9) and started again, and its peak RSS until it is
# back in every in-sync set (VmHWM) is read: once from its replica checkpoints, once with them
# removed (every batch of its log read back, as before the checkpoints).
#
# Summary: per broker, the RSS slope after warm-up (the first WARMUP_PCT percent of the run is
# left out; least squares, KiB per minute) and the gauges' range; the restart peaks.
#
#   bench/soak-cluster.sh [duration_s=1800]
#   RESTART_ONLY=1 bench/soak-cluster.sh   # the restarts again, on the last soak's data
#
# Needs etcd (apt-get install etcd-server). Brokers on CPU 0, the publisher on CPU 1; on this
# 2-CPU machine everything shares two CPUs, so rates are not the point: memory is. Results:
# bench/results/<date>-soak-cluster/ (samples.csv, soak_pub.jsonl, summary.json, summary.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION_S=${1:-1800}
PRODUCERS=${PRODUCERS:-100000}
RATE=${RATE:-200}
EXPIRY=${EXPIRY:-2m}
SAMPLE_S=${SAMPLE_S:-10}
WARMUP_PCT=${WARMUP_PCT:-20}
DATA_ROOT=${DATA_ROOT:-/tmp/felix-soak}
ETCD_PORT=${ETCD_PORT:-2779}
STREAM=bench/soak/s1
DATE=$(date -u +%F)
OUT=${OUT:-bench/results/$DATE-soak-cluster}
COMMIT=$(git describe --always --dirty 2>/dev/null || echo unknown)
command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 2; }
cargo build --release -p felix-broker --bin felix -p felix-bench --bin soak_pub
T=target/release
mkdir -p "$OUT"
PORT_BASE=780 METRICS_BASE=980
BROKER_FLAGS="--producer-expiry $EXPIRY"
. bench/cluster-lib.sh
CA="$DATA_ROOT/b1/dev-cert.pem"
ADDRS="127.0.0.1:${PORT_BASE}1,127.0.0.1:${PORT_BASE}2,127.0.0.1:${PORT_BASE}3"

# start_broker I: b<I> on its data directory (b2, b3 with b1's certificate), appending to its log.
start_broker() {
  local i=$1 cert=()
  if [ "$i" -gt 1 ]; then cert=(--cert "$DATA_ROOT/b1/dev-cert.pem" --key "$DATA_ROOT/b1/dev-key.pem"); fi
  # shellcheck disable=SC2086
  taskset -c 0 "$T/felix" serve --cluster-etcd "http://127.0.0.1:$ETCD_PORT" --node-id "b$i" \
    --listen "127.0.0.1:${PORT_BASE}$i" --advertise "127.0.0.1:${PORT_BASE}$i" \
    --metrics "127.0.0.1:${METRICS_BASE}$i" --cores 1 --no-pin --data-dir "$DATA_ROOT/b$i" \
    --min-free-bytes 0 $BROKER_FLAGS "${cert[@]}" >>"$DATA_ROOT/b$i.log" 2>&1 &
  brokers[$((i - 1))]=$!
  pids+=($!)
}

if [ -z "${RESTART_ONLY:-}" ]; then
  start_cluster 3
  "$T/felix" streams create --stream "$STREAM" --shards 4 --replicas 3 \
    --addr "127.0.0.1:${PORT_BASE}1" --ca-file "$CA" >/dev/null
else
  # The last soak's etcd and brokers, on their data.
  [ -f "$OUT/summary.json" ] && [ -d "$DATA_ROOT/b2" ] || { echo "no soak to restart in $OUT, $DATA_ROOT" >&2; exit 2; }
  etcd --name bench --data-dir "$DATA_ROOT/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((ETCD_PORT + 1))" >>"$DATA_ROOT/etcd.log" 2>&1 &
  pids+=($!)
  for i in 1 2 3; do start_broker "$i"; done
fi

# gauge I NAME: the sum over broker I's cores of metric NAME.
gauge() {
  curl -sf "127.0.0.1:${METRICS_BASE}$1/metrics" 2>/dev/null |
    awk -v m="$2" '$1 ~ "^"m"[{]" || $1 == m { s += $NF } END { print s + 0 }'
}
status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# Every group of STREAM with a live leader and three in-sync replicas.
healthy() {
  "$T/felix" cluster status --json --etcd "http://127.0.0.1:$ETCD_PORT" 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin)
st = [x for x in s.get("streams", []) if x["name"] == sys.argv[1]]
ok = st and st[0]["groups"] and all(g["leader_live"] and len(g["isr"]) == 3 for g in st[0]["groups"])
sys.exit(0 if ok else 1)
' "$STREAM"
}
wait_healthy() {
  for _ in $(seq 1 1200); do healthy && return 0; sleep 0.1; done
  echo "the cluster did not become healthy" >&2
  return 1
}
wait_healthy

if [ -z "${RESTART_ONLY:-}" ]; then
echo "t_s,broker,rss_kib,producers,index_bytes,storage_producers" >"$OUT/samples.csv"
sample() {
  local t=$1 i pid
  for i in 1 2 3; do
    pid=${brokers[$((i - 1))]}
    echo "$t,b$i,$(status_kb "$pid" VmRSS),$(gauge "$i" felix_broker_replication_producers),$(gauge "$i" felix_broker_replication_index_bytes),$(gauge "$i" felix_storage_producers)" >>"$OUT/samples.csv"
  done
}

echo "soak: ${DURATION_S} s, $PRODUCERS short-lived producers, $RATE records/s steady, expiry $EXPIRY"
taskset -c 1 "$T/soak_pub" --addr "$ADDRS" --ca-file "$CA" --stream "$STREAM" \
  --duration-s "$DURATION_S" --producers "$PRODUCERS" --rate "$RATE" \
  >"$OUT/soak_pub.jsonl" 2>"$DATA_ROOT/soak_pub.log" &
pub=$!
pids+=("$pub")
start=$(date +%s)
while kill -0 "$pub" 2>/dev/null; do
  sample $(($(date +%s) - start))
  sleep "$SAMPLE_S"
done
pub_rc=0
wait "$pub" || pub_rc=$?
sample $(($(date +%s) - start))
echo "$pub_rc" >"$DATA_ROOT/pub_rc"
fi
pub_rc=$(cat "$DATA_ROOT/pub_rc" 2>/dev/null || echo 0)
log_mib=$(du -sm "$DATA_ROOT/b2" | cut -f1)

# restart_peak LABEL: kill -9 b2, start it again, wait until the new process has recovered
# its four replicas (their "replica log recovered" lines) and every group is whole again,
# then print "LABEL peak_rss_kib seconds_to_recovered" (VmHWM: the peak since its start).
restart_peak() {
  local label=$1 old=${brokers[1]} t0 t1 before
  kill -9 "$old"
  wait "$old" 2>/dev/null || true
  [ "$label" = without_checkpoint ] && find "$DATA_ROOT/b2" -name 'replica-*.ckpt' -delete
  before=$(grep -c "replica log recovered" "$DATA_ROOT/b2.log" || true)
  t0=$(date +%s.%N)
  start_broker 2
  for _ in $(seq 1 1200); do
    [ "$(grep -c "replica log recovered" "$DATA_ROOT/b2.log" || true)" -ge $((before + 4)) ] && break
    sleep 0.05
  done
  t1=$(date +%s.%N)
  wait_healthy
  sleep 5
  grep "replica log recovered" "$DATA_ROOT/b2.log" | tail -4 | sed 's/\x1b\[[0-9;]*m//g' >>"$DATA_ROOT/recovered"
  echo "$label $(status_kb "${brokers[1]}" VmHWM) $(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" >>"$DATA_ROOT/restarts"
}
sleep 2
rm -f "$DATA_ROOT/restarts" "$DATA_ROOT/recovered"
restart_peak with_checkpoint
restart_peak without_checkpoint
# Once more from a checkpoint (the run without one wrote new ones once it learned the commit
# point): the first may have found checkpoints older than the last archive.
restart_peak with_checkpoint_again
restarts=$(cat "$DATA_ROOT/restarts")
recovered=$(cat "$DATA_ROOT/recovered")
stop_all

python3 - "$OUT" "$COMMIT" "$DURATION_S" "$PRODUCERS" "$RATE" "$EXPIRY" "$WARMUP_PCT" "$pub_rc" "$log_mib" "$restarts" "$recovered" <<'PY'
import csv, json, sys
out, commit, duration, producers, rate, expiry, warmup, pub_rc, log_mib, restarts, recovered = sys.argv[1:]
import os
restart_commit = commit
if os.environ.get("RESTART_ONLY"):
    # The soak itself ran at the commit its first summary names.
    commit = json.load(open(f"{out}/summary.json"))["commit"]
rows = list(csv.DictReader(open(f"{out}/samples.csv")))
pub = [json.loads(l) for l in open(f"{out}/soak_pub.jsonl") if l.strip()]
last = pub[-1] if pub else {}
cut = float(duration) * float(warmup) / 100
def slope(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
brokers = {}
for b in sorted({r["broker"] for r in rows}):
    rs = [r for r in rows if r["broker"] == b]
    after = [r for r in rs if float(r["t_s"]) >= cut] or rs
    t = [float(r["t_s"]) / 60 for r in after]
    rss = [float(r["rss_kib"]) for r in after]
    prod = [float(r["producers"]) for r in rs]
    idx = [float(r["index_bytes"]) for r in rs]
    brokers[b] = {
        "rss_kib_after_warmup_first": rss[0], "rss_kib_last": rss[-1],
        "rss_kib_min": min(rss), "rss_kib_max": max(rss),
        "rss_slope_kib_per_min": round(slope(t, rss), 1),
        "producers_max": max(prod), "producers_last": prod[-1],
        "index_bytes_max": max(idx), "index_bytes_last": idx[-1],
    }
peaks = {}
for line in restarts.strip().splitlines():
    label, hwm, secs = line.split()
    peaks[label] = {"peak_rss_kib": int(hwm), "seconds_to_recovered": round(float(secs), 1)}
summary = {"commit": commit, "duration_s": int(duration), "producers": int(producers),
           "rate": int(rate), "expiry": expiry, "warmup_pct": int(warmup), "publisher": last,
           "publisher_rc": int(pub_rc), "b2_data_mib": int(log_mib), "brokers": brokers,
           "restart_b2": peaks, "restart_commit": restart_commit, "recovery_lines": recovered.strip().splitlines()}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
with open(f"{out}/summary.md", "w") as f:
    f.write(f"# Soak: bounded memory ({duration} s)\n\n")
    f.write(f"3 brokers (one core each, CPU 0), RF 3, a 4-shard stream; soak_pub on CPU 1: {rate} "
            f"records/s of 1 KiB steady and {producers} short-lived idempotent producers over the "
            f"run; --producer-expiry {expiry}; release build of {commit}.\n\n")
    f.write(f"Publisher: {last}\n\n")
    f.write(f"| broker | RSS after warm-up ({warmup} %) (KiB) | last | min-max | slope (KiB/min) | producers remembered, max / last | bookkeeping bytes, max / last |\n|---|---|---|---|---|---|---|\n")
    for b, s in brokers.items():
        f.write(f"| {b} | {s['rss_kib_after_warmup_first']:.0f} | {s['rss_kib_last']:.0f} | {s['rss_kib_min']:.0f}-{s['rss_kib_max']:.0f} | {s['rss_slope_kib_per_min']} | {s['producers_max']:.0f} / {s['producers_last']:.0f} | {s['index_bytes_max']:.0f} / {s['index_bytes_last']:.0f} |\n")
    f.write(f"\nRestarts of b2 at {restart_commit} (kill -9; {log_mib} MiB in its data directory), peak RSS (VmHWM) once its replicas were recovered and every group was whole again (5 s after):\n\n")
    f.write("| start | peak RSS (KiB) | seconds until its replicas were recovered |\n|---|---|---|\n")
    for label, p in peaks.items():
        f.write(f"| {label.replace('_', ' ')} | {p['peak_rss_kib']} | {p['seconds_to_recovered']} |\n")
    f.write("\nRecovery lines of the restarts (checkpoint_end: where the checkpoint ended; batches_after: batches read from storage after it):\n\n```text\n" + recovered.strip() + "\n```\n")
print(open(f"{out}/summary.md").read())
PY
