#!/usr/bin/env bash
# probe-run.sh <label> <rate> [extra loadgen args]
set -e
label=$1; rate=$2; shift 2
data=/tmp/felix-probe-data; rm -rf $data; mkdir -p $data
FELIX_PROBE=/tmp/probe-$label-broker.txt nice -n -15 taskset -c 0 ${FELIX_BIN:-/tmp/probe-target/release/felix} serve --listen 127.0.0.1:7740 --cores 1 --cpus 0 --data-dir $data --metrics 127.0.0.1:9740 --max-udp-payload 1452 --min-free-bytes 0 > /tmp/probe-$label.broker.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $data/dev-cert.pem ] && curl -sf 127.0.0.1:9740/health >/dev/null && break; sleep 0.05; done
FELIX_PROBE=/tmp/probe-$label-client.txt $ENVX nice -n -15 taskset -c 1 /tmp/probe-target/release/felix-loadgen run --addr 127.0.0.1:7740 --metrics 127.0.0.1:9740 --ca-file $data/dev-cert.pem --broker-pid $bp --label $label --warmup-s 1 --quiet --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --duration-s 4 --workers 1 --cpus 1 --max-udp-payload 1452 --rate $rate "$@" > /tmp/probe-$label.txt 2>&1
kill $bp; wait $bp 2>/dev/null || true
rm -rf $data
