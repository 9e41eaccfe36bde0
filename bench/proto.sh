#!/usr/bin/env bash
# Codec benchmark: encode/decode a 64-record keyed batch at 256 B, 4 KiB and 64 KiB per record.
# Runs the criterion bench RUNS times pinned to one CPU and writes
# bench/results/<date>-proto/{results.json,summary.md}: median and spread of the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
CPU=${CPU:-1}
out="bench/results/$(date -u +%F)-proto"
mkdir -p "$out"
# Build once, then run the bench binary directly (no cargo lock while measuring).
bin=$(cargo bench -p felix-proto --bench codec --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="codec" and m.get("executable"): print(m["executable"])')
runs_json=()
for i in $(seq 1 "$RUNS"); do
  taskset -c "$CPU" "$bin" --bench --warm-up-time 1 --measurement-time 3 >"$out/run-$i.txt" 2>&1
  # criterion keeps the last run's estimates; copy the medians out.
  python3 - "$i" >"$out/run-$i.json" <<'PY'
import json, glob, os, sys
res = {}
for path in glob.glob("target/criterion/*/*/*/new/estimates.json"):
    parts = path.split(os.sep)
    group, op, size = parts[2], parts[3], parts[4]
    est = json.load(open(path))
    res[f"{group}/{op}/{size}"] = est["median"]["point_estimate"]
print(json.dumps(res))
PY
  runs_json+=("$out/run-$i.json")
done
python3 - "$out" "$(uptime)" "${runs_json[@]}" <<'PY'
import json, sys, statistics
out, load, files = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = [json.load(open(f)) for f in files]
records = 64
rows, result = [], {}
for key in sorted(runs[0]):
    ns = [r[key] for r in runs if key in r]
    med = statistics.median(ns)
    size = int(key.split("/")[-1])
    per_rec = med / records
    gbps = records * size / med  # bytes per ns = GB/s
    result[key] = {"runs_ns": ns, "median_ns": med, "ns_per_record": per_rec,
                   "payload_gb_per_s": gbps, "spread_pct": 100 * (max(ns) - min(ns)) / med}
    rows.append(f"| {key} | {med/1000:.2f} | {per_rec:.1f} | {gbps:.2f} | {100*(max(ns)-min(ns))/med:.1f} % |")
json.dump({"runs": len(runs), "load": load, "results": result}, open(f"{out}/results.json", "w"), indent=1)
with open(f"{out}/summary.md", "w") as f:
    f.write(f"# Codec benchmark ({len(runs)} runs, criterion medians; median of runs)\n\n")
    f.write(f"Machine load at the end: `{load.strip()}` (shared 2-vCPU VM, pinned to one CPU).\n\n")
    f.write("| bench/op/record bytes | µs per batch | ns per record | payload GB/s | spread (max-min)/median |\n|---|---|---|---|---|\n")
    f.write("\n".join(rows) + "\n")
print(open(f"{out}/summary.md").read())
PY
