#!/usr/bin/env bash
# One perf profile of the broker during a catch-up (issue 13, target 5): publish BACKLOG_S
# seconds with no subscriber, drop the page cache, then one subscriber from earliest and no
# publisher; the broker is recorded for 4 s of the catch-up. Writes <out>/catchup-profile-top.txt
# (flat, top 50 symbols), catchup-profile-memmove.txt (memmove's callers, the first
# $CALLER_LINES lines, 60 by default) and the loadgen's report.
#   profile.sh <bin dir> <out dir>
set -euo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
DATA=${DATA:-/tmp/felix-cup}
PORT=${PORT:-7971}; MPORT=${MPORT:-9971}
BACKLOG_S=${BACKLOG_S:-5}
mkdir -p "$OUT"; rm -rf "$DATA"; mkdir -p "$DATA"
for _ in $(seq 1 100); do ss -uln | grep -q "127.0.0.1:$PORT " || break; sleep 0.1; done
nice -n -19 taskset -c 0 "$BIN/felix" serve --listen 127.0.0.1:$PORT --cores 1 --cpus 0 \
  --data-dir "$DATA" --metrics 127.0.0.1:$MPORT --max-udp-payload 1452 >"$DATA.log" 2>&1 &
bp=$!
trap 'kill $bp 2>/dev/null || true; wait $bp 2>/dev/null || true; rm -rf "$DATA" "$DATA.perf" "$DATA.log"' EXIT
for _ in $(seq 1 200); do
  [ -f "$DATA/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health >/dev/null && break; sleep 0.05
done
lg() {
  nice -n -19 taskset -c 1 "$BIN/felix-loadgen" run --addr 127.0.0.1:$PORT \
    --metrics 127.0.0.1:$MPORT --ca-file "$DATA/dev-cert.pem" --broker-pid $bp \
    --stream bench/cup/s --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 \
    --ack durable --workers 1 --cpus 1 "$@"
}
lg --workload publish --warmup-s 1 --duration-s "$BACKLOG_S" --quiet >"$OUT/catchup-fill.txt" 2>&1
du -sb "$DATA" >>"$OUT/catchup-fill.txt"
sync; echo 1 >/proc/sys/vm/drop_caches || true
# DWARF=1: call graphs through libc (memmove's callers), over a shorter window.
if [ "${DWARF:-0}" = 1 ]; then REC=(-F 499 --call-graph dwarf,16384); SECS=2; else REC=(-F 999 -g); SECS=4; fi
(sleep 0.5; perf record "${REC[@]}" -p "$bp" -o "$DATA.perf" -- sleep $SECS) >/dev/null 2>&1 &
pp=$!
lg --workload subscribe --subscribers 1 --subscribe-from earliest --publishers 0 --warmup-s 0 \
  --duration-s 5 >"$OUT/catchup-loadgen.txt" 2>&1 || true
wait $pp || true
perf report -i "$DATA.perf" --no-children --sort symbol --stdio -g none 2>/dev/null \
  | grep -v '^#' | grep -v '^$' | head -50 >"$OUT/catchup-profile-top.txt" || true
perf report -i "$DATA.perf" --no-children --sort dso --stdio -g none 2>/dev/null \
  | grep -v '^#' | grep -v '^$' | head -12 >"$OUT/catchup-profile-dso.txt" || true
# Who calls memmove (callers, by share of all samples).
perf report -i "$DATA.perf" --no-children --sort symbol --stdio -G -S __memmove_avx512_unaligned_erms \
  2>/dev/null | grep -v '^#' | grep -v '^$' | head -"${CALLER_LINES:-60}" >"$OUT/catchup-profile-memmove.txt" || true
