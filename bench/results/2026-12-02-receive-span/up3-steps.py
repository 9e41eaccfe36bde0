import sys, collections, bisect, statistics
def q(xs, p): xs = sorted(xs); return xs[min(len(xs)-1, int(p*len(xs)))]
for label in sys.argv[1:]:
    ev = collections.defaultdict(list); R = []
    for line in open(f"/tmp/probe-{label}-broker.txt"):
        k, i, a, b = line.split()
        if k == 'R': R.append(int(a))
        else: ev[k].append(int(a))
    for k in ev: ev[k].sort()
    def before(k, t):
        j = bisect.bisect_right(ev[k], t) - 1
        return ev[k][j] if j >= 0 else None
    def after(k, t):
        j = bisect.bisect_left(ev[k], t)
        return ev[k][j] if j < len(ev[k]) else None
    parts = collections.defaultdict(list)
    for r0 in R:
        v = before('V', r0)
        if v is None: continue
        h = after('H', v); g = after('G', h); d = after('D', g); e = after('E', d); f = after('F', e)
        if None in (h, g, d, e, f) or f > r0: continue
        for name, x in [('V->H handle datagrams', h - v), ('H->G flush (ACK sends)', g - h), ('G->D yield, driver runs', d - g),
                        ('D->E drive', e - d), ('E->F flush', f - e), ('F->R session reads', r0 - f), ('V->R total', r0 - v)]:
            parts[name].append(x / 1000)
    print(f"## {label}: {len(parts['V->R total'])} frames")
    print("| step | p50 us | p90 | p99 |"); print("|---|---|---|---|")
    for k, xs in parts.items():
        print(f"| {k} | {q(xs,.5):.0f} | {q(xs,.9):.0f} | {q(xs,.99):.0f} |")
