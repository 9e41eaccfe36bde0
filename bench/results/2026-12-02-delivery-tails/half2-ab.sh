#!/usr/bin/env bash
# half2-ab.sh <out> <labelA> <felixA> <labelB> <felixB>: RUNS alternating mixed runs with 2 subscribers at RATE.
set -uo pipefail
OUT=$1; LA=$2; FA=$3; LB=$4; FB=$5; RUNS=${RUNS:-3}; RATE=${RATE:-33666}; G=${G:-/tmp/loadgen-A}; DUR=${DUR:-3}
D=/tmp/felix-h2; mkdir -p "$OUT" "$D"
for run in $(seq 1 "$RUNS"); do
  for side in A B; do
    if [ $side = A ]; then L=$LA; FELIX=$FA; else L=$LB; FELIX=$FB; fi
    rm -rf $D/data; mkdir -p $D/data; sync
    taskset -c 0 $FELIX serve --listen 127.0.0.1:7800 --cores 1 --cpus 0 --data-dir $D/data --metrics 127.0.0.1:9800 > $D/broker.log 2>&1 &
    bp=$!
    for _ in $(seq 1 200); do [ -f $D/data/dev-cert.pem ] && curl -sf 127.0.0.1:9800/health >/dev/null && break; sleep 0.05; done
    taskset -c 1 $G run --addr 127.0.0.1:7800 --metrics 127.0.0.1:9800 --ca-file $D/data/dev-cert.pem --broker-pid $bp --max-udp-payload 1452 --quiet --stream bench/delivery/s --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --workers 1 --cpus 1 --warmup-s 1 --workload mixed --subscribers 2 --rate $RATE --duration-s $DUR --label $L --json $OUT/$L-$run.json > $OUT/$L-$run.txt 2>&1
    kill $bp; wait $bp 2>/dev/null
    python3 - $OUT/$L-$run.json $L <<'PY'
import json,sys
r=json.load(open(sys.argv[1])); b=r['broker']
print(sys.argv[2], 'ack p50/p99 %.1f/%.1f' % (r['ack']['p50_us']/1e3, r['ack']['p99_us']/1e3), 'deliv p50/p99 %.1f/%.1f' % (r['delivery']['p50_us']/1e3, r['delivery']['p99_us']/1e3), 'broker ack p99 %.1f flush p99 %.1f' % (b['ack_p99_us_per_core'][0]/1e3, b['flush_p99_us_per_core'][0]/1e3), 'busy b %.0f g %.0f' % (r['broker_busy_pct'], r['generator_busy_pct']), 'per-s', [t['ack_p99_us']//1000 for t in r['timeline']])
PY
  done
done
rm -rf $D
