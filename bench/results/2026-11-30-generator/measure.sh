#!/usr/bin/env bash
# measure.sh <broker-bin> <loadgen-bin> <outdir> <label> [extra loadgen args...]
# One run: fresh broker (--cores 1, CPU 0), loadgen on CPU 1, durable keyed 12-shard publish.
set -u
B=$1; L=$2; OUT=$3; LABEL=$4; shift 4
PRIO=${PRIO:-nice -n -15}
PORT=${PORT:-7700}; MPORT=${MPORT:-9700}; DATA=${DATA:-/tmp/gen/data}
DURATION=${DURATION:-3}; WARMUP=${WARMUP:-1}
mkdir -p "$OUT"
for _ in $(seq 1 100); do ss -ulpn | grep -q ":$PORT " || break; sleep 0.1; done
rm -rf "$DATA"; mkdir -p "$DATA"
$PRIO taskset -c 0 "$B" serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 --data-dir "$DATA" \
  --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 > "$OUT/$LABEL.broker.log" 2>&1 &
bp=$!
for _ in $(seq 1 200); do
  [ -f "$DATA/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05
done
echo "loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/$LABEL.txt"
$PRIO taskset -c 1 "$L" run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT --ca-file "$DATA/dev-cert.pem" \
  --broker-pid $bp --label "$LABEL" --warmup-s "$WARMUP" --json "$OUT/$LABEL.json" --quiet \
  --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 \
  --batch-records 64 --ack durable --duration-s "$DURATION" --workers 1 --cpus 1 "$@" >> "$OUT/$LABEL.txt" 2>&1
echo "rc=$?" >> "$OUT/$LABEL.txt"
curl -s 127.0.0.1:$MPORT/metrics | grep -E "^felix_net_(datagrams_in|datagrams_out|recv_calls|send_calls)" > "$OUT/$LABEL.net.txt"
kill $bp; wait $bp 2>/dev/null
rm -rf "$DATA"
python3 - "$OUT/$LABEL.json" <<'PY'
import json,sys
try: r=json.load(open(sys.argv[1]))
except Exception as e: print("no json", e); sys.exit()
b=r.get("broker") or {}
mb=r["stored_mb_s"] or 0
gcs=r["generator_cpu_s"]; bcs=b.get("cpu_s") or 0
st=b.get("stored_bytes",0)/1e6
print("%s stored %.1f MB/s  broker %.0f%%  gen %.0f%%  MB/brokerCPU-s %.0f  MB/genCPU-s %.0f  client p50/p99 %d/%d us  broker p50/p99 %s/%s  load %s" % (
  r["config"]["label"], mb, b.get("cpu_pct") or 0, r["generator_cpu_pct"], st/bcs if bcs else 0, st/gcs if gcs else 0,
  r["ack"]["p50_us"], r["ack"]["p99_us"], b.get("ack_p50_us_per_core"), b.get("ack_p99_us_per_core"), r["load_average_1m"]))
PY
