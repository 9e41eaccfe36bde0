#!/usr/bin/env bash
# Kernel-side io_uring latencies of the broker's fsync and write ops vs its own histograms.
set -euo pipefail
T=/work/main/target/release; D=/tmp/ut/data; rm -rf $D; mkdir -p $D
RATE=${RATE:-10000}
taskset -c 0 $T/felix serve --listen 127.0.0.1:47700 --cores 1 --cpus 0 --data-dir $D --metrics 127.0.0.1:47701 > /tmp/ut/broker.log 2>&1 &
bp=$!
for _ in $(seq 1 100); do [ -f $D/dev-cert.pem ] && curl -sf 127.0.0.1:47701/health >/dev/null && break; sleep 0.05; done
taskset -c 1 $T/felix-loadgen run --addr 127.0.0.1:47700 --metrics 127.0.0.1:47701 --ca-file $D/dev-cert.pem --broker-pid $bp \
  --warmup-s 1 --duration-s 4 --quiet --workload publish --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 \
  --batch-records 64 --ack durable --workers 1 --cpus 1 --rate $RATE --json /tmp/ut/r.json > /tmp/ut/lg.txt 2>&1 &
lp=$!
sleep 2
perf record -q -e io_uring:io_uring_submit_req -e io_uring:io_uring_complete -e io_uring:io_uring_queue_async_work -p $bp -o /tmp/ut/perf.data -- sleep 2 >/dev/null 2>&1
wait $lp
kill $bp; wait $bp || true
perf script -i /tmp/ut/perf.data -F tid,comm,time,event,trace > /tmp/ut/trace.txt 2>/dev/null
python3 - <<'PY'
import re, json, statistics
sub={}; lat={}
for l in open('/tmp/ut/trace.txt'):
    m=re.search(r'([\d.]+):\s+io_uring:(\w+):(.*)', l)
    if not m: continue
    t=float(m.group(1)); ev=m.group(2); rest=m.group(3)
    req=re.search(r'req (0x[0-9a-f]+)', rest)
    if not req: continue
    req=req.group(1)
    if ev=='io_uring_submit_req':
        op=re.search(r'opcode (\w+)', rest).group(1)
        sub[req]=(t,op)
    elif ev=='io_uring_complete' and req in sub:
        t0,op=sub.pop(req)
        lat.setdefault(op,[]).append((t-t0)*1e6)
for op,v in sorted(lat.items()):
    v.sort()
    if len(v)<20: continue
    print(f"{op:12s} n={len(v):6d} p50={v[len(v)//2]:8.0f} us p99={v[int(len(v)*0.99)]:8.0f} us")
r=json.load(open('/tmp/ut/r.json'))['broker']
print('broker window: ack p50/p99', r['ack_p50_us_per_core'], r['ack_p99_us_per_core'], 'flush p50/p99', r['flush_p50_us_per_core'], r['flush_p99_us_per_core'], 'write p99', r['write_p99_us_per_core'])
PY
