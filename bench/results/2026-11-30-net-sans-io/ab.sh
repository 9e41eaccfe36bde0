#!/usr/bin/env bash
# A/B of net_felix_sink: before (parent of 2dfc93f) vs after, alternating, pinned like bench/net.sh.
set -uo pipefail
RUNS=${1:-3}; WARM=${2:-2}; MEAS=${3:-6}; CONNS=${CONNS:-4}
RAW=/tmp/nb/raw.jsonl; : > "$RAW"; port=47600
for run in $(seq 1 "$RUNS"); do
  for v in before after; do
    port=$((port+1)); addr=127.0.0.1:$port; work=$(mktemp -d)
    taskset -c 0 /tmp/nb/$v/net_felix_sink "$addr" "$work" "$WARM" "$MEAS" 0 > "$work/server.out" 2> "$work/server.err" &
    spid=$!
    for _ in $(seq 1 200); do grep -q READY "$work/server.out" 2>/dev/null && break; sleep 0.05; done
    load=$(cut -d' ' -f1 /proc/loadavg)
    taskset -c 1 /tmp/nb/before/net_upload quic "$addr" $((WARM+MEAS+2)) "$CONNS" > "$work/gen.out" 2> "$work/gen.err" &
    gpid=$!
    wait "$spid"; wait "$gpid"
    python3 - "$work/server.out" "$work/gen.out" "$run" "$v" "$load" >> "$RAW" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
g = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
print(json.dumps({"run": int(sys.argv[3]), "variant": sys.argv[4], "loadavg_1m": float(sys.argv[5]), **s, "generator_busy": g[-1]["generator_busy"] if g else None}))
PY
    tail -n1 "$RAW"; rm -rf "$work"
  done
done
python3 - "$RAW" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for v in ["before", "after"]:
    rs = [r for r in rows if r["variant"] == v]
    for k in ["datagrams_per_s", "cpu_us_per_datagram", "server_busy", "generator_busy", "loadavg_1m"]:
        xs = sorted(r[k] for r in rs)
        print(f"{v:6} {k:20} median {statistics.median(xs):12.3f}  min {xs[0]:12.3f}  max {xs[-1]:12.3f}  runs {[round(x,3) for x in xs]}")
PY
