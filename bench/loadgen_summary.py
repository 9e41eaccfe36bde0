#!/usr/bin/env python3
"""Summaries of bench/run.sh: median and spread (min-max) per scenario, ratios to the physical
limits measured in the same run, MB per broker and per generator CPU-second and which side bound
each row, the NATS JetStream peer row beside Felix's, and the profiles' top symbols; written as
summary.md in each scenario directory and as bench/results/<date>-publish-suite/summary.md.

Usage: bench/loadgen_summary.py <results dir> <date> <cpus>
"""
import collections
import glob
import json
import os
import statistics
import sys

RES, DATE, NCPU = sys.argv[1], sys.argv[2], int(sys.argv[3])
# A side at least this busy (% of the CPUs it may use), and busier than the other, bounded the
# run: felix-loadgen's BOUND_BUSY_PCT and Bound::of, for results written before it had bound_by.
BOUND_BUSY_PCT = 80.0
# The peer row's directory (bench/run.sh's nats scenario) and its name in the tables.
PEER = "nats-jetstream"
PEER_LABEL = "NATS JetStream (peer)"


def load(pattern):
    out = []
    for p in sorted(glob.glob(pattern)):
        try:
            with open(p) as f:
                out.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"skip {p}: {e}")
    return out


def spread(values, fmt="{:.1f}"):
    values = [v for v in values if v is not None]
    if not values:
        return "-", None
    med = statistics.median(values)
    text = fmt.format(med)
    if len(values) > 1:
        text += f" ({fmt.format(min(values))}-{fmt.format(max(values))})"
    return text, med


def limits():
    d = f"{RES}/{DATE}-limits"
    rows = []
    if os.path.exists(f"{d}/raw.jsonl"):
        with open(f"{d}/raw.jsonl") as f:
            rows = [json.loads(l) for l in f if l.strip()]
    out = {}
    for name in sorted({r["limit"] for r in rows}):
        rs = [r for r in rows if r["limit"] == name]
        out[name] = {"mb_s": spread([r["mb_s"] for r in rs]), "runs": len(rs), "rows": rs}
        if name.startswith("udp"):
            out[name]["mb_per_cpu_s"] = spread([r.get("mb_per_cpu_s") for r in rs], "{:.0f}")
            out[name]["sink_busy"] = spread([100 * r.get("sink_busy", 0) for r in rs], "{:.0f}")
        if name.startswith("fio"):
            out[name]["fdatasync_p50_us"] = spread([r.get("fdatasync_p50_us") for r in rs], "{:.0f}")
    return out


def tally(bounds):
    """Each run's bound, most frequent first: "broker 3/3", "generator 2/3, neither 1/3"."""
    bounds = [b or "?" for b in bounds]
    counts = collections.Counter(bounds).most_common()
    return ", ".join(f"{k} {n}/{len(bounds)}" for k, n in counts) or "-"


def bound_of(gen_busy_pct, broker_busy_pct):
    """Which side bounded a run (felix-loadgen's Bound::of): the busier, if at least
    BOUND_BUSY_PCT busy; a tie goes to the generator."""
    if gen_busy_pct is None or broker_busy_pct is None:
        return None
    if max(gen_busy_pct, broker_busy_pct) < BOUND_BUSY_PCT:
        return "neither"
    return "generator" if gen_busy_pct >= broker_busy_pct else "broker"


