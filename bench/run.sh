#!/usr/bin/env bash
# The benchmark suite, end to end on this machine, with felix-loadgen (docs/loadgen.md).
#
#   bench/run.sh [runs=5] [duration_s=2] [soak_s=180]
#   SCENARIOS="publish nats" RES=/tmp/x bench/run.sh 1 2     (a smoke run of two scenarios)
# (2 s windows keep each run to a few hundred MB: this VM slows once the page cache grows.)
#
# Scenarios (each run: fresh broker and data dir, broker pinned to CPU $BROKER_CPU with
# --cores 1 --cpus $BROKER_CPU, generator pinned to CPU $GEN_CPU with taskset):
#   limits          fio fdatasync'd sequential write, 256 KiB and 1 MiB blocks (same file system
#                   as the broker's data),
#                   one core's AES-128-GCM seal+open at 1200 bytes (ring), loopback UDP with
#                   GSO/GRO on one core (bench's net_upload/net_udp_sink)
#   publish-1shard  durable keyed publish, 4 KiB records, 64 per batch, 12 keys, 1 shard, as
#                   fast as the generator can with $SATURATE (8192 records outstanding, 256
#                   batches in flight: with the generator's default 1024 the closed loop waits
#                   on fdatasync'd acks and neither side is saturated)
#   publish-12shards  the same on a 12-shard stream
#   publish-12shards-write-order  publish-12shards with the generator's QUIC streams sent one
#                   after another (`--send-in-write-order`) instead of round-robin
#   publish-12shards-jumbo  the same on a 9000-byte-MTU path ($JUMBO_UDP_PAYLOAD, broker and
#                   generator): what jumbo frames change
#   publish-12shards-fixedrate  the same at 10,000 records/s (latency without queueing)
#   publish-12shards-halfrate  the same at half of publish-12shards' median acked records/s
#                   (run after it, same date): latency at half load (issue 13, target 3)
#   delivery        does delivery keep up with ingest (12 shards, 4 KiB x 64, durable):
#                   mixed1 / mixed2 publish as fast as possible with 1 / 2 subscribers; half2
#                   publishes at half of mixed2's median published rate with 2 subscribers
#                   (publish-to-delivery latency at half load); catchup publishes $BACKLOG_S s
#                   with no subscriber, drops the page cache, then one subscriber reads it all
#                   from the earliest offset ($CATCHUP_S s window, no publisher); then fio
#                   reads the same log files (O_DIRECT, 1 MiB, 4 in flight, page cache dropped):
#                   the disk's sequential read rate beside the drain rate, run by run
#   nats            the peer row: NATS JetStream (Debian's nats-server, installed with apt-get
#                   when missing; JetStream on, its default file store under $DATA_ROOT, pinned
#                   to $BROKER_CPU), 4 KiB messages over 12 subjects from bench's nats_pub
#                   (async-nats, acks awaited, $NATS_IN_FLIGHT in flight) on $GEN_CPU; results in
#                   <date>-nats-jetstream/, its row beside Felix's in the publish tables
#   scaling         the saturated 12-shard publish on 1..N broker cores (N = CPUs found)
#   soak            a mixed publish+subscribe run at a fixed rate for soak_s seconds
# Profiles: after the measured runs of each saturated scenario (publish-1shard, publish-12shards,
# publish-12shards-write-order, publish-12shards-jumbo,
# nats) one more run, not counted in the figures, under `perf record -F $PERF_FREQ
# --call-graph $PERF_CALLGRAPH` on the broker's and the generator's pids for the measured
# window: flame-broker.svg and flame-generator.svg (folded and drawn with the inferno crate's
# inferno-collapse-perf and inferno-flamegraph, `cargo install`ed when missing),
# profile-broker.txt and profile-generator.txt (perf report's top symbols, self time), and
# profile.json (that run's figures). PROFILE=0 skips them; without perf, or where perf may not
# record, the script says so and goes on.
# Writes bench/results/<date>-<scenario>/ (run JSONs, SVG plots, profiles, summary.md) and
# bench/results/<date>-publish-suite/summary.md (all scenarios on one page; every publish row
# says MB per broker and per generator CPU-second and which side bound it). Data lives under
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
SCENARIOS=${SCENARIOS:-"limits publish halfrate delivery nats scaling soak"}
# The generator's window for the saturated rows (publish, scaling): deep enough that one
# generator core keeps one broker core busy.
SATURATE=${SATURATE:-"--outstanding 8192 --in-flight-batches 256"}
BACKLOG_S=${BACKLOG_S:-3}
CATCHUP_S=${CATCHUP_S:-5}
PORT=${PORT:-7600}
MPORT=${MPORT:-9600}
NATS_PORT=${NATS_PORT:-4622}
# Publishes awaiting their ack in the NATS row: the saturated Felix rows' 8192 records.
NATS_IN_FLIGHT=${NATS_IN_FLIGHT:-8192}
PROFILE=${PROFILE:-1}
# 499 Hz over a 2 s window is up to ~1000 samples per busy core; DWARF stacks (8 KiB each) because the
# release build keeps no frame pointers: a few MB of perf data, deleted after rendering.
PERF_FREQ=${PERF_FREQ:-499}
PERF_CALLGRAPH=${PERF_CALLGRAPH:-dwarf}
# A 1500-byte path (IPv4 + UDP headers off), not loopback's 64 KiB MTU: the path MTU discovery
# ceiling of the broker and the generator.
MAX_UDP_PAYLOAD=${MAX_UDP_PAYLOAD:-1452}
# The jumbo row's: a 9000-byte path.
JUMBO_UDP_PAYLOAD=${JUMBO_UDP_PAYLOAD:-8952}
DATE=$(date -u +%F)
T=target/release
RES=${RES:-bench/results}
NCPU=$(nproc)

