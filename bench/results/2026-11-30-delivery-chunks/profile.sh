#!/usr/bin/env bash
# One perf profile of the broker per variant during mixed2 (publish + 2 subscribers,
# unthrottled): the top symbols (flat), memmove's share among them.
#   profile.sh   expects /tmp/dab/{before,after}/{felix,felix-loadgen}
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=/tmp/felix-dab-prof
PORT=7961; MPORT=9961
for v in before after; do
  rm -rf "$DATA"; mkdir -p "$DATA"
  for _ in $(seq 1 100); do ss -uln | grep -q "127.0.0.1:$PORT " || break; sleep 0.1; done
  nice -n -15 taskset -c 0 /tmp/dab/$v/felix serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 \
    --data-dir "$DATA" --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 >"$DATA.log" 2>&1 &
  bp=$!
  for _ in $(seq 1 200); do
    [ -f "$DATA/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05
  done
  (sleep 2; perf record -F 999 -g -p "$bp" -o "$DATA.perf" -- sleep 4) >/dev/null 2>&1 &
  pp=$!
  nice -n -15 taskset -c 1 /tmp/dab/$v/felix-loadgen run --addr 127.0.0.1:$PORT \
    --metrics 127.0.0.1:$MPORT --ca-file "$DATA/dev-cert.pem" --broker-pid $bp --warmup-s 1 \
    --stream bench/dlv/s --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 \
    --ack durable --workers 1 --cpus 1 --workload mixed --subscribers 2 --duration-s 6 \
    --quiet >"$HERE/$v/profile-loadgen.txt" 2>&1 || true
  wait $pp || true
  kill $bp; wait $bp 2>/dev/null || true
  perf report -i "$DATA.perf" --no-children --sort symbol --stdio -g none 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | head -40 >"$HERE/$v/profile-top.txt" || true
  rm -rf "$DATA" "$DATA.perf" "$DATA.log"
done
