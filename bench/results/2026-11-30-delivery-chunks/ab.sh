#!/usr/bin/env bash
# A/B of the subscription writer: `before` copies each frame into quinn's send buffer
# (SendStream::write_all), `after` hands quinn the frame's Bytes (write_all_chunks).
# Alternating per run, with ../2026-11-30-delivery/run.sh (mixed2: unthrottled durable
# keyed publish with 2 subscribers; catchup: 1 subscriber from earliest over a backlog).
#   ab.sh <runs>    expects /tmp/dab/{before,after}/{felix,felix-loadgen}
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RUNS=${1:-3}
for i in $(seq 1 "$RUNS"); do
  for v in before after; do
    tmp=$HERE/$v/tmp
    mkdir -p "$tmp"
    NICE=${NICE:--15} BACKLOG_S=${BACKLOG_S:-4} "$HERE/../2026-11-30-delivery/run.sh" /tmp/dab/$v "$tmp" 1 "mixed2 catchup"
    for f in "$tmp"/*; do
      b=$(basename "$f")
      mv "$f" "$HERE/$v/${b/run1/run$i}"
    done
    rmdir "$tmp"
  done
done
for v in before after; do
  python3 "$HERE/../2026-11-30-delivery/summarize.py" "$HERE/$v" "$v" > "$HERE/$v/summary.md"
done
