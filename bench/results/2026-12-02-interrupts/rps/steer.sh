#!/usr/bin/env bash
# alternate saturated runs with kernel steering off / on
set -u
cd /work/main
BIN=target/release/felix; LG=target/release/felix-loadgen
OUT=${OUT:-/tmp/prof/steer}; mkdir -p $OUT; RUNS=${RUNS:-4}
set_steer() {
  if [ "$1" = on ]; then
    echo $RPSMASK > /sys/class/net/lo/queues/rx-0/rps_cpus
  else
    echo 0 > /sys/class/net/lo/queues/rx-0/rps_cpus
    echo 0 > /sys/class/net/lo/queues/rx-0/rps_flow_cnt
    echo 0 > /proc/sys/net/core/rps_sock_flow_entries
  fi
}
one() {
  local label=$1; shift; data=/tmp/prof/data; rm -rf $data; mkdir -p $data
  PORT=7730; MPORT=9730
  nice -n -15 taskset -c $BC $BIN serve --listen 127.0.0.1:$PORT --cores 1 --cpus $BC --data-dir $data --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 --min-free-bytes 0 >$OUT/$label.broker.log 2>&1 &
  bp=$!
  for _ in $(seq 1 200); do [ -f $data/dev-cert.pem ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05; done
  grep -E "^ *36:" /proc/interrupts > $OUT/$label.irq0
  nice -n -15 taskset -c $GC $LG run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT --ca-file $data/dev-cert.pem --broker-pid $bp --label $label --warmup-s 1 --json $OUT/$label.json --quiet --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --duration-s 4 --workers 1 --cpus $GC --max-udp-payload 1452 "$@" > $OUT/$label.txt 2>&1
  grep -E "^ *36:" /proc/interrupts > $OUT/$label.irq1
  kill $bp; wait $bp; rm -rf $data
}
trap 'set_steer off' EXIT
for r in $(seq 1 $RUNS); do
  for s in base swaprps rps; do
    case $s in base) BC=0; GC=1; set_steer off;; swaprps) BC=1; GC=0; RPSMASK=2; set_steer on;; rps) BC=0; GC=1; RPSMASK=1; set_steer on;; esac
    one sat-$s-$r --outstanding 8192 --in-flight-batches 256; done
done
set_steer off
python3 - $OUT $RUNS <<'PY'
import json,sys,statistics as st
out,runs=sys.argv[1],int(sys.argv[2])
for s in ("base","swaprps","rps"):
    rs=[json.load(open(f"{out}/sat-{s}-{i}.json")) for i in range(1,runs+1)]
    def f(k): 
        v=[r.get(k) for r in rs]; return f"{st.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
    print(s, "stored", f("stored_mb_s"), "mb/broker-cpu", f("stored_mb_per_broker_cpu_s"), "mb/gen-cpu", f("stored_mb_per_generator_cpu_s"), "broker busy", f("broker_busy_pct"), "gen busy", f("generator_busy_pct"))
PY
