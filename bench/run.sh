#!/usr/bin/env bash
# The benchmark suite, end to end on this machine, with felix-loadgen (docs/loadgen.md).
#
#   bench/run.sh [runs=5] [duration_s=2] [soak_s=180]
# (2 s windows keep each run to a few hundred MB: this VM slows once the page cache grows.)
#
# Scenarios (each run: fresh broker and data dir, broker pinned to CPU $BROKER_CPU with
# --cores 1 --cpus $BROKER_CPU, generator pinned to CPU $GEN_CPU with taskset):
#   limits          fio fdatasync'd sequential write, 256 KiB and 1 MiB blocks (same file system
#                   as the broker's data),
#                   one core's AES-128-GCM seal+open at 1200 bytes (ring), loopback UDP with
#                   GSO/GRO on one core (bench's net_upload/net_udp_sink)
#   publish-1shard  durable keyed publish, 4 KiB records, 64 per batch, 12 keys, 1 shard
#   publish-12shards  the same on a 12-shard stream
#   publish-12shards-fixedrate  the same at 10,000 records/s (latency without queueing)
#   scaling         the 12-shard publish on 1..N broker cores (N = CPUs found)
#   soak            a mixed publish+subscribe run at a fixed rate for soak_s seconds
# Writes bench/results/<date>-<scenario>/ (run JSONs, SVG plots, summary.md) and
# bench/results/<date>-publish-suite/summary.md (all scenarios on one page). Data lives under
# $DATA_ROOT (wiped between runs).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-5}
DURATION=${2:-2}
SOAK_S=${3:-180}
WARMUP=${WARMUP:-1}
BROKER_CPU=${BROKER_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
DATA_ROOT=${DATA_ROOT:-/tmp/felix-bench}
SCENARIOS=${SCENARIOS:-"limits publish scaling soak"}
PORT=${PORT:-7600}
MPORT=${MPORT:-9600}
# A 1500-byte path (IPv4 + UDP headers off), not loopback's 64 KiB MTU. The client uses quinn's
# defaults (1200 initial, discovery up to 1452): the client crate has no hook for it.
MAX_UDP_PAYLOAD=${MAX_UDP_PAYLOAD:-1452}
DATE=$(date -u +%F)
T=target/release
RES=${RES:-bench/results}
NCPU=$(nproc)

echo "bench/run.sh: runs=$RUNS duration=${DURATION}s warmup=${WARMUP}s soak=${SOAK_S}s" \
  "broker_cpu=$BROKER_CPU gen_cpu=$GEN_CPU cpus=$NCPU data=$DATA_ROOT scenarios='$SCENARIOS'"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
cargo build --release -p felix-broker -p felix-loadgen
HAVE_NET=1
cargo build --release -p felix-bench --bin net_upload --bin net_udp_sink || HAVE_NET=0
mkdir -p "$DATA_ROOT"

broker_pid=""
stop_broker() {
  if [ -n "$broker_pid" ]; then
    kill "$broker_pid" 2>/dev/null || true
    wait "$broker_pid" 2>/dev/null || true
    broker_pid=""
  fi
}
trap stop_broker EXIT

# start_broker <cores> <cpu list>: fresh data dir, waits for /health.
start_broker() {
  local cores=$1 cpus=$2
  rm -rf "$DATA_ROOT/data"
  mkdir -p "$DATA_ROOT/data"
  sync
  taskset -c "$cpus" $T/felix serve --listen 127.0.0.1:$PORT --cores "$cores" --cpus "$cpus" \
    --data-dir "$DATA_ROOT/data" --metrics 127.0.0.1:$MPORT --max-udp-payload "$MAX_UDP_PAYLOAD" \
    > "$DATA_ROOT/broker.log" 2>&1 &
  broker_pid=$!
  for _ in $(seq 1 200); do
    if [ -f "$DATA_ROOT/data/dev-cert.pem" ] && curl -sf 127.0.0.1:$MPORT/health > /dev/null; then
      return 0
    fi
    sleep 0.05
  done
  echo "broker did not start:"; cat "$DATA_ROOT/broker.log"; exit 1
}

# loadgen <gen cpus> <out json> <label> <args...>
loadgen() {
  local cpus=$1 json=$2 label=$3
  shift 3
  taskset -c "$cpus" $T/felix-loadgen run --addr 127.0.0.1:$PORT --metrics 127.0.0.1:$MPORT \
    --ca-file "$DATA_ROOT/data/dev-cert.pem" --broker-pid "$broker_pid" --label "$label" \
    --warmup-s "$WARMUP" --json "$json" --quiet "$@" > "${json%.json}.txt" 2>&1 || {
      echo "loadgen failed ($label):"; tail -20 "${json%.json}.txt"; }
  grep -E "broker stored|generator CPU|WARNING" "${json%.json}.txt" | sed "s/^/  [$label] /"
  # The broker's own effective configuration, as evidence of what ran.
  grep -E "^felix" "$DATA_ROOT/broker.log" | head -8 > "${json%.json}.broker.txt" || true
}

scenario_limits() {
  local out=$RES/$DATE-limits
  mkdir -p "$out"
  : > "$out/raw.jsonl"
  for run in $(seq 1 "$RUNS"); do
    # Sequential writes with an fdatasync after each: the broker's group-commit pattern, at
    # 256 KiB and at 1 MiB (near the broker's bytes per flush under load).
    for bs in 256k 1m; do
      rm -rf "$DATA_ROOT/fio"; mkdir -p "$DATA_ROOT/fio"
      taskset -c "$BROKER_CPU" fio --name=seqsync --directory="$DATA_ROOT/fio" --rw=write \
        --bs=$bs --size=256M --fdatasync=1 --ioengine=sync --end_fsync=1 --output-format=json \
        > "$DATA_ROOT/fio.json"
      python3 - "$DATA_ROOT/fio.json" "$run" "$bs" >> "$out/raw.jsonl" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
w = j["write"]
sync = j.get("sync", {}).get("lat_ns", {})
print(json.dumps({"limit": "fio_fdatasync_seq_write_" + sys.argv[3], "run": int(sys.argv[2]),
                  "mb_s": w["bw_bytes"] / 1e6, "bs": sys.argv[3],
                  "fdatasync_p50_us": sync.get("percentile", {}).get("50.000000", 0) / 1000,
                  "fdatasync_mean_us": sync.get("mean", 0) / 1000}))
PY
    done
    rm -rf "$DATA_ROOT/fio"
    taskset -c "$GEN_CPU" $T/felix-loadgen aead --bytes 1200 --seconds 3 | tail -1 \
      | python3 -c "import json,sys; d=json.load(sys.stdin); d.update(limit='aes128gcm_seal_open_1200', run=$run, mb_s=d['seal_open_mb_s']); print(json.dumps(d))" \
      >> "$out/raw.jsonl"
    if [ "$HAVE_NET" = 1 ]; then
      local uport=$((PORT + 100 + run))
      taskset -c "$BROKER_CPU" $T/net_udp_sink 127.0.0.1:$uport 1 4 > "$DATA_ROOT/udp.out" 2>&1 &
      local spid=$!
      for _ in $(seq 1 100); do grep -q READY "$DATA_ROOT/udp.out" && break; sleep 0.05; done
      taskset -c "$GEN_CPU" $T/net_upload udp 127.0.0.1:$uport 7 > "$DATA_ROOT/udp_gen.out" 2>&1 &
      local gpid=$!
      wait "$spid" || true
      wait "$gpid" || true
      python3 - "$DATA_ROOT/udp.out" "$DATA_ROOT/udp_gen.out" "$run" >> "$out/raw.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
g = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
print(json.dumps({"limit": "udp_loopback_gso_gro_1200", "run": int(sys.argv[3]),
                  "mb_s": s["bytes"] / 1e6 / s["wall_s"],
                  "mb_per_cpu_s": 1200 / max(s["cpu_us_per_datagram"], 1e-9),
                  "sink_busy": s["server_busy"], "generator": g[-1] if g else None}))
PY
    fi
    echo "limits run $run: $(tail -4 "$out/raw.jsonl" | python3 -c "import json,sys; print(', '.join('%s %.0f MB/s' % (d['limit'], d['mb_s']) for d in map(json.loads, sys.stdin)))")"
  done
}

scenario_publish() {
  # name shards extra-args: saturated 1 and 12 shards, then 12 shards at a fixed 10,000
  # records/s (41 MB/s), whose latency is not the closed loop's queueing.
  local spec
  for spec in "publish-1shard 1" "publish-12shards 12" "publish-12shards-fixedrate 12 --rate 10000"; do
    # shellcheck disable=SC2086
    set -- $spec
    local name=$1 shards=$2
    shift 2
    local out=$RES/$DATE-$name
    mkdir -p "$out"
    for run in $(seq 1 "$RUNS"); do
      start_broker 1 "$BROKER_CPU"
      loadgen "$GEN_CPU" "$out/run$run.json" "$name-run$run" --workload publish \
        --stream bench/publish/s$shards --shards "$shards" --keys 12 --payload-bytes 4096 \
        --batch-records 64 --ack durable --duration-s "$DURATION" --workers 1 --cpus "$GEN_CPU" \
        --plots "$out/plots-run$run" "$@"
      stop_broker
    done
  done
}

scenario_scaling() {
  local out=$RES/$DATE-scaling
  mkdir -p "$out"
  for cores in $(seq 1 "$NCPU"); do
    local bcpus gcpus
    bcpus=$(seq -s, 0 $((cores - 1)))
    # With every CPU given to the broker the generator has to share them.
    if [ "$cores" -lt "$NCPU" ]; then gcpus=$(seq -s, "$cores" $((NCPU - 1))); else gcpus=$bcpus; fi
    local workers=$(( NCPU - cores > 0 ? NCPU - cores : 1 ))
    for run in $(seq 1 "$RUNS"); do
      start_broker "$cores" "$bcpus"
      loadgen "$gcpus" "$out/cores$cores-run$run.json" "scaling-cores$cores-run$run" \
        --workload publish --stream bench/scaling/s --shards 12 --keys 12 --payload-bytes 4096 \
        --batch-records 64 --ack durable --duration-s "$DURATION" --workers "$workers" \
        --cpus "$gcpus"
      stop_broker
    done
  done
}

scenario_soak() {
  local out=$RES/$DATE-soak
  mkdir -p "$out"
  start_broker 1 "$BROKER_CPU"
  # 2000 records/s of 4 KiB (8 MB/s) with 2 fanout subscribers; retention keeps the disk bounded.
  loadgen "$GEN_CPU" "$out/soak.json" soak --workload mixed --soak --stream bench/soak/s \
    --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 --ack durable --rate 2000 \
    --subscribers 2 --duration-s "$SOAK_S" --workers 1 --cpus "$GEN_CPU" --plots "$out/plots"
  stop_broker
}

for s in $SCENARIOS; do
  echo "== $s (load average $(cut -d' ' -f1-3 /proc/loadavg)) =="
  "scenario_$s"
done
rm -rf "$DATA_ROOT/data"
GIT_COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- broker storage proto client loadgen || echo '+uncommitted')" \
  KERNEL="$(uname -r)" python3 bench/loadgen_summary.py "$RES" "$DATE" "$NCPU"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
