import sys, statistics, collections, bisect
def load(p):
    d = collections.defaultdict(list)
    for line in open(p):
        k, i, a, b = line.split()
        d[k].append((int(i), int(a), int(b)))
    return d
def q(xs, p): xs = sorted(xs); return xs[min(len(xs)-1, int(p*len(xs)))]
for label in sys.argv[1:]:
    b = load(f"/tmp/probe-{label}-broker.txt"); c = load(f"/tmp/probe-{label}-client.txt")
    def uniq(lst):
        cnt = collections.Counter(i for i, _, _ in lst)
        return {i: (a, b) for i, a, b in lst if cnt[i] == 1}
    W, A, R, K = uniq(c['W']), uniq(c['A']), uniq(b['R']), uniq(b['K'])
    S = sorted(a for _, a, ok in c['S']); Qr = sorted(a for _, a, _ in c['Q'])
    V = sorted(a for _, a, _ in b['V']); X = sorted(a for _, a, _ in b['X'])
    end = min(S[-1], Qr[-1], V[-1], X[-1])
    def after(lst, t):
        j = bisect.bisect_left(lst, t)
        return lst[j] if j < len(lst) else None
    parts = collections.defaultdict(list)
    for i in set(W) & set(A) & set(R) & set(K):
        w0, w1 = W[i]; r0, r1 = R[i]; k0, k1 = K[i]; a0, _ = A[i]
        if a0 > end: continue
        s = after(S, w1); v = after(V, s); x = after(X, k1); qq = after(Qr, x)
        if None in (s, v, x, qq) or v > r0 or qq > a0: continue
        parts['up 1: client write done -> first UDP send after it'].append(s - w1)
        parts['up 2: that send -> broker recvmmsg after it'].append(v - s)
        parts['up 3: broker recvmmsg -> session first read'].append(r0 - v)
        parts['receive span'].append(r1 - r0)
        parts['broker decode -> ack written'].append(k0 - r1)
        parts['down 1: ack written -> broker UDP send after it'].append(x - k1)
        parts['down 2: that send -> client recv after it'].append(qq - x)
        parts['down 3: client recv -> ack read'].append(a0 - qq)
    n = len(parts['receive span'])
    print(f"## {label}: {n} batches")
    print("| part | mean us | p50 | p90 | p99 |"); print("|---|---|---|---|---|")
    for k, xs in parts.items():
        xs = [x / 1000 for x in xs]
        print(f"| {k} | {statistics.mean(xs):.0f} | {q(xs,.5):.0f} | {q(xs,.9):.0f} | {q(xs,.99):.0f} |")
