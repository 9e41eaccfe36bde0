#!/usr/bin/env bash
# Storage benchmark (issue 3): durable appends of 64 x 4 KiB batches on one pinned core with
# 1, 4, 16 and 64 concurrent appenders; 1 vs 12 shards at the same offered load (16
# appenders); fio's fdatasync'd sequential write rate on the same file system in the same run.
# Every configuration runs RUNS times (default 3); data is wiped before every run and each run
# writes TOTAL_MIB (default 256) MiB, to stay clear of this VM's page-cache slowdown.
#
# Usage: bench/storage.sh   (env: RUNS, TOTAL_MIB, CPU, DATA, OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
TOTAL_MIB=${TOTAL_MIB:-256}
CPU=${CPU:-0}
DATA=${DATA:-$PWD/target/felix-storage-bench}
OUT=${OUT:-bench/results/$(date -u +%F)-storage}
mkdir -p "$OUT" "$(dirname "$DATA")"
command -v fio >/dev/null || apt-get install -y fio
cargo build --release -p felix-storage --example append_bench
BIN=target/release/examples/append_bench
{ echo "date: $(date -u +%FT%TZ)"; uname -r; nproc; uptime; df -hT "$(dirname "$DATA")"; fio --version; } > "$OUT/environment.txt"
: > "$OUT/runs.jsonl"
bench() { # kind appenders shards
  rm -rf "$DATA"; sync
  local line
  line=$(taskset -c "$CPU" "$BIN" --dir "$DATA" --cpu "$CPU" --appenders "$2" --shards "$3" --total-mib "$TOTAL_MIB")
  echo "{\"run\":$run,\"kind\":\"$1\",\"result\":$line}" | tee -a "$OUT/runs.jsonl"
}
for run in $(seq 1 "$RUNS"); do
  for n in 1 4 16 64; do bench appenders "$n" 1; done
  for s in 1 12; do bench shards 16 "$s"; done
  for bs in 256k 4m; do
    rm -rf "$DATA"; mkdir -p "$DATA"; sync
    taskset -c "$CPU" fio --name=seqsync --filename="$DATA/fio.dat" --rw=write --bs="$bs" \
      --size="${TOTAL_MIB}M" --direct=1 --fdatasync=1 --ioengine=sync --output-format=json \
      > "$OUT/fio-$bs-$run.json"
  done
  rm -rf "$DATA"
done
python3 - "$OUT" <<'PY'
import json, statistics, sys, glob, os
out = sys.argv[1]
runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl"))]
def agg(vals):
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
res = {"appenders": {}, "shards": {}, "fio": {}}
for n in (1, 4, 16, 64):
    rs = [r["result"] for r in runs if r["kind"] == "appenders" and r["result"]["appenders"] == n]
    res["appenders"][n] = {k: agg([r[k] for r in rs]) for k in
        ("mb_per_s", "fan_in_mean", "flush_p50_us", "flush_p99_us", "flushes_per_gib")}
for s in (1, 12):
    rs = [r["result"] for r in runs if r["kind"] == "shards" and r["result"]["shards"] == s]
    res["shards"][s] = {k: agg([r[k] for r in rs]) for k in ("mb_per_s", "flushes_per_gib", "fan_in_mean")}
for bs in ("256k", "4m"):
    bws = []
    for f in sorted(glob.glob(os.path.join(out, f"fio-{bs}-*.json"))):
        j = json.load(open(f))
        bws.append(j["jobs"][0]["write"]["bw_bytes"] / 1e6)
    res["fio"][bs] = {"mb_per_s": agg(bws)}
# Per-run ratios (log run i / fio run i): the disk's speed drifts between runs on this shared VM.
def fio_run(bs, run):
    j = json.load(open(os.path.join(out, f"fio-{bs}-{run}.json")))
    return j["jobs"][0]["write"]["bw_bytes"] / 1e6
per_run = {}
for bs in ("256k", "4m"):
    rs = [fr["result"]["mb_per_s"] / fio_run(bs, fr["run"]) for fr in runs
          if fr["kind"] == "appenders" and fr["result"]["appenders"] == 64]
    per_run[bs] = agg(rs)
res["per_run_ratio_64_appenders_vs_fio"] = per_run
fpg = {r["run"]: {} for r in runs}
for r in runs:
    if r["kind"] == "shards":
        fpg[r["run"]][r["result"]["shards"]] = r["result"]["flushes_per_gib"]
res["per_run_flushes_per_gib_12_vs_1"] = agg([v[12] / v[1] for v in fpg.values() if 1 in v and 12 in v])
res["ratio_64_appenders_vs_fio_256k"] = res["appenders"][64]["mb_per_s"]["median"] / res["fio"]["256k"]["mb_per_s"]["median"]
res["ratio_64_appenders_vs_fio_4m"] = res["appenders"][64]["mb_per_s"]["median"] / res["fio"]["4m"]["mb_per_s"]["median"]
res["flushes_per_gib_12_vs_1_shard"] = res["shards"][12]["flushes_per_gib"]["median"] / res["shards"][1]["flushes_per_gib"]["median"]
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=2)
f = lambda a: f'{a["median"]:.1f} ({a["min"]:.1f}-{a["max"]:.1f})'
lines = ["# Storage benchmark", "",
    "Median (min-max) of %d runs; one pinned core; durable appends of 64 x 4 KiB batches; MB = 10^6 bytes of batches stored (the log's own counter)." % res["appenders"][1]["mb_per_s"]["n"], "",
    "| appenders | MB/s | fan-in (appends/flush) | flush p50 us | flush p99 us | flushes/GiB |", "|---|---|---|---|---|---|"]
for n, r in res["appenders"].items():
    lines.append(f'| {n} | {f(r["mb_per_s"])} | {f(r["fan_in_mean"])} | {f(r["flush_p50_us"])} | {f(r["flush_p99_us"])} | {f(r["flushes_per_gib"])} |')
lines += ["", "| fio, direct, fdatasync after every write | MB/s |", "|---|---|"]
for bs, r in res["fio"].items():
    lines.append(f'| bs={bs} | {f(r["mb_per_s"])} |')
lines += ["", f'Ratio at 64 appenders vs fio bs=256k (the batch size): **{res["ratio_64_appenders_vs_fio_256k"]:.2f}**; vs fio bs=4m (larger than any write the log issues; fio at queue depth 1): {res["ratio_64_appenders_vs_fio_4m"]:.2f}.', "",
    f'Per-run ratios (log / fio of the same run), median (min-max): vs bs=256k {f(per_run["256k"])}; vs bs=4m {per_run["4m"]["median"]:.2f} ({per_run["4m"]["min"]:.2f}-{per_run["4m"]["max"]:.2f}).', "",
    "| 16 appenders | MB/s | flushes/GiB | fan-in |", "|---|---|---|---|"]
for s, r in res["shards"].items():
    lines.append(f'| {s} shard(s) | {f(r["mb_per_s"])} | {f(r["flushes_per_gib"])} | {f(r["fan_in_mean"])} |')
lines += ["", f'Flushes per GiB, 12 shards / 1 shard: **{res["flushes_per_gib_12_vs_1_shard"]:.2f}** (target <= 1.1).', ""]
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines))
print("\n".join(lines))
PY
