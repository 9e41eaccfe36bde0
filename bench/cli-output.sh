#!/usr/bin/env bash
# CLI output benchmark (issue 47): how fast `felix subscribe` prints records into a pipe, and
# how fast `felix publish --json` prints its acks into one, for 100-byte records.
#
# One broker (`--cores 1`) pinned to CPU $BROKER_CPU; each command, and the `wc -l` reading
# its pipe, pinned to CPU $CLI_CPU. Per run:
#   publish        `felix publish -q < input`          (acks awaited, nothing printed: the reference)
#   publish_json   `felix publish --json < input | wc -l` (one JSON line per ack)
#   subscribe      `felix subscribe -o earliest --exit-at-end | wc -l` (the records just published)
#   subscribe_json the same with --json
# Each is timed end to end (start of the process to its exit: connect included) and the line
# count checked. Records/s = records / seconds; median and spread (min-max) over the runs.
#
# Usage: [RECORDS=1000000] [ACK=written] bench/cli-output.sh [runs=3]
# Writes bench/results/2026-12-04-cli/{raw.jsonl,results.json,summary.md} (OUT= to change).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-3}
RECORDS=${RECORDS:-1000000}
ACK=${ACK:-written}
BROKER_CPU=${BROKER_CPU:-0}
CLI_CPU=${CLI_CPU:-1}
OUT=${OUT:-bench/results/2026-12-04-cli}

cargo build --release -p felix-broker --bin felix
F=$PWD/target/release/felix
mkdir -p "$OUT"
RAW=$OUT/raw.jsonl
: > "$RAW"
work=$(mktemp -d)
broker_pid=
cleanup() {
  [ -n "$broker_pid" ] && kill "$broker_pid" 2> /dev/null && wait "$broker_pid" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# 100-byte values: a 9-digit sequence number and 91 bytes of filler.
python3 - "$RECORDS" > "$work/input" << 'EOF'
import sys
filler = "x" * 91
out = sys.stdout
for i in range(int(sys.argv[1])):
    out.write(f"{i:09d}{filler}\n")
EOF

addr=127.0.0.1:47400
taskset -c "$BROKER_CPU" "$F" serve --listen "$addr" --cores 1 --no-pin --metrics off \
  --data-dir "$work/data" > "$work/broker.log" 2>&1 &
broker_pid=$!
export FELIX_ADDR=$addr FELIX_CA_FILE=$work/data/dev-cert.pem
for _ in $(seq 1 100); do
  [ -f "$FELIX_CA_FILE" ] && "$F" streams list > /dev/null 2>&1 && break
  sleep 0.1
done

cli() { taskset -c "$CLI_CPU" "$F" "$@"; }

# Runs "$@" (a pipeline ending in `wc -l`), checks the count, appends a raw line.
measure() {
  local run=$1 what=$2 stream=$3
  shift 3
  local t0 t1 lines
  t0=$EPOCHREALTIME
  lines=$("$@")
  t1=$EPOCHREALTIME
  if [ "$lines" != "$RECORDS" ]; then
    echo "$what run $run: $lines lines, expected $RECORDS" >&2
    exit 1
  fi
  python3 -c "
import json, sys
t0, t1, n = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
print(json.dumps({'run': int(sys.argv[4]), 'what': sys.argv[5], 'stream': sys.argv[6],
                  'records': n, 'seconds': round(t1 - t0, 4), 'records_per_s': round(n / (t1 - t0))}))
" "$t0" "$t1" "$lines" "$run" "$what" "$stream" | tee -a "$RAW"
}

for run in $(seq 1 "$RUNS"); do
  a=bench/cli/plain-$run
  b=bench/cli/json-$run
  cli streams create -s "$a" --shards 1 > /dev/null
  cli streams create -s "$b" --shards 1 > /dev/null
  measure "$run" publish "$a" \
    bash -c "taskset -c $CLI_CPU $F publish -s $a --ack $ACK -q < $work/input && echo $RECORDS"
  measure "$run" publish_json "$b" \
    bash -c "taskset -c $CLI_CPU $F publish -s $b --ack $ACK --json -q < $work/input | taskset -c $CLI_CPU wc -l"
  measure "$run" subscribe "$a" \
    bash -c "taskset -c $CLI_CPU $F subscribe -s $a -o earliest --exit-at-end | taskset -c $CLI_CPU wc -l"
  measure "$run" subscribe_json "$a" \
    bash -c "taskset -c $CLI_CPU $F subscribe -s $a -o earliest --exit-at-end --json | taskset -c $CLI_CPU wc -l"
done

python3 - "$RAW" "$OUT" "$RECORDS" "$ACK" "$(git rev-parse --short HEAD)" "$(nproc)" << 'EOF'
import json, statistics, sys
raw, out, records, ack, commit, cpus = sys.argv[1:7]
rows = [json.loads(l) for l in open(raw)]
results = {}
for what in ["publish", "publish_json", "subscribe", "subscribe_json"]:
    rates = sorted(r["records_per_s"] for r in rows if r["what"] == what)
    if rates:
        results[what] = {"runs": len(rates), "median_records_per_s": statistics.median(rates),
                         "min": rates[0], "max": rates[-1]}
meta = {"commit": commit, "records": int(records), "record_bytes": 100, "ack": ack,
        "host_cpus": int(cpus), "broker_cores": 1}
json.dump({"meta": meta, "results": results}, open(f"{out}/results.json", "w"), indent=2)
with open(f"{out}/summary.md", "w") as f:
    f.write(f"# CLI output into a pipe ({commit})\n\n")
    f.write(f"{records} records of 100 bytes, `--ack {ack}`, broker (`--cores 1`) and CLI on "
            f"different CPUs (taskset), {cpus} CPUs in all; end to end, connect included. "
            f"Before issue 47 (a `write` per record) subscribe printed about 60,000 records/s "
            f"and publish --json 200,000 lines took 7.8 s (the issue's figures).\n\n")
    f.write("| command | runs | median records/s | min | max |\n|---|---|---|---|---|\n")
    for what, r in results.items():
        f.write(f"| {what} | {r['runs']} | {r['median_records_per_s']:,.0f} | {r['min']:,} "
                f"| {r['max']:,} |\n")
print(open(f"{out}/summary.md").read())
EOF
