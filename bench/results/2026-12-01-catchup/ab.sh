#!/usr/bin/env bash
# Alternating A/B of two brokers on the delivery scenarios (issue 13, target 5), the same
# felix-loadgen for both: ab.sh <runs> <dirA> <dirB> <out> [scenarios]
# Each dir holds felix and felix-loadgen; runs ../2026-11-30-delivery/run.sh once per scenario
# and variant, alternating, so both variants see the same stretch of a noisy machine.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
RUNS=${1:?runs}; A=${2:?dir A}; B=${3:?dir B}; OUT=${4:?out}
SCEN=${5:-"catchup mixed2"}
for r in $(seq 1 "$RUNS"); do
  for v in A B; do
    dir=$A; [ $v = B ] && dir=$B
    for s in $SCEN; do
      mkdir -p "$OUT/$v"
      bash "$HERE/../2026-11-30-delivery/run.sh" "$dir" "$OUT/$v/tmp" 1 "$s" >/dev/null
      for f in "$OUT/$v/tmp/"*; do
        b=$(basename "$f"); mv "$f" "$OUT/$v/${b/run1/run$r}"
      done
    done
  done
done
rmdir "$OUT/A/tmp" "$OUT/B/tmp" 2>/dev/null || true