def run_row(r):
    b = r.get("broker") or {}
    p50 = b.get("ack_p50_us_per_core") or [None]
    p99 = b.get("ack_p99_us_per_core") or [None]
    # The broker's p99 counted once per record (results since the broker publishes it).
    rec_p99 = b.get("ack_record_p99_us_per_core") or [None]
    flush_p99 = b.get("flush_p99_us_per_core") or [None]
    # The broker's receive span (first to last read of a batch's bytes), in results since
    # felix_publish_receive_span_us exists.
    recv_p99 = b.get("receive_p99_us_per_core") or [None]
    # How long batches waited in the generator's client before they were written (results
    # since felix-loadgen reports client_send).
    send = r.get("client_send") or {}
    # MB per generator CPU-s, the broker's busy % and the bound come in the JSON since
    # felix-loadgen reports them (nats_pub always has); older results get them computed here
    # from the CPU seconds and busy figures they do have.
    gen_mb_cpu_s = r.get("stored_mb_per_generator_cpu_s")
    if gen_mb_cpu_s is None and b.get("stored_bytes") is not None and r.get("generator_cpu_s"):
        gen_mb_cpu_s = b["stored_bytes"] / 1e6 / r["generator_cpu_s"]
    broker_busy = r.get("broker_busy_pct")
    if broker_busy is None and b.get("cpu_pct") is not None:
        broker_busy = b["cpu_pct"] / max(len(b.get("stored_bytes_per_core") or [None]), 1)
    bound = r.get("bound_by") or bound_of(r.get("generator_busy_pct"), broker_busy)
    # The same CPU with interrupt work moved to the side it served (felix-loadgen's
    # interrupts_attributed: on one host, the generator's softirq runs the broker's receive
    # path, and the disk's interrupts land on one CPU).
    att = r.get("interrupts_attributed") or {}
    return {
        "att_per_cpu_s": att.get("stored_mb_per_broker_cpu_s"),
        "att_gen_per_cpu_s": att.get("stored_mb_per_generator_cpu_s"),
        "att_broker_busy": att.get("broker_busy_pct"),
        "att_gen_busy": att.get("generator_busy_pct"),
        "att_on_gen_s": att.get("on_generator_cpus_s"),
        "att_on_broker_s": att.get("on_broker_cpus_s"),
        "att_bound_by": att.get("bound_by"),
        "stored_mb_s": r.get("stored_mb_s"),
        "sent_mb_s": r.get("sent_mb_s"),
        "per_cpu_s": r.get("stored_mb_per_broker_cpu_s"),
        "gen_per_cpu_s": gen_mb_cpu_s,
        "broker_cpu": b.get("cpu_pct"),
        "broker_busy": broker_busy,
        "gen_busy": r.get("generator_busy_pct"),
        "bound_by": bound,
        "p50": r["ack"]["p50_us"] / 1000,
        "p99": r["ack"]["p99_us"] / 1000,
        "broker_p50": max(p50) / 1000 if p50[0] is not None else None,
        "broker_p99": max(p99) / 1000 if p99[0] is not None else None,
        "broker_rec_p99": max(rec_p99) / 1000 if rec_p99[0] is not None else None,
        "flush_p99": max(flush_p99) / 1000 if flush_p99[0] is not None else None,
        "recv_p99": max(recv_p99) / 1000 if recv_p99[0] is not None else None,
        "send_p99": send["delay_p99_us"] / 1000 if send.get("batches") else None,
        "flushes_per_gb": b.get("flushes_per_gb"),
        "stored_share": (b.get("stored_bytes", 0) / r["sent_bytes"] * 100) if r.get("sent_bytes") else None,
        "errors": r.get("errors", 0),
        "key_shards": r.get("key_shards"),
        "load": r.get("load_average_1m", [None, None]),
        "warnings": r.get("warnings", []),
    }