echo "bench/run.sh: runs=$RUNS duration=${DURATION}s warmup=${WARMUP}s soak=${SOAK_S}s" \
  "broker_cpu=$BROKER_CPU gen_cpu=$GEN_CPU cpus=$NCPU data=$DATA_ROOT scenarios='$SCENARIOS'"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
# NO_BUILD=1 takes target/release as it is (a smoke test of the script while the tree is mid-edit).
HAVE_NET=1
if [ "${NO_BUILD:-0}" != 1 ]; then
  cargo build --release -p felix-broker -p felix-loadgen
  cargo build --release -p felix-bench --bin net_upload --bin net_udp_sink || HAVE_NET=0
fi
mkdir -p "$DATA_ROOT"
# fio: the limits scenario's disk rates and the catch-up's read rate.
command -v fio > /dev/null || apt-get install -y fio > /dev/null 2>&1 ||
  echo "fio not found and not installed: no disk rates"

# Profiling tools: perf (and the right to record), inferno's folder and renderer.
INFERNO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
PATH=$PATH:$INFERNO_BIN
HAVE_PERF=0
if [ "$PROFILE" = 1 ]; then
  if ! command -v perf > /dev/null; then
    echo "perf not found: no flame graphs (apt-get install linux-perf)"
  elif ! perf record -q -o "$DATA_ROOT/perf-probe.data" -- true > "$DATA_ROOT/perf-probe.log" 2>&1; then
    echo "perf may not record here (kernel.perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null)): no flame graphs"
    sed 's/^/  /' "$DATA_ROOT/perf-probe.log" | head -5
  elif ! command -v inferno-flamegraph > /dev/null && ! cargo install --locked inferno; then
    echo "inferno could not be installed: no flame graphs"
  else
    HAVE_PERF=1
  fi
  rm -f "$DATA_ROOT/perf-probe.data" "$DATA_ROOT/perf-probe.log"
