#!/usr/bin/env bash
# Network benchmark: one pinned core receiving a bulk upload of 1200-byte QUIC datagrams.
#
# For each run and each server kind -- felix (the per-core glommio + quinn-proto driver, one
# core), quinn (a plain quinn/tokio current-thread server doing the same sink work), udp (a raw
# recvmmsg + GRO sink: the limit) -- the server is pinned to CPU $SERVER_CPU and the generator
# (bench/src/bin/net_upload.rs) to CPU $GEN_CPU. Each server measures itself over a window
# after a warm-up: datagrams received (its own counters), bytes read, and process CPU time
# (utime + stime, /proc/self/stat). The generator reports its own CPU share, so a run whose
# generator was the bottleneck (> 80% busy) is flagged.
#
# Usage: [CONNS=4] [SUBDIR=name] bench/net.sh [runs=3] [warmup_s=2] [measure_s=6]
# Writes bench/results/<date>-net[/SUBDIR]/{raw.jsonl,results.json,summary.md}.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-3}
WARM=${2:-2}
MEAS=${3:-6}
CONNS=${CONNS:-4}
SERVER_CPU=${SERVER_CPU:-0}
GEN_CPU=${GEN_CPU:-1}

cargo build --release -p felix-bench --bins
T=target/release
OUT=bench/results/$(date -u +%F)-net${SUBDIR:+/$SUBDIR}
mkdir -p "$OUT"
RAW=$OUT/raw.jsonl
: > "$RAW"
port=47200

for run in $(seq 1 "$RUNS"); do
  for kind in felix quinn udp; do
    port=$((port + 1))
    addr=127.0.0.1:$port
    work=$(mktemp -d)
    case $kind in
      felix) taskset -c "$SERVER_CPU" $T/net_felix_sink "$addr" "$work" "$WARM" "$MEAS" "$SERVER_CPU" \
               > "$work/server.out" 2> "$work/server.err" & ;;
      quinn) taskset -c "$SERVER_CPU" $T/net_quinn_sink "$addr" "$WARM" "$MEAS" \
               > "$work/server.out" 2> "$work/server.err" & ;;
      udp)   taskset -c "$SERVER_CPU" $T/net_udp_sink "$addr" "$WARM" "$MEAS" \
               > "$work/server.out" 2> "$work/server.err" & ;;
    esac
    spid=$!
    for _ in $(seq 1 200); do
      grep -q READY "$work/server.out" 2>/dev/null && break
      sleep 0.05
    done
    mode=quic
    [ "$kind" = udp ] && mode=udp
    load_before=$(cut -d' ' -f1 /proc/loadavg)
    taskset -c "$GEN_CPU" $T/net_upload "$mode" "$addr" $((WARM + MEAS + 2)) "$CONNS" \
      > "$work/gen.out" 2> "$work/gen.err" &
    gpid=$!
    wait "$spid" || { echo "server $kind failed:"; cat "$work/server.err"; exit 1; }
    wait "$gpid" || true
    python3 - "$work/server.out" "$work/gen.out" "$run" "$kind" "$load_before" >> "$RAW" <<'PY'
import json, sys
server = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
gen = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
row = {"run": int(sys.argv[3]), "kind": sys.argv[4], "loadavg_1m": float(sys.argv[5]), **server}
if gen:
    row["generator_busy"] = gen[-1]["generator_busy"]
print(json.dumps(row))
PY
    tail -n1 "$RAW"
    rm -rf "$work"
  done
done

python3 - "$RAW" "$OUT" "$RUNS" "$WARM" "$MEAS" "$CONNS" "$SERVER_CPU" "$GEN_CPU" <<'PY'
import json, statistics, sys, platform, subprocess
raw, out = sys.argv[1], sys.argv[2]
runs, warm, meas, conns, scpu, gcpu = sys.argv[3:9]
rows = [json.loads(l) for l in open(raw)]
kinds = ["felix", "quinn", "udp"]
summary = {}
for k in kinds:
    rs = [r for r in rows if r["kind"] == k]
    def stat(key):
        v = sorted(r[key] for r in rs)
        return {"median": statistics.median(v), "min": v[0], "max": v[-1], "runs": v}
    summary[k] = {
        "datagrams_per_s": stat("datagrams_per_s"),
        "cpu_us_per_datagram": stat("cpu_us_per_datagram"),
        "server_busy": stat("server_busy"),
        "generator_busy": stat("generator_busy"),
        "loadavg_1m": stat("loadavg_1m"),
    }
meta = {
    "runs": int(runs), "warmup_s": float(warm), "measure_s": float(meas), "quic_connections": int(conns),
    "server_cpu": int(scpu), "generator_cpu": int(gcpu), "datagram_bytes": 1200,
    "kernel": platform.release(),
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
}
json.dump({"meta": meta, "summary": summary, "rows": rows}, open(f"{out}/results.json", "w"), indent=2)
f = summary
lines = [
    "# Network benchmark: one core receiving a 1200-byte-datagram bulk upload",
    "",
    f"`bench/net.sh {runs} {warm} {meas}` at commit {meta['commit']}, kernel {meta['kernel']}: server pinned to CPU {scpu},",
    f"generator (quinn client, {conns} connections, one unidirectional stream each; raw GSO sender for `udp`) pinned to CPU {gcpu};",
    f"{runs} runs per server, each measured over {meas} s after {warm} s of warm-up. CPU = utime + stime of the server process.",
    "",
    "| server | datagrams/s median (min-max) | CPU us/datagram median (min-max) | server busy | generator busy |",
    "|---|---|---|---|---|",
]
for k in kinds:
    s = f[k]
    d, c, sb, gb = s["datagrams_per_s"], s["cpu_us_per_datagram"], s["server_busy"], s["generator_busy"]
    lines.append(f"| {k} | {d['median']:,.0f} ({d['min']:,.0f}-{d['max']:,.0f}) | {c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f}) | {sb['median']:.0%} | {gb['median']:.0%} |")
lines.append("")
fc, qc = f["felix"]["cpu_us_per_datagram"]["median"], f["quinn"]["cpu_us_per_datagram"]["median"]
lines.append(f"Felix vs quinn, CPU per datagram: {fc:.2f} us vs {qc:.2f} us ({fc/qc:.2f}x). Target (issue 13): <= 1.5 us and below quinn: "
             f"{'met' if fc <= 1.5 and fc < qc else 'NOT met'}.")
busy_gen = [k for k in kinds if f[k]["generator_busy"]["median"] > 0.8]
if busy_gen:
    lines.append(f"Generator above 80% busy for: {', '.join(busy_gen)} -- those rates measure the generator, not the server.")
else:
    lines.append("No generator was above 80% busy.")
not_saturated = [k for k in kinds if f[k]["server_busy"]["median"] < 0.9]
if not_saturated:
    lines.append(f"Server below 90% busy for: {', '.join(not_saturated)} -- their datagrams/s is the offered load, not their capacity; "
                 "CPU per datagram is the comparable figure.")
loads = [r["loadavg_1m"] for r in rows]
lines.append(f"Machine load average during the runs: {min(loads):.1f}-{max(loads):.1f} on 2 CPUs (other work was running on this shared machine).")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
