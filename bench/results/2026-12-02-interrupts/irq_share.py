#!/usr/bin/env python3
"""Share of a process's perf samples spent serving interrupts, by kind.

Usage: perf script -i perf.data -F comm,tid,ip,sym | python3 irq_share.py
(perf record -F 1999 --call-graph dwarf,16384 -p <pid>). A sample counts as
- net_rx: its call chain holds net_rx_action (a datagram's receive path, run in this
  process's softirq: on loopback, the receive path of what this process sent);
- disk: blk_done_softirq, vring_interrupt or blk_mq_complete (a disk's completions);
- other irq: an interrupt entry (common_interrupt, sysvec_*) that is neither.
"""
import sys

total = 0
counts = {"net_rx": 0, "disk": 0, "other irq": 0}
stack = []


def flush():
    global total
    if not stack:
        return
    total += 1
    s = " ".join(stack)
    net = "net_rx_action" in s
    disk = any(k in s for k in ("blk_done_softirq", "vring_interrupt", "blk_mq_complete"))
    irq = "common_interrupt" in s or "sysvec_" in s
    if net:
        counts["net_rx"] += 1
    if disk:
        counts["disk"] += 1
    if irq and not net and not disk:
        counts["other irq"] += 1


for line in sys.stdin:
    if not line.strip() or line[0] not in " \t":
        flush()
        stack = []
        continue
    parts = line.split()
    stack.append(parts[-1] if len(parts) > 1 else "")
flush()
print(f"{total} samples; " + ", ".join(f"{k} {100 * v / max(total, 1):.2f} %" for k, v in counts.items()))