fi

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
  taskset -c "$cpus" $T/felix serve --listen 127.0.0.1:"$PORT" --cores "$cores" --cpus "$cpus" \
    --data-dir "$DATA_ROOT/data" --metrics 127.0.0.1:"$MPORT" --max-udp-payload "$MAX_UDP_PAYLOAD" \
    > "$DATA_ROOT/broker.log" 2>&1 &
  broker_pid=$!
  for _ in $(seq 1 200); do
    if [ -f "$DATA_ROOT/data/dev-cert.pem" ] && curl -sf "127.0.0.1:$MPORT/health" > /dev/null; then
      return 0
    fi
    sleep 0.05
  done
  echo "broker did not start:"; cat "$DATA_ROOT/broker.log"; exit 1
}

# perf_callgraph broker|generator: the --call-graph mode for that side ($SERVER_CALLGRAPH: the
# broker's, where it differs).
perf_callgraph() {
  if [ "$1" = broker ]; then echo "${SERVER_CALLGRAPH:-$PERF_CALLGRAPH}"; else echo "$PERF_CALLGRAPH"; fi
}

# profile_window <generator pid>: when $PROFILE_DIR is set (this run is the profiled one),
# records the broker ($broker_pid) and the generator with perf over the measured window (after
# the warm-up) into $DATA_ROOT/perf-{broker,generator}.data, for render_profiles.
profile_window() {
  local gen_pid=$1
  [ -n "${PROFILE_DIR:-}" ] || return 0
  rm -f "$DATA_ROOT"/perf-*.data "$DATA_ROOT"/perf-*.data.old
  sleep "$WARMUP"
  local side pid ppids=()
  for side in broker generator; do
    if [ "$side" = broker ]; then pid=$broker_pid; else pid=$gen_pid; fi
    perf record -q -F "$PERF_FREQ" --call-graph "$(perf_callgraph "$side")" -p "$pid" \
      -o "$DATA_ROOT/perf-$side.data" -- sleep "$DURATION" > "$DATA_ROOT/perf-$side.log" 2>&1 &
    ppids+=($!)
  done
  for pid in "${ppids[@]}"; do wait "$pid" || true; done
}

# render_profiles <out dir> <title>: flame graphs and top-symbol lists from profile_window's data.
render_profiles() {
  local out=$1 title=$2 side
  for side in broker generator; do
    local data=$DATA_ROOT/perf-$side.data
    if [ ! -s "$data" ]; then
      echo "  no $side profile:"; sed 's/^/    /' "$DATA_ROOT/perf-$side.log" | head -5
      continue
    fi
    perf script -i "$data" 2> /dev/null | inferno-collapse-perf > "$DATA_ROOT/perf-$side.folded" &&
      inferno-flamegraph --title "$title: $side ($DATE, $(git rev-parse --short HEAD 2> /dev/null))" \
        "$DATA_ROOT/perf-$side.folded" > "$out/flame-$side.svg" ||
      echo "  flame graph of the $side failed"
    { echo "# $title, $side: perf record -F $PERF_FREQ --call-graph $(perf_callgraph "$side")," \
        "${DURATION}s window; self time per symbol"
      perf report -i "$data" --no-children -F overhead,sym --stdio -g none --percent-limit 0.2 \
        2> /dev/null | head -60 || true; } > "$out/profile-$side.txt"
    echo "  [$title] $side profile: $out/flame-$side.svg, top: $(grep -m1 -E '^ +[0-9.]+%' \
      "$out/profile-$side.txt" | tr -s ' ')"
    rm -f "$data" "$data.old" "$DATA_ROOT/perf-$side.folded" "$DATA_ROOT/perf-$side.log"
  done
}

