#!/usr/bin/env bash
set -u
cd /work/main; BIN=${BIN:-target/release/felix}; LG=target/release/felix-loadgen; OUT=${OUT:-/tmp/prof/half}; mkdir -p $OUT
RATE=${RATE:-55000}
for r in $(seq 1 ${RUNS:-3}); do
data=/tmp/prof/data; rm -rf $data; mkdir -p $data; PORT=7730; MPORT=9730
for _ in $(seq 1 100); do ss -ulpn | grep -q ":$PORT " || break; sleep 0.1; done
nice -n -15 taskset -c 0 $BIN serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 --data-dir $data --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 --min-free-bytes 0 >$OUT/b$r.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $data/dev-cert.pem ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05; done
nice -n -15 taskset -c 1 $LG run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT --ca-file $data/dev-cert.pem --broker-pid $bp --label h$r --warmup-s 1 --json $OUT/run$r.json --quiet --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --duration-s 4 --workers 1 --cpus 1 --max-udp-payload 1452 --rate $RATE ${EXTRA:-} > $OUT/run$r.txt 2>&1
kill $bp; wait $bp; rm -rf $data
python3 -c "
import json; r=json.load(open('$OUT/run$r.json')); b=r['broker']
print('run $r client p50/p99', r['ack']['p50_us'], r['ack']['p99_us'], 'broker p99', b['ack_p99_us_per_core'], 'flush p99', b['flush_p99_us_per_core'], 'flow blocked', r['client_quic'].get('flow_control_blocked'))
for s in r['timeline']: print('   t', round(s['t_s']), 'client p99', s['ack_p99_us'], 'broker latest ack/write/flush p99', s.get('broker_latest_ack_p99_us_per_core'), s.get('broker_latest_write_p99_us_per_core'), s.get('broker_latest_flush_p99_us_per_core'), 'span', s.get('broker_latest_span_ms_per_core'))
"
done