def publish_table(runs):
    rows = [run_row(r) for r in runs]
    s = {k: spread([row[k] for row in rows], f) for k, f in [
        ("stored_mb_s", "{:.1f}"), ("sent_mb_s", "{:.1f}"), ("per_cpu_s", "{:.0f}"),
        ("gen_per_cpu_s", "{:.0f}"), ("broker_cpu", "{:.0f}"), ("broker_busy", "{:.0f}"),
        ("gen_busy", "{:.0f}"), ("p50", "{:.2f}"), ("p99", "{:.2f}"),
        ("broker_p50", "{:.2f}"), ("broker_p99", "{:.2f}"), ("broker_rec_p99", "{:.2f}"),
        ("flush_p99", "{:.2f}"),
        ("recv_p99", "{:.2f}"), ("send_p99", "{:.2f}"),
        ("att_per_cpu_s", "{:.0f}"), ("att_gen_per_cpu_s", "{:.0f}"),
        ("att_broker_busy", "{:.0f}"), ("att_gen_busy", "{:.0f}"),
        ("att_on_gen_s", "{:.2f}"), ("att_on_broker_s", "{:.2f}"),
        ("flushes_per_gb", "{:.0f}"),
        ("stored_share", "{:.1f}")]}
    loads = [x for row in rows for x in row["load"] if x is not None]
    s["load"] = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
    s["errors"] = sum(row["errors"] for row in rows)
    s["warnings"] = sorted({w for row in rows for w in row["warnings"]})
    s["runs"] = len(rows)
    # "broker 3/3", or "generator 2/3, neither 1/3": each run's bound, most frequent first.
    s["bound_by"] = tally(row["bound_by"] for row in rows)
    att = [row["att_bound_by"] for row in rows if row["att_bound_by"]]
    s["att_bound_by"] = ", ".join(
        f"{k} {n}/{len(rows)}" for k, n in collections.Counter(att).most_common()) or "-"
    ks = sorted({row["key_shards"] for row in rows if row["key_shards"] is not None})
    s["key_shards"] = ",".join(str(k) for k in ks) or "-"
    return s


def profile_summary(d, symbolized=True):
    """One line about the profiles bench/run.sh left in scenario directory d (flame graphs and
    perf report's self-time lists): where they are, the memmove/memcpy share of the broker's
    CPU (where its binary has symbols) and its top symbols. None without profiles."""
    if not os.path.exists(f"{d}/flame-broker.svg"):
        return None
    tops, copies, samples = [], 0.0, "?"
    try:
        with open(f"{d}/profile-broker.txt") as f:
            for line in f:
                if line.startswith("# Samples:"):
                    samples = line.split()[2]
                parts = line.split(None, 2)
                if len(parts) < 3 or not parts[0].endswith("%"):
                    continue
                pct, sym = float(parts[0][:-1]), parts[2].strip()
                if "memmove" in sym or "memcpy" in sym:
                    copies += pct
                if len(tops) < 5:
                    tops.append(f"{sym} {pct:.1f}%")
    except (OSError, ValueError):
        pass
    copied = (f"memmove+memcpy {copies:.1f}% of the broker's {samples} samples" if symbolized
              else f"{samples} broker samples")
    return (f"`flame-broker.svg`, `flame-generator.svg`, `profile-*.txt`; {copied}; its top "
            "symbols: " + "; ".join(tops))