# loadgen <gen cpus> <out json> <label> <args...>
loadgen() {
  local cpus=$1 json=$2 label=$3
  shift 3
  taskset -c "$cpus" $T/felix-loadgen run --addr 127.0.0.1:"$PORT" --metrics 127.0.0.1:"$MPORT" \
    --ca-file "$DATA_ROOT/data/dev-cert.pem" --broker-pid "$broker_pid" --label "$label" \
    --warmup-s "$WARMUP" --json "$json" --max-udp-payload "$MAX_UDP_PAYLOAD" --quiet "$@" \
    > "${json%.json}.txt" 2>&1 &
  local gen_pid=$!
  profile_window "$gen_pid"
  wait "$gen_pid" || { echo "loadgen failed ($label):"; tail -20 "${json%.json}.txt"; }
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
  # records/s (41 MB/s), whose latency is not the closed loop's queueing, then the saturated
  # 12 shards with the generator's streams sent in write order, and on a 9000-byte path.
  local spec
  local MAX_UDP_PAYLOAD=$MAX_UDP_PAYLOAD
  for spec in "publish-1shard 1 $SATURATE" "publish-12shards 12 $SATURATE" \
    "publish-12shards-fixedrate 12 --rate 10000" \
    "publish-12shards-write-order 12 $SATURATE --send-in-write-order" \
    "publish-12shards-jumbo 12 $SATURATE"; do
    # shellcheck disable=SC2086
    set -- $spec
    local name=$1 shards=$2
    shift 2
    [ "$name" = publish-12shards-jumbo ] && MAX_UDP_PAYLOAD=$JUMBO_UDP_PAYLOAD
    local out=$RES/$DATE-$name
    mkdir -p "$out"
    for run in $(seq 1 "$RUNS"); do
      start_broker 1 "$BROKER_CPU"
      loadgen "$GEN_CPU" "$out/run$run.json" "$name-run$run" --workload publish \
        --stream "bench/publish/s$shards" --shards "$shards" --keys 12 --payload-bytes 4096 \
        --batch-records 64 --ack durable --duration-s "$DURATION" --workers 1 --cpus "$GEN_CPU" \
        --plots "$out/plots-run$run" "$@"
      stop_broker
    done
    # The saturated rows get a profiled run of their own, outside the figures.
    if [ "$HAVE_PERF" = 1 ] && [ "$name" != publish-12shards-fixedrate ]; then
      start_broker 1 "$BROKER_CPU"
      PROFILE_DIR=$out loadgen "$GEN_CPU" "$out/profile.json" "$name-profile" --workload publish \
        --stream "bench/publish/s$shards" --shards "$shards" --keys 12 --payload-bytes 4096 \
        --batch-records 64 --ack durable --duration-s "$DURATION" --workers 1 --cpus "$GEN_CPU" "$@"
      stop_broker
      render_profiles "$out" "$name"
    fi
  done
}

# start_nats: a fresh nats-server with JetStream and its default file store under $DATA_ROOT,
# pinned to $BROKER_CPU (Go sizes GOMAXPROCS to the affinity: one thread runs Go code); its
# pid in $broker_pid, so stop_broker stops it.
start_nats() {
  rm -rf "$DATA_ROOT/nats"
  mkdir -p "$DATA_ROOT/nats"
  sync
  taskset -c "$BROKER_CPU" nats-server -js -sd "$DATA_ROOT/nats" -a 127.0.0.1 -p "$NATS_PORT" \
    > "$DATA_ROOT/nats.log" 2>&1 &
  broker_pid=$!
  for _ in $(seq 1 200); do
    grep -q "Server is ready" "$DATA_ROOT/nats.log" && return 0
    sleep 0.05
  done
  echo "nats-server did not start:"; cat "$DATA_ROOT/nats.log"; exit 1
}

# nats_pub <out json> <label>: the peer row's publisher, pinned to $GEN_CPU.
nats_pub() {
  local json=$1 label=$2
  taskset -c "$GEN_CPU" $T/nats_pub --server 127.0.0.1:"$NATS_PORT" --server-pid "$broker_pid" \
    --subjects 12 --payload-bytes 4096 --in-flight "$NATS_IN_FLIGHT" --warmup-s "$WARMUP" \
    --duration-s "$DURATION" --label "$label" --json "$json" > "${json%.json}.txt" 2>&1 &
  local gen_pid=$!
  profile_window "$gen_pid"
  wait "$gen_pid" || { echo "nats_pub failed ($label):"; tail -20 "${json%.json}.txt"; }
  grep -E "^nats_pub" "${json%.json}.txt" | sed "s/^/  [$label] /" || true
  nats-server --version > "${json%.json}.server.txt" 2>&1 || true
}

