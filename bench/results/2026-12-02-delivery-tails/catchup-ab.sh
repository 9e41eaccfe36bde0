#!/usr/bin/env bash
# catchup-ab.sh <out> <labelA> <loadgenA> <labelB> <loadgenB> : RUNS alternating catch-up runs;
# the backlog is filled with loadgen A each time, the subscriber differs.
set -uo pipefail
OUT=$1; LA=$2; GA=$3; LB=$4; GB=$5; RUNS=${RUNS:-3}; FA=${FA:-/tmp/felix-A}; FB=${FB:-$FA}
D=/tmp/felix-cab; mkdir -p "$OUT" "$D"
for run in $(seq 1 "$RUNS"); do
  for side in A B; do
    if [ $side = A ]; then L=$LA; G=$GA; FELIX=$FA; else L=$LB; G=$GB; FELIX=$FB; fi
    rm -rf $D/data; mkdir -p $D/data; sync
    taskset -c 0 $FELIX serve --listen 127.0.0.1:7700 --cores 1 --cpus 0 --data-dir $D/data --metrics 127.0.0.1:9700 > $D/broker.log 2>&1 &
    bp=$!
    for _ in $(seq 1 200); do [ -f $D/data/dev-cert.pem ] && curl -sf 127.0.0.1:9700/health >/dev/null && break; sleep 0.05; done
    common="--addr 127.0.0.1:7700 --metrics 127.0.0.1:9700 --ca-file $D/data/dev-cert.pem --broker-pid $bp --max-udp-payload 1452 --quiet --stream bench/delivery/s --shards 12 --keys 12 --payload-bytes 4096 --ack durable --workers 1 --cpus 1"
    taskset -c 1 $GA run $common --warmup-s 1 --label fill --json $OUT/fill-$L-$run.json --workload publish --batch-records 64 --duration-s 3 --outstanding 8192 --in-flight-batches 256 > /dev/null 2>&1
    sync; echo 1 > /proc/sys/vm/drop_caches
    taskset -c 1 $G run $common --warmup-s 0 --label catchup --json $OUT/catchup-$L-$run.json --workload subscribe --subscribers 1 --subscribe-from earliest --publishers 0 --duration-s 5 > $OUT/catchup-$L-$run.txt 2>&1
    kill $bp; wait $bp 2>/dev/null
    python3 - $OUT/catchup-$L-$run.json $L <<'PY'
import json,sys
r=json.load(open(sys.argv[1])); t=[x.get('delivered_records') for x in r['timeline']]
full=[x for x in t if x][:-1] or [x for x in t if x]
print(sys.argv[2], 'delivered', r['delivered_records'], 'per s', t, 'rate MB/s %.0f' % (sum(full)/len(full)*4096/1e6), 'gen %.0f broker %.0f' % (r['generator_busy_pct'], r['broker_busy_pct']))
PY
  done
done
rm -rf $D
