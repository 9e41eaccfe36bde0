#!/usr/bin/env bash
# profile.sh <broker> <loadgen> <out-prefix> [extra args]: perf record of the generator.
set -u
B=$1; L=$2; P=$3; shift 3
PORT=7710; MPORT=9710; DATA=/tmp/gen/pdata
rm -rf $DATA; mkdir -p $DATA
taskset -c 0 "$B" serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 --data-dir $DATA \
  --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 > $P.broker.log 2>&1 &
bp=$!
for _ in $(seq 1 200); do [ -f $DATA/dev-cert.pem ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05; done
taskset -c 1 perf record -F 1999 --call-graph dwarf,32768 -o $P.perf.data -- "$L" run --addr 127.0.0.1:$PORT \
  --metrics 127.0.0.1:$MPORT --ca-file $DATA/dev-cert.pem --broker-pid $bp --label prof --warmup-s 1 \
  --quiet --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 \
  --batch-records 64 --ack durable --duration-s 3 --workers 1 --cpus 1 "$@" > $P.txt 2>&1
kill $bp; wait $bp 2>/dev/null; rm -rf $DATA