scenario_nats() {
  if ! command -v nats-server > /dev/null; then
    echo "nats-server missing: installing Debian's package"
    if [ "$(id -u)" != 0 ] || ! { apt-get update -qq && apt-get install -y -qq nats-server; } \
      > "$DATA_ROOT/apt.log" 2>&1; then
      echo "could not install nats-server (see $DATA_ROOT/apt.log): no peer row"; return 0
    fi
  fi
  if [ "${NO_BUILD:-0}" != 1 ] && ! cargo build --release -p felix-bench --bin nats_pub; then
    echo "nats_pub did not build: no peer row"; return 0
  fi
  local out=$RES/$DATE-nats-jetstream
  mkdir -p "$out"
  for run in $(seq 1 "$RUNS"); do
    start_nats
    nats_pub "$out/run$run.json" "nats-run$run"
    stop_broker
  done
  if [ "$HAVE_PERF" = 1 ]; then
    start_nats
    # Go keeps frame pointers (and DWARF unwinding of its stacks dropped most samples here).
    PROFILE_DIR=$out SERVER_CALLGRAPH=fp nats_pub "$out/profile.json" nats-profile
    stop_broker
    SERVER_CALLGRAPH=fp render_profiles "$out" nats-jetstream
  fi
  rm -rf "$DATA_ROOT/nats"
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
        --cpus "$gcpus" $SATURATE
      stop_broker
    done
  done
}

