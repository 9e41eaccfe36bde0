#!/usr/bin/env python3
"""Summarise the delivery runs: summarize.py <dir> [label] -> markdown table on stdout.

Per scenario: median and min-max over runs of published and delivered records/s (delivered per
subscriber), delivered MB/s, publish-to-delivery p50/p99, broker and generator CPU, load average.
"""
import glob, json, os, re, statistics, sys

d = sys.argv[1]
label = sys.argv[2] if len(sys.argv) > 2 else d

def med(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = statistics.median(xs)
    f = (lambda v: f"{v:,.0f}") if m >= 100 else (lambda v: f"{v:.2f}" if m < 10 else f"{v:.1f}")
    return f"{f(m)} ({f(min(xs))}-{f(max(xs))})"

print(f"### {label}\n")
print("| scenario | runs | published rec/s | delivered rec/s per subscriber | delivered MB/s per subscriber | delivery p50 ms | delivery p99 ms | broker CPU % | generator CPU % | delivered MB per broker CPU-s | load avg 1m (start-end) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for s in ["mixed1", "mixed2", "half2", "catchup"]:
    files = sorted(glob.glob(os.path.join(d, f"{s}-run*.json")))
    if not files:
        continue
    rows = [json.load(open(f)) for f in files]
    subs = [r["config"].get("subscribers_per_worker") or r["config"].get("subscribers") or 1 for r in rows]
    pub = [r["sent_records"] / r["measured_s"] for r in rows]
    dl = [r["delivered_records"] / r["measured_s"] / n for r, n in zip(rows, subs)]
    dmb = [r["delivered_bytes"] / 1e6 / r["measured_s"] / n for r, n in zip(rows, subs)]
    p50 = [r["delivery"]["p50_us"] / 1000 for r in rows]
    p99 = [r["delivery"]["p99_us"] / 1000 for r in rows]
    bcpu = [r["broker"].get("cpu_pct") for r in rows]
    gcpu = [r.get("generator_cpu_pct") for r in rows]
    # All subscribers' bytes over the broker's CPU seconds in the window.
    eff = [r["delivered_bytes"] / 1e6 / r["broker"]["cpu_s"] if r["broker"].get("cpu_s") else 0 for r in rows]
    la = ", ".join(f"{r['load_average_1m'][0]:.1f}-{r['load_average_1m'][1]:.1f}" for r in rows)
    print(f"| {s} | {len(rows)} | {med(pub) if s != 'catchup' else '0 (backlog first)'} | {med(dl)} | {med(dmb)} | {med(p50)} | {med(p99)} | {med(bcpu)} | {med(gcpu)} | {med(eff)} | {la} |")
print()

# Catch-up: the rate over the full seconds of the catch-up (every timeline second with
# deliveries except the last, which is partial), and the backlog size.
files = sorted(glob.glob(os.path.join(d, "catchup-run*.json")))
if files:
    print("| catch-up run | backlog MB (du) | records delivered | seconds to drain | rate over full seconds: records/s | MB/s |")
    print("|---|---|---|---|---|---|")
    rates = []
    for f in files:
        r = json.load(open(f))
        du = open(f.replace(".json", ".du")).read().split()[0] if os.path.exists(f.replace(".json", ".du")) else "0"
        per = [t["delivered_records"] for t in r["timeline"]]
        busy = [x for x in per if x > 0]
        full = busy[:-1] if len(busy) > 1 else busy
        rec_bytes = r["delivered_bytes"] / max(r["delivered_records"], 1)
        rps = statistics.mean(full) if full else 0
        rates.append((rps, rps * rec_bytes / 1e6))
        print(f"| {os.path.basename(f)} | {int(du)/1e6:,.0f} | {r['delivered_records']:,} | {len(busy)} | {rps:,.0f} | {rps * rec_bytes / 1e6:,.0f} |")
    print(f"\ncatch-up median {med([x[0] for x in rates])} records/s, {med([x[1] for x in rates])} MB/s\n")
