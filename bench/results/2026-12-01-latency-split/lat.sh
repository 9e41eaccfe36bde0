#!/bin/bash
# lat.sh <label> <loadgen args...>: one fixed-rate run, prints client vs broker latency
L=$1; shift; OUT=/tmp/pz/lat; mkdir -p $OUT; data=/tmp/pz/latdata; rm -rf $data; mkdir -p $data
for _ in $(seq 1 100); do ss -ulpn | grep -q ":7720 " || break; sleep 0.1; done
nice -n -15 taskset -c 0 /tmp/pz/felix serve --listen 127.0.0.1:7720 --cores 1 --cpus 0 --data-dir $data --metrics 127.0.0.1:9720 --max-udp-payload 1452 --min-free-bytes 0 > $OUT/$L.broker.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $data/dev-cert.pem ] && curl -sf 127.0.0.1:9720/health >/dev/null && break; sleep 0.05; done
nice -n -15 taskset -c 1 /tmp/pz/felix-loadgen run --addr 127.0.0.1:7720 --metrics 127.0.0.1:9720 --ca-file $data/dev-cert.pem --broker-pid $bp --label $L --warmup-s 1 --json $OUT/$L.json --quiet --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack ${ACK:-durable} --duration-s 5 --workers 1 --cpus 1 "$@" > $OUT/$L.txt 2>&1
kill $bp; wait $bp 2>/dev/null; rm -rf $data
python3 -c "
import json; j=json.load(open('$OUT/$L.json')); b=j.get('broker') or {}
print('%-14s'%'$L', 'client p50/p99 %.2f/%.2f'%(j['ack']['p50_us']/1000, j['ack']['p99_us']/1000), 'broker p50/p99 %.2f/%.2f'%(b['ack_p50_us_per_core'][0]/1000, b['ack_p99_us_per_core'][0]/1000), 'w99 %.2f f99 %.2f'%(b['write_p99_us_per_core'][0]/1000, b['flush_p99_us_per_core'][0]/1000), 'busy b%d g%d'%(j.get('broker_busy_pct') or 0, j.get('generator_busy_pct') or 0), 'rate %.0f'%(j['acked_records']/j['measured_s']))"