# The 12-shard publish at half of publish-12shards' median acked records/s, as the fixed-rate
# row is run: latency at half load.
scenario_halfrate() {
  local sat=$RES/$DATE-publish-12shards out=$RES/$DATE-publish-12shards-halfrate half run
  half=$(python3 -c 'import glob, json, statistics, sys
runs = [json.load(open(p)) for p in glob.glob(sys.argv[1] + "/run*.json")]
rates = [r["acked_records"] / r["measured_s"] for r in runs if r.get("acked_records")]
print(int(statistics.median(rates) / 2) if rates else "")' "$sat")
  if [ -z "$half" ]; then
    echo "  no publish-12shards runs of $DATE under $RES: run the publish scenario first"; return 0
  fi
  echo "  half load: $half records/s (half of publish-12shards' median acked rate)"
  mkdir -p "$out"
  for run in $(seq 1 "$RUNS"); do
    start_broker 1 "$BROKER_CPU"
    loadgen "$GEN_CPU" "$out/run$run.json" "publish-12shards-halfrate-run$run" --workload publish \
      --stream bench/publish/s12 --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 \
      --ack durable --duration-s "$DURATION" --workers 1 --cpus "$GEN_CPU" \
      --plots "$out/plots-run$run" --rate "$half"
    stop_broker
  done
}

# delivery_run <out json> <label> <loadgen args...>: one delivery run on a fresh broker.
delivery_run() {
  local json=$1 label=$2
  shift 2
  start_broker 1 "$BROKER_CPU"
  loadgen "$GEN_CPU" "$json" "$label" --stream bench/delivery/s --shards 12 --keys 12 \
    --payload-bytes 4096 --batch-records 64 --ack durable --workers 1 --cpus "$GEN_CPU" "$@"
  stop_broker
}

scenario_delivery() {
  local out=$RES/$DATE-delivery run
  mkdir -p "$out"
  for run in $(seq 1 "$RUNS"); do
    delivery_run "$out/mixed1-run$run.json" "mixed1-run$run" --workload mixed --subscribers 1 \
      --duration-s "$DURATION"
  done
  for run in $(seq 1 "$RUNS"); do
    delivery_run "$out/mixed2-run$run.json" "mixed2-run$run" --workload mixed --subscribers 2 \
      --duration-s "$DURATION"
  done
  local half
  half=$(python3 -c 'import glob, json, statistics, sys
rates = [j["sent_records"] / j["measured_s"] for j in map(lambda p: json.load(open(p)), glob.glob(sys.argv[1] + "/mixed2-run*.json"))]
print(max(100, int(statistics.median(rates) / 2)) if rates else 10000)' "$out")
  echo "  half load: $half records/s (half of mixed2's median published rate)"
  for run in $(seq 1 "$RUNS"); do
    delivery_run "$out/half2-run$run.json" "half2-run$run" --workload mixed --subscribers 2 \
      --rate "$half" --duration-s "$DURATION"
  done
  for run in $(seq 1 "$RUNS"); do
    start_broker 1 "$BROKER_CPU"
    loadgen "$GEN_CPU" "$out/catchup-fill-run$run.json" "catchup-fill-run$run" --workload publish \
      --stream bench/delivery/s --shards 12 --keys 12 --payload-bytes 4096 --batch-records 64 \
      --ack durable --workers 1 --cpus "$GEN_CPU" --duration-s "$BACKLOG_S" $SATURATE
    du -sb "$DATA_ROOT/data" | cut -f1 > "$out/catchup-run$run.du"
    # Read the disk, not the page cache that holds what was just written (where allowed).
    (sync; echo 1 > /proc/sys/vm/drop_caches && echo "page cache dropped" ||
      echo "page cache NOT dropped") >> "$out/catchup-run$run.du" 2>&1
    WARMUP=0 loadgen "$GEN_CPU" "$out/catchup-run$run.json" "catchup-run$run" --workload subscribe \
      --stream bench/delivery/s --shards 12 --keys 12 --payload-bytes 4096 --ack durable \
      --subscribers 1 --subscribe-from earliest --publishers 0 --workers 1 --cpus "$GEN_CPU" \
      --duration-s "$CATCHUP_S"
    stop_broker
    # The disk's own sequential read rate over the same log files, page cache dropped again:
    # fio, O_DIRECT, 1 MiB reads, 4 in flight, one file after the other.
    if command -v fio > /dev/null; then
      (sync; echo 1 > /proc/sys/vm/drop_caches) 2> /dev/null || true
      taskset -c "$BROKER_CPU" fio --name=seqread --opendir="$DATA_ROOT/data" --rw=read \
        --bs=1M --direct=1 --ioengine=io_uring --iodepth=4 --file_service_type=sequential \
        --output-format=json 2> /dev/null | sed -n '/^{/,$p' > "$out/catchup-run$run.fio.json" ||
        echo "  fio read failed (run $run)"
    fi
  done
}

scenario_soak() {
  local out=$RES/$DATE-soak
  mkdir -p "$out"
  start_broker 1 "$BROKER_CPU"
  # 2000 records/s of 4 KiB (8 MB/s) with 2 fanout subscribers; 512 MiB of size retention
  # keeps the disk bounded.
  loadgen "$GEN_CPU" "$out/soak.json" soak --workload mixed --soak --stream bench/soak/s \
    --shards 12 --retention-bytes $((512 << 20)) --keys 12 --payload-bytes 4096 \
    --batch-records 64 --ack durable --rate 2000 \
    --subscribers 2 --duration-s "$SOAK_S" --workers 1 --cpus "$GEN_CPU" --plots "$out/plots"
  stop_broker
}

for s in $SCENARIOS; do
  echo "== $s (load average $(cut -d' ' -f1-3 /proc/loadavg)) =="
  "scenario_$s"
done
rm -rf "$DATA_ROOT/data"
GIT_COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- broker storage proto client loadgen || echo '+uncommitted')" \
  KERNEL="$(uname -r)" NATS_IN_FLIGHT="$NATS_IN_FLIGHT" python3 bench/loadgen_summary.py "$RES" "$DATE" "$NCPU"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
