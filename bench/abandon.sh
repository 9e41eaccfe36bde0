#!/usr/bin/env bash
# Memory under abandoned connections: does the broker's RSS stay bounded when clients walk away?
#
# Per run: a fresh release broker (`felix serve`, one core, pinned to CPU $SERVER_CPU, short idle
# timeout), then $ROUNDS rounds of the generator (bench/src/bin/net_abandon.rs, pinned to CPU
# $GEN_CPU): $HANDSHAKES handshakes abandoned after the client Initial, and $CONNS connections
# that complete the handshake and Hello/HelloOk and are then dropped without a close. After each
# round the script waits past the idle timeout until the broker reports no connection left (its
# own gauges on /metrics), then samples VmRSS / VmHWM from /proc/<pid>/status. With SUBSCRIBE=1
# each abandoned connection also holds a subscription (from latest, on an auto-created stream).
#
# Usage: [RUNS=3] [ROUNDS=10] [HANDSHAKES=500] [CONNS=500] [IDLE_MS=2000] [SUBSCRIBE=1] [OUT=dir]
#        bench/abandon.sh
# Writes $OUT/{raw.jsonl,results.json,table.md} (default bench/results/<date>-abandon).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
ROUNDS=${ROUNDS:-10}
HANDSHAKES=${HANDSHAKES:-500}
CONNS=${CONNS:-500}
IDLE_MS=${IDLE_MS:-2000}
SUBSCRIBE=${SUBSCRIBE:-0}
SERVER_CPU=${SERVER_CPU:-0}
GEN_CPU=${GEN_CPU:-1}
# Longest the broker may take, after the idle timeout, to report no connection left.
DRAIN_LIMIT_S=${DRAIN_LIMIT_S:-30}

cargo build --release -p felix-broker --bin felix
cargo build --release -p felix-bench --bin net_abandon
T=target/release
OUT=${OUT:-bench/results/$(date -u +%F)-abandon}
mkdir -p "$OUT"
RAW=$OUT/raw.jsonl
: > "$RAW"
port=47400
mode=
[ "$SUBSCRIBE" = 1 ] && mode=subscribe

# Sum of one metric over every core (a Prometheus text line per core).
metric() {
  curl -fsS "http://$maddr/metrics" | awk -v m="$1" '$1 ~ "^"m"\\{" { s += $2 } END { print s + 0 }'
}

rss_kb() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$spid/status"; }

sample() {
  local run=$1 round=$2 gen=$3 drain_s=$4
  printf '{"run":%s,"round":%s,"rss_kb":%s,"hwm_kb":%s,"net_connections":%s,"connections_open":%s,"connections_accepted":%s,"handshakes":%s,"idle_timeouts":%s,"retries":%s,"refused":%s,"drain_s":%s,"generator":%s}\n' \
    "$run" "$round" "$(rss_kb VmRSS)" "$(rss_kb VmHWM)" \
    "$(metric felix_net_connections)" "$(metric felix_broker_connections_open)" \
    "$(metric felix_broker_connections_accepted_total)" "$(metric felix_net_handshakes)" \
    "$(metric felix_net_idle_timeouts)" "$(metric felix_net_retries)" \
    "$(metric felix_net_refused_conn_limit)" "$drain_s" "$gen" >> "$RAW"
  tail -n1 "$RAW"
}

for run in $(seq 1 "$RUNS"); do
  port=$((port + 2))
  addr=127.0.0.1:$port
  maddr=127.0.0.1:$((port + 1))
  work=$(mktemp -d)
  taskset -c "$SERVER_CPU" $T/felix serve --data-dir "$work/data" --listen "$addr" \
    --metrics "$maddr" --cores 1 --no-pin --idle-timeout-ms "$IDLE_MS" \
    > "$work/broker.out" 2> "$work/broker.err" &
  spid=$!
  trap 'kill $spid 2>/dev/null || true' EXIT
  for _ in $(seq 1 200); do
    curl -fsS "http://$maddr/health" > /dev/null 2>&1 && [ -s "$work/data/dev-cert.pem" ] && break
    sleep 0.05
  done
  sample "$run" 0 null 0
  for round in $(seq 1 "$ROUNDS"); do
    gen=$(taskset -c "$GEN_CPU" $T/net_abandon "$addr" "$work/data/dev-cert.pem" \
      "$HANDSHAKES" "$CONNS" ${mode} 2> "$work/gen.err" | tail -n1)
    t0=$(date +%s.%N)
    sleep "$(awk -v ms="$IDLE_MS" 'BEGIN { print ms / 1000 }')"
    waited=0
    while [ "$(metric felix_net_connections)" != 0 ] || [ "$(metric felix_broker_connections_open)" != 0 ]; do
      waited=$((waited + 1))
      [ "$waited" -gt $((DRAIN_LIMIT_S * 10)) ] && break
      sleep 0.1
    done
    # One more refresh of the broker's metrics snapshot (every 200 ms) and of freed memory.
    sleep 0.5
    sample "$run" "$round" "$gen" "$(awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.2f", t1 - t0 }')"
  done
  kill "$spid"
  wait "$spid" || true
  trap - EXIT
  rm -rf "$work"
done

python3 - "$RAW" "$OUT" "$RUNS" "$ROUNDS" "$HANDSHAKES" "$CONNS" "$IDLE_MS" "$SUBSCRIBE" <<'PY'
import json, statistics, sys
raw, out = sys.argv[1], sys.argv[2]
runs, rounds, hs, conns, idle, subscribe = map(int, sys.argv[3:9])
rows = [json.loads(l) for l in open(raw)]
table = []
for r in range(rounds + 1):
    rs = [x for x in rows if x["round"] == r]
    mb = sorted(x["rss_kb"] / 1024 for x in rs)
    table.append({
        "round": r,
        "rss_mb_median": statistics.median(mb),
        "rss_mb_min": mb[0],
        "rss_mb_max": mb[-1],
        "net_connections_max": max(x["net_connections"] for x in rs),
        "connections_open_max": max(x["connections_open"] for x in rs),
        "hwm_mb_median": statistics.median(x["hwm_kb"] / 1024 for x in rs),
        "idle_timeouts_median": statistics.median(x["idle_timeouts"] for x in rs),
        "per_run_rss_mb": [round(x["rss_kb"] / 1024, 1) for x in rs],
    })
json.dump({"runs": runs, "rounds": rounds, "handshakes": hs, "conns": conns,
           "idle_timeout_ms": idle, "subscribe": bool(subscribe), "table": table}, open(f"{out}/results.json", "w"), indent=1)
lines = [
    f"{runs} runs x {rounds} rounds of {hs} abandoned handshakes + {conns} abandoned connections"
    + (" (each with a subscription)" if subscribe else "")
    + f", idle timeout {idle} ms. RSS after the round's connections timed out.",
    "",
    "| round | RSS MB median | min-max | per run | Δ median | net conns | app conns open | idle timeouts (median) |",
    "|---:|---:|---:|---|---:|---:|---:|---:|",
]
prev = None
for t in table:
    d = "" if prev is None else f"{t['rss_mb_median'] - prev:+.1f}"
    prev = t["rss_mb_median"]
    lines.append(
        f"| {t['round']} | {t['rss_mb_median']:.1f} | {t['rss_mb_min']:.1f}-{t['rss_mb_max']:.1f} | "
        f"{', '.join(map(str, t['per_run_rss_mb']))} | {d} | {t['net_connections_max']} | "
        f"{t['connections_open_max']} | {t['idle_timeouts_median']:.0f} |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
