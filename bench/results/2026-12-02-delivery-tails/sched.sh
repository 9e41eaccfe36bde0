#!/usr/bin/env bash
set -uo pipefail
D=/tmp/felix-h2; OUT=${OUT_DIR:-/tmp/felix-sched}; mkdir -p $OUT $D; rm -rf $D/data; mkdir -p $D/data; sync
FELIX=${FELIX:-/tmp/felix-A}; G=/tmp/loadgen-A
taskset -c 0 $FELIX serve --listen 127.0.0.1:7800 --cores 1 --cpus 0 --data-dir $D/data --metrics 127.0.0.1:9800 > $D/broker.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $D/data/dev-cert.pem ] && curl -sf 127.0.0.1:9800/health >/dev/null && break; sleep 0.05; done
taskset -c 1 $G run --addr 127.0.0.1:7800 --metrics 127.0.0.1:9800 --ca-file $D/data/dev-cert.pem --broker-pid $bp --max-udp-payload 1452 --quiet --stream bench/delivery/s --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --workers 1 --cpus 1 --warmup-s 1 --workload mixed --subscribers 2 --rate 33666 --duration-s 3 --label s --json $OUT/s.json > $OUT/s.txt 2>&1 &
gp=$!
sleep 1
perf sched record -o $OUT/sched.data -- sleep 3 > /dev/null 2>&1
wait $gp
ls $D/data/core-0/*/ > $OUT/segments.txt
kill $bp; wait $bp 2>/dev/null
echo broker $bp; ps -L -o tid,comm -p $bp 2>/dev/null | head
python3 -c "
import json; r=json.load(open('$OUT/s.json')); print('ack p99', r['ack']['p99_us'], 'per-s', [t['ack_p99_us'] for t in r['timeline']], 'window', r['window_start_unix_ms'])"
