#!/usr/bin/env bash
# bench/alloc-ab.sh: the `felix` and `felix-loadgen` binaries on the system allocator (glibc
# malloc) against mimalloc (their default build), side by side in one run, alternating per run
# (bench/ab.sh does the runs). Both sides switch together; each side's CPU per MB is reported
# on its own.
#
# Usage: bench/alloc-ab.sh                  (RUNS=5 DURATION=4 by default, see bench/ab.sh)
#        NO_BUILD=1 bench/alloc-ab.sh       (reuse the binaries in $WORK/bin)
#        PROFILE=1 bench/alloc-ab.sh        (also one `perf record` per variant, flat report)
# Writes bench/results/<date>-alloc/ (or $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${WORK:-/tmp/felix-alloc-ab}
OUT=${OUT:-bench/results/$(date +%F)-alloc}
mkdir -p "$WORK/bin"

if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release -q -p felix-broker --no-default-features --features cli
  cp target/release/felix "$WORK/bin/felix-system"
  cargo build --release -q -p felix-loadgen --no-default-features
  cp target/release/felix-loadgen "$WORK/bin/loadgen-system"
  cargo build --release -q -p felix-broker
  cp target/release/felix "$WORK/bin/felix-mimalloc"
  cargo build --release -q -p felix-loadgen
  cp target/release/felix-loadgen "$WORK/bin/loadgen-mimalloc"
fi

LOADGEN_A=$WORK/bin/loadgen-system LOADGEN_B=$WORK/bin/loadgen-mimalloc WORK=$WORK \
  bench/ab.sh system "$WORK/bin/felix-system" mimalloc "$WORK/bin/felix-mimalloc" \
  "$WORK/bin/loadgen-mimalloc" "$OUT"
