#!/usr/bin/env bash
set -uo pipefail
D=/tmp/felix-h2; OUT=/tmp/cab/split; mkdir -p $OUT $D
FELIX=/tmp/felix-A; G=/tmp/loadgen-A
for run in 1 2 3; do
rm -rf $D/data; mkdir -p $D/data; sync
taskset -c 0 $FELIX serve --listen 127.0.0.1:7800 --cores 1 --cpus 0 --data-dir $D/data --metrics 127.0.0.1:9800 > $D/broker.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $D/data/dev-cert.pem ] && curl -sf 127.0.0.1:9800/health >/dev/null && break; sleep 0.05; done
c="--addr 127.0.0.1:7800 --metrics 127.0.0.1:9800 --ca-file $D/data/dev-cert.pem --broker-pid $bp --max-udp-payload 1452 --quiet --stream bench/delivery/s --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --workers 1 --cpus 1"
taskset -c 1 $G run $c --warmup-s 1 --workload subscribe --subscribers 2 --publishers 0 --duration-s 5 --label sub --json $OUT/sub-$run.json > $OUT/sub-$run.txt 2>&1 &
sp=$!
sleep 0.5
taskset -c 1 $G run $c --warmup-s 1 --workload publish --rate 33666 --duration-s 3 --label pub --json $OUT/pub-$run.json > $OUT/pub-$run.txt 2>&1
wait $sp
kill $bp; wait $bp 2>/dev/null
python3 - $OUT/pub-$run.json $OUT/sub-$run.json <<'PY'
import json,sys
r=json.load(open(sys.argv[1])); s=json.load(open(sys.argv[2]))
print('split: pub ack p99 %.1f' % (r['ack']['p99_us']/1e3), 'per-s', [t['ack_p99_us']//1000 for t in r['timeline']], 'broker p99 %.1f' % (r['broker']['ack_p99_us_per_core'][0]/1e3), 'sub delivered', s['delivered_records'], 'deliv p99 %.1f' % (s['delivery']['p99_us']/1e3))
PY
done