def delivery():
    """The delivery scenario (bench/run.sh's scenario_delivery): per case, median and spread of
    the published and per-subscriber delivered rates, publish-to-delivery p50/p99, both sides'
    busy %; and the catch-up's drain rate. Returns the page's lines (empty without runs)."""
    d = f"{RES}/{DATE}-delivery"
    lines = []
    head = ("| case | published rec/s | delivered rec/s per subscriber | delivered MB/s per "
            "subscriber | delivered / published % | delivery p50 ms | delivery p99 ms | "
            "broker busy % | generator busy % | bound by | runs | load avg |")
    rows = []
    for case in ["mixed1", "mixed2", "half2"]:
        runs = load(f"{d}/{case}-run*.json")
        if not runs:
            continue
        subs = [max(r["config"].get("subscribers") or 1, 1) for r in runs]
        pub = [r["sent_records"] / r["measured_s"] for r in runs]
        per_sub = [r["delivered_records"] / r["measured_s"] / n for r, n in zip(runs, subs)]
        share = [100 * r["delivered_records"] / n / max(r["sent_records"], 1)
                 for r, n in zip(runs, subs)]
        mb = [r["delivered_bytes"] / 1e6 / r["measured_s"] / n for r, n in zip(runs, subs)]
        p50 = [r["delivery"]["p50_us"] / 1000 for r in runs]
        p99 = [r["delivery"]["p99_us"] / 1000 for r in runs]
        t = publish_table(runs)
        rows.append(f"| {case} | {spread(pub, '{:,.0f}')[0]} | {spread(per_sub, '{:,.0f}')[0]} | "
                    f"{spread(mb)[0]} | {spread(share)[0]} | {spread(p50, '{:.2f}')[0]} | "
                    f"{spread(p99, '{:.2f}')[0]} | {t['broker_busy'][0]} | {t['gen_busy'][0]} | "
                    f"{t['bound_by']} | {t['runs']} | {t['load']} |")
    if rows:
        lines += [head, "|" + "---|" * 12, *rows, "",
                  "12-shard durable keyed publish, 4 KiB x 64, 12 keys; fresh broker per run. "
                  "mixed1 / mixed2: as fast as possible with 1 / 2 subscribers (fanout, from the "
                  "end); half2: 2 subscribers at half of mixed2's median published rate. "
                  "Delivered / published: what each subscriber received of what was published "
                  "in the window (records delivered after the window's end are not counted). "
                  "Delivery latency: publish to delivery, per record.", ""]
    catchup = []
    for p in sorted(glob.glob(f"{d}/catchup-run*.json")):
        if p.endswith(".fio.json"):
            continue
        try:
            with open(p) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        du = p.replace(".json", ".du")
        backlog, dropped = None, False
        if os.path.exists(du):
            with open(du) as f:
                text = f.read()
            backlog = int(text.split()[0]) if text.split() else None
            dropped = "page cache dropped" in text
        # The drain rate: mean over the whole timeline seconds with deliveries, the last
        # (partial) one left out.
        seconds = [t for t in r["timeline"] if t["delivered_records"] > 0]
        drain = seconds[:-1] if len(seconds) > 1 else seconds
        full = [t["delivered_records"] for t in drain]
        # CPU over the same full seconds: the run's whole window also holds the seconds after
        # the backlog ran out, when both sides idle, so its CPU figures understate the drain's.
        def drain_pct(key):
            v = [t[key] for t in drain if t.get(key) is not None]
            return statistics.mean(v) if v else None
        broker_drain, gen_drain = drain_pct("broker_cpu_pct"), drain_pct("generator_cpu_pct")
        bound = bound_of(gen_drain, broker_drain)
        rec_bytes = r["delivered_bytes"] / max(r["delivered_records"], 1)
        rps = statistics.mean(full) if full else 0
        # The same run's fio read of the same log files (bench/run.sh), where there is one.
        disk = None
        try:
            with open(p.replace(".json", ".fio.json")) as f:
                disk = json.load(f)["jobs"][0]["read"]["bw_bytes"] / 1e6
        except (OSError, ValueError, KeyError, IndexError):
            pass
        mb_s = rps * rec_bytes / 1e6
        catchup.append({"backlog": backlog, "dropped": dropped, "records": r["delivered_records"],
                        "seconds": len(seconds), "rps": rps, "mb_s": mb_s,
                        "busy": broker_drain, "gen_busy": gen_drain, "bound": bound,
                        "mb_per_broker_cpu_s": (mb_s / (broker_drain / 100)
                                                if broker_drain else None),
                        "disk": disk, "ratio": mb_s / disk if disk else None})
    if catchup:
        dropped = sum(c["dropped"] for c in catchup)
        lines += ["Catch-up: a backlog published first (no subscriber), the page cache dropped "
                  f"({dropped} of {len(catchup)} runs could), then one subscriber from the "
                  "earliest offset and no publisher. Rate: the mean of the full seconds with "
                  "deliveries. Disk read: fio reading the same log files after the run (O_DIRECT, "
                  "1 MiB, 4 in flight, page cache dropped); drain / disk: run by run. CPU: "
                  "each side's mean over the same full seconds (not the whole window, which "
                  "also holds the idle seconds after the backlog ran out); bound by: the side "
                  "at least 80 % busy and busier than the other in them.", "",
                  "| backlog MB | records delivered | seconds with deliveries | drain records/s | "
                  "drain MB/s | disk read MB/s | drain / disk | broker CPU % | generator CPU % | "
                  "drain MB per broker CPU-s | bound by | runs |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|",
                  f"| {spread([c['backlog'] / 1e6 for c in catchup if c['backlog']], '{:,.0f}')[0]} | "
                  f"{spread([c['records'] for c in catchup], '{:,.0f}')[0]} | "
                  f"{spread([c['seconds'] for c in catchup], '{:.0f}')[0]} | "
                  f"{spread([c['rps'] for c in catchup], '{:,.0f}')[0]} | "
                  f"{spread([c['mb_s'] for c in catchup], '{:,.0f}')[0]} | "
                  f"{spread([c['disk'] for c in catchup if c['disk']], '{:,.0f}')[0]} | "
                  f"{spread([c['ratio'] for c in catchup if c['ratio']], '{:.2f}')[0]} | "
                  f"{spread([c['busy'] for c in catchup], '{:.0f}')[0]} | "
                  f"{spread([c['gen_busy'] for c in catchup], '{:.0f}')[0]} | "
                  f"{spread([c['mb_per_broker_cpu_s'] for c in catchup], '{:,.0f}')[0]} | "
                  f"{tally([c['bound'] for c in catchup])} | {len(catchup)} |", ""]
    if lines:
        write(f"{d}/summary.md", "\n".join([f"# Delivery, {DATE}\n", *lines]))
    return lines


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}")


