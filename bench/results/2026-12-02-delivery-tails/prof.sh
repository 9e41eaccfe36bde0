#!/usr/bin/env bash
set -uo pipefail
D=/tmp/felix-cab; mkdir -p $D; rm -rf $D/data; mkdir -p $D/data
FELIX=${FELIX:-/tmp/felix-A}; G=${G:-/tmp/loadgen-A}
taskset -c 0 $FELIX serve --listen 127.0.0.1:7700 --cores 1 --cpus 0 --data-dir $D/data --metrics 127.0.0.1:9700 > $D/broker.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $D/data/dev-cert.pem ] && curl -sf 127.0.0.1:9700/health >/dev/null && break; sleep 0.05; done
common="--addr 127.0.0.1:7700 --metrics 127.0.0.1:9700 --ca-file $D/data/dev-cert.pem --broker-pid $bp --max-udp-payload 1452 --quiet --stream bench/delivery/s --shards 12 --keys 12 --payload-bytes 4096 --ack durable --workers 1 --cpus 1"
taskset -c 1 $G run $common --warmup-s 1 --label fill --json ${OUT_DIR:-/tmp/felix-prof}/fill.json --workload publish --batch-records 64 --duration-s 4 --outstanding 8192 --in-flight-batches 256 > /dev/null 2>&1
sync; echo 1 > /proc/sys/vm/drop_caches
taskset -c 1 $G run $common --warmup-s 0 --label catchup --json ${OUT_DIR:-/tmp/felix-prof}/catchup.json --workload subscribe --subscribers 1 --subscribe-from earliest --publishers 0 --duration-s 5 > /dev/null 2>&1 &
gp=$!
sleep 0.5
perf record -q -F 499 --call-graph dwarf,16384 -p $bp -o ${OUT_DIR:-/tmp/felix-prof}/perf.data -- sleep 2 > /dev/null 2>&1
wait $gp
kill $bp; wait $bp 2>/dev/null
perf script -i ${OUT_DIR:-/tmp/felix-prof}/perf.data 2>/dev/null | ~/.cargo/bin/inferno-collapse-perf > ${OUT_DIR:-/tmp/felix-prof}/perf.folded; ~/.cargo/bin/inferno-flamegraph ${OUT_DIR:-/tmp/felix-prof}/perf.folded > ${OUT_DIR:-/tmp/felix-prof}/flame.svg
