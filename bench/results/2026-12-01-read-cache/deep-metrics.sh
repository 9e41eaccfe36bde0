#!/bin/bash
BIN=$1; DATA=/tmp/felix-deep1; PORT=7961; MPORT=9961
rm -rf $DATA; mkdir -p $DATA
nice -n -19 taskset -c 0 $BIN/felix serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 --data-dir $DATA --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 > /tmp/deep1.broker.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $DATA/dev-cert.pem ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05; done
lg() { nice -n -19 taskset -c 1 $BIN/felix-loadgen run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT --ca-file $DATA/dev-cert.pem --broker-pid $bp --stream bench/dlv/s --shards 12 --keys 12 --payload-bytes 4096 --batch-records 1 --ack durable --workers 1 --cpus 1 "$@"; }
lg --workload publish --duration-s 5 --warmup-s 1 --quiet > /tmp/deep1.fill.txt 2>&1
sync; echo 1 > /proc/sys/vm/drop_caches
lg --workload subscribe --subscribers 1 --subscribe-from earliest --publishers 0 --duration-s 5 --warmup-s 0 > /tmp/deep1.sub.txt 2>&1
curl -s 127.0.0.1:$MPORT/metrics | grep -E "read_cache|log_batches_total|event_batches_total|event_bytes_total" | grep -v "^#"
kill $bp; wait $bp; rm -rf $DATA
