"""Medians (min-max) of the A (main's generator) and B (take-one's) runs in this directory."""
import json, os, statistics as st, sys
here = os.path.dirname(os.path.abspath(__file__))
names = ["acked records/s", "client p50 ms", "client p99 ms", "batches", "in-flight waits",
         "send delay p99 ms", "broker ack p99 per record ms", "MB per generator CPU-s"]
def figs(r):
    cs = r["client_send"]
    b = (r["broker"].get("ack_record_p99_us_per_core") or [0])[0]
    return [r["acked_records"] / r["measured_s"], r["ack"]["p50_us"] / 1e3, r["ack"]["p99_us"] / 1e3,
            cs["batches"], cs["in_flight_waits"], cs["delay_p99_us"] / 1e3, b / 1e3,
            r.get("stored_mb_per_generator_cpu_s") or 0]
runs = {v: [figs(json.load(open(f"{here}/{v}-{i}.json"))) for i in range(1, 6)
            if os.path.exists(f"{here}/{v}-{i}.json")] for v in "AB"}
print("| figure | main | take-one | take-one / main |\n|---|---|---|---|")
for j, n in enumerate(names):
    a = [x[j] for x in runs["A"]]; b = [x[j] for x in runs["B"]]
    fa, fb = st.median(a), st.median(b)
    print(f"| {n} | {fa:.2f} ({min(a):.2f}-{max(a):.2f}) | {fb:.2f} ({min(b):.2f}-{max(b):.2f}) | {fb / fa:.2f} |")