def main():
    lim = limits()
    fio = lim.get("fio_fdatasync_seq_write_1m", {}).get("mb_s", ("-", None))[1]
    aead = lim.get("aes128gcm_seal_open_1200", {}).get("mb_s", ("-", None))[1]
    udp = lim.get("udp_loopback_gso_gro_1200", {}).get("mb_per_cpu_s", ("-", None))[1]
    top = [f"# Benchmarks {DATE} (bench/run.sh, {NCPU} CPUs)\n",
           f"Commit {os.environ.get('GIT_COMMIT', '?')}, kernel {os.environ.get('KERNEL', '?')}. "
           "Other agents shared this machine; the load average of each scenario is in its table.\n"]

    if lim:
        t = [f"# Physical limits, {DATE}\n",
             "Measured by bench/run.sh in the same session as the scenarios.\n",
             "| limit | MB/s median (min-max) | runs | notes |", "|---|---|---|---|"]
        for name, v in lim.items():
            note = ""
            if name.startswith("fio"):
                note = (f"{v['rows'][0]['bs']} writes, fdatasync after each; "
                        f"fdatasync p50 {v['fdatasync_p50_us'][0]} us")
            if name.startswith("aes"):
                note = "one core, ring, seal+open of 1200 bytes (each byte counted once)"
            if name.startswith("udp"):
                note = (f"raw GSO sender -> GRO sink on one core; sink {v['sink_busy'][0]}% busy, "
                        f"{v['mb_per_cpu_s'][0]} MB per sink CPU-second")
            t.append(f"| {name} | {v['mb_s'][0]} | {v['runs']} | {note} |")
        write(f"{RES}/{DATE}-limits/summary.md", "\n".join(t) + "\n")
        top += ["## Physical limits", *t[2:], ""]

    pub = {}
    for name in ["publish-1shard", "publish-12shards", "publish-12shards-fixedrate",
                 "publish-12shards-halfrate", "publish-12shards-write-order",
                 "publish-12shards-jumbo", PEER]:
        runs = load(f"{RES}/{DATE}-{name}/run*.json")
        if runs:
            pub[name] = publish_table(runs)
            pub[name]["server"] = runs[0].get("server_version")
    if pub:
        head = ("| scenario | stored MB/s | MB per broker CPU-s | MB per generator CPU-s | "
                "broker CPU % | generator busy % | bound by | client p50 ms | client p99 ms | "
                "broker p50 ms | broker p99 ms | broker p99 per record ms | flush p99 ms | "
                "receive span p99 ms | client send delay p99 ms | flushes/GB | stored/sent % | "
                "runs | load avg |")
        t = [head, "|" + "---|" * 19]
        for name, s in pub.items():
            label = PEER_LABEL if name == PEER else name
            t.append(f"| {label} | {s['stored_mb_s'][0]} | {s['per_cpu_s'][0]} | "
                     f"{s['gen_per_cpu_s'][0]} | {s['broker_cpu'][0]} | {s['gen_busy'][0]} | "
                     f"{s['bound_by']} | {s['p50'][0]} | {s['p99'][0]} | {s['broker_p50'][0]} | "
                     f"{s['broker_p99'][0]} | {s['broker_rec_p99'][0]} | {s['flush_p99'][0]} | "
                     f"{s['recv_p99'][0]} | "
                     f"{s['send_p99'][0]} | {s['flushes_per_gb'][0]} | {s['stored_share'][0]} | "
                     f"{s['runs']} | {s['load']} |")
        # The same runs with interrupt time moved to the side it served (rows that have it).
        att_rows = [(n, s) for n, s in pub.items() if s["att_bound_by"] != "-"]
        if att_rows:
            t += ["", "The same runs with interrupt work (irq + softirq, from `/proc/stat`) moved "
                  "to the side it served: on one host a datagram's receive path runs in its "
                  "sender's softirq, and the disk's interrupts land on one CPU, so the plain "
                  "figures charge part of the broker's work to the generator (felix-loadgen's "
                  "`interrupts_attributed`, docs/loadgen.md):", "",
                  "| scenario | interrupt CPU-s on generator's / broker's CPUs | MB per broker CPU-s "
                  "| MB per generator CPU-s | broker busy % | generator busy % | bound by |",
                  "|" + "---|" * 7]
            for name, s in att_rows:
                t.append(f"| {name} | {s['att_on_gen_s'][0]} / {s['att_on_broker_s'][0]} | "
                         f"{s['att_per_cpu_s'][0]} | {s['att_gen_per_cpu_s'][0]} | "
                         f"{s['att_broker_busy'][0]} | {s['att_gen_busy'][0]} | "
                         f"{s['att_bound_by']} |")
        ratios = ["", "Ratios to the limits measured in the same session (medians):", ""]
        for name, s in pub.items():
            if name.endswith("rate"):
                continue
            st, pc = s["stored_mb_s"][1], s["per_cpu_s"][1]
            parts = []
            if st and fio:
                parts.append(f"stored MB/s / fio fdatasync'd 1 MiB writes = {st / fio:.2f}")
            # The peer runs without TLS: the AES-GCM and UDP limits are not its floor.
            if pc and aead and name != PEER:
                parts.append(f"MB per broker CPU-s / one core's AES-GCM = {pc / aead:.2f}")
            if pc and udp and name != PEER:
                parts.append(f"MB per broker CPU-s / UDP GSO/GRO MB per CPU-s = {pc / udp:.2f}")
            if parts:
                ratios.append(f"- {PEER_LABEL if name == PEER else name}: " + "; ".join(parts))
        if len(ratios) == 3:
            ratios = []
        notes = ["",
                 "Durable keyed publish: 4 KiB records, 64 per batch, 12 keys, ack durable; broker "
                 "`--cores 1` pinned to CPU 0, generator (1 worker, 4 publisher tasks; the saturated "
                 "rows with 8192 records outstanding and 256 batches in flight, bench/run.sh's "
                 "$SATURATE) pinned to CPU 1; fresh broker and data dir per run. Stored = the "
                 "broker's felix_storage_append_bytes_total over the window (the throughput). "
                 "The fixedrate row publishes 10,000 records/s (41 MB/s) instead of as fast as "
                 "possible, so its latency is not queueing; the halfrate row publishes at half of "
                 "publish-12shards' median acked records/s (the latency at half load). "
                 "The write-order row is publish-12shards with the generator's QUIC streams "
                 "sent one after another instead of round-robin (`--send-in-write-order`). "
                 "The jumbo row is publish-12shards on a 9000-byte path (broker and generator "
                 "`--max-udp-payload 8952`), every other row a 1500-byte one (1452). "
                 "Client latency is send-to-ack including the generator's closed-loop queue; broker "
                 "latency is the broker's own publish-to-ack histogram over the window (its /histograms "
                 "read at the first publication inside the window and at its end, differenced; "
                 "the flush p99 over the same span; the receive span is how long a batch's bytes "
                 "took to arrive, first to last read by the broker, before its ack clock starts; "
                 "the broker p99 per record counts each batch's latency once per record, as the "
                 "client's p99 does; "
                 "the client send delay is how long a batch waited in the generator's client, "
                 "from ready to written to its QUIC stream, off the broker's clock). "
                 "MB per generator CPU-s: stored MB over the generator's CPU seconds. Bound by: "
                 f"the side at least {BOUND_BUSY_PCT:.0f}% busy (of the CPUs it may use) and busier "
                 "than the other, per run (felix-loadgen's bound_by); neither = both waited on "
                 "something else (a fixed rate, the disk, flow control).",
                 ""]
        if PEER in pub:
            notes += [f"{PEER_LABEL}: nats-server {pub[PEER]['server'] or '?'} (Debian's package) "
                      "with JetStream and its default file store, pinned to CPU 0 (GOMAXPROCS 1); "
                      "bench's nats_pub (async-nats, one current-thread runtime) on CPU 1 publishes "
                      "4 KiB messages round-robin over 12 subjects of one stream, each on its own "
                      f"(no batches), at most {os.environ.get('NATS_IN_FLIGHT', '8192')} awaiting their ack. "
                      "Stored = payload + subject "
                      "bytes acked in the window; MB per broker CPU-s = per server CPU-s (from "
                      "/proc/<pid>/stat). Not like for like: the server acks once the message is "
                      "written to its file, fsyncing on a 2-minute timer (JetStream's default), "
                      "where Felix's ack durable waits for fdatasync; and it runs plain TCP, where "
                      "Felix decrypts QUIC (AES-128-GCM).", ""]
        for name, s in pub.items():
            errs = f"errors {s['errors']}"
            warns = "; ".join(s["warnings"]) or "none"
            if name == PEER:
                notes.append(f"- {PEER_LABEL}: {errs}; warnings: {warns}")
            else:
                notes.append(f"- {name}: 12 keys mapped to {s['key_shards']} distinct shard(s); "
                             f"{errs}; warnings: {warns}")
        profiles = []
        for name in pub:
            line = profile_summary(f"{RES}/{DATE}-{name}", symbolized=name != PEER)
            if line and name == PEER:
                line += " (Debian's nats-server is stripped: its Go frames show as addresses)"
            if line:
                profiles.append(f"- {PEER_LABEL if name == PEER else name}: {line}")
        if profiles:
            profiles = ["", "Profiles: `perf record` of the broker and of the generator over the "
                        "window of one more run, not in the figures; flame graphs drawn with "
                        "inferno, self time per symbol in `profile-*.txt`:", "", *profiles]
        for name, s in pub.items():
            label = PEER_LABEL if name == PEER else name
            text = "\n".join([f"# {label}, {DATE}\n", head, t[1], t[[n for n in pub].index(name) + 2],
                              *ratios, *notes, *profiles]) + "\n"
            if name != PEER:
                text += f"\nPlots of each run: `plots-run*/` (throughput, latency, per-core throughput, per-core p99).\n"
            write(f"{RES}/{DATE}-{name}/summary.md", text)
        top += ["## Durable keyed publish (1 vs 12 shards; the NATS JetStream peer)", *t, *ratios,
                *notes, *profiles, ""]

    dl = delivery()
    if dl:
        top += ["## Delivery: does it keep up with ingest", *dl]

    scal = {}
    for cores in range(1, NCPU + 1):
        runs = load(f"{RES}/{DATE}-scaling/cores{cores}-run*.json")
        if runs:
            scal[cores] = publish_table(runs)
    if scal:
        t = ["| broker cores | stored MB/s | MB per broker CPU-s | MB per generator CPU-s | "
             "broker CPU % | generator busy % | bound by | client p99 ms | runs |",
             "|" + "---|" * 9]
        for c, s in scal.items():
            t.append(f"| {c} | {s['stored_mb_s'][0]} | {s['per_cpu_s'][0]} | "
                     f"{s['gen_per_cpu_s'][0]} | {s['broker_cpu'][0]} | {s['gen_busy'][0]} | "
                     f"{s['bound_by']} | {s['p99'][0]} | {s['runs']} |")
        note = ("12-shard durable keyed publish on 1..N broker cores. On this machine N = "
                f"{NCPU}: with {NCPU} broker cores the generator shares the broker's CPUs, so "
                "these figures say nothing about scaling; they mean something on a many-core "
                "machine." if NCPU <= 4 else f"12-shard durable keyed publish on 1..{NCPU} broker cores.")
        write(f"{RES}/{DATE}-scaling/summary.md",
              "\n".join([f"# Scaling, {DATE}\n", note, "", *t]) + "\n")
        top += ["## Scaling", note, "", *t, ""]

    soak = load(f"{RES}/{DATE}-soak/soak.json")
    if soak:
        r = soak[0]
        b = r.get("broker") or {}
        tl = [s for s in r["timeline"] if s["measured"] and s.get("broker_rss_bytes")]
        mib = lambda v: v / 1048576
        # RSS grows while the broker starts up and fills its buffers; compare the 30 s after
        # the first minute (or third of the run) with the last 30 s.
        settle = min(60, len(tl) // 3)
        first = [mib(s["broker_rss_bytes"]) for s in tl[settle:settle + 30]]
        last = [mib(s["broker_rss_bytes"]) for s in tl[-30:]]
        settle_s = tl[settle]["t_s"] if tl else 0
        growth = (statistics.mean(last) - statistics.mean(first)) if first and last else None
        lines = [f"# Soak, {DATE}\n",
                 f"Mixed run: publish at {r['config'].get('rate')} records/s of 4 KiB (12 keys, "
                 f"durable) plus {r['config']['subscribers']} fanout subscribers, "
                 f"{r['measured_s']:.0f} s measured.\n",
                 "| figure | value |", "|---|---|",
                 f"| errors | {r['errors']} |",
                 f"| broker connections accepted in the window (reconnects) | {b.get('connections_accepted')} |",
                 f"| resubscribes | {r['resubscribes']} |",
                 f"| records acked / sent | {r['acked_records']} / {r['sent_records']} |",
                 f"| records delivered to subscribers | {r['delivered_records']} |",
                 f"| stored MB/s | {r.get('stored_mb_s') or 0:.1f} |",
                 f"| broker RSS at t = {settle_s:.0f}-{settle_s + 30:.0f} s, mean MiB | {statistics.mean(first) if first else 0:.1f} |",
                 f"| broker RSS last 30 s mean, MiB | {statistics.mean(last) if last else 0:.1f} |",
                 f"| broker RSS max, MiB | {mib(b.get('rss_max_bytes') or 0):.1f} |",
                 f"| RSS growth, MiB | {growth if growth is not None else 0:.1f} |",
                 f"| publish-to-ack p50 / p99 ms | {r['ack']['p50_us']/1000:.2f} / {r['ack']['p99_us']/1000:.2f} |",
                 f"| publish-to-delivery p50 / p99 ms | {r['delivery']['p50_us']/1000:.2f} / {r['delivery']['p99_us']/1000:.2f} |",
                 f"| generator busy % | {r['generator_busy_pct']:.0f} |",
                 "", "Plots: `plots/` (broker_rss.svg is the memory over time)."]
        write(f"{RES}/{DATE}-soak/summary.md", "\n".join(lines) + "\n")
        top += ["## Soak", *lines[1:-1], ""]

    os.makedirs(f"{RES}/{DATE}-publish-suite", exist_ok=True)
    write(f"{RES}/{DATE}-publish-suite/summary.md", "\n".join(top) + "\n")


main()
