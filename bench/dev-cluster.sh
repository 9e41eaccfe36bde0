#!/usr/bin/env bash
# A local Felix cluster for trying things out: one etcd and three brokers on 127.0.0.1
# (UDP 7401-7403, metrics 9401-9403, etcd 2379), data under ./felix-cluster-data (wiped with
# --clean). Ctrl-C stops everything. Needs etcd (Debian: apt-get install etcd-server).
#
#   bench/dev-cluster.sh            # start (builds the release binary first)
#   bench/dev-cluster.sh --clean    # the same on a wiped data directory
#   bench/dev-cluster.sh restart 2  # from another shell: stop broker b2 (SIGTERM) and start it
#                                   # again with the same flags (a rolling restart, one at a time)
#   felix cluster status --etcd http://127.0.0.1:2379
# The binary is $CARGO_TARGET_DIR/release/felix (target/ when unset), built first; FELIX_BIN
# names another one and skips the build.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${FELIX_DEV_CLUSTER_DATA:-./felix-cluster-data}
BROKERS=${BROKERS:-3}
ETCD_PORT=${ETCD_PORT:-2379}
FELIX=${FELIX_BIN:-${CARGO_TARGET_DIR:-target}/release/felix}

# The script's own FELIX_* settings are not the broker's (it would warn about them).
felix() { env -u FELIX_BIN -u FELIX_DEV_CLUSTER_DATA "$FELIX" "$@"; }

# start_broker <i> [flags...]: broker b<i> in the background, its pid in $DATA/b<i>.pid and its
# flags in $DATA/b<i>.flags (for `restart`). Every broker uses b1's development certificate
# (b1 makes it), so one --ca-file trusts all.
start_broker() {
  local i=$1; shift
  if [ $# -gt 0 ]; then printf '%s\n' "$@"; fi >"$DATA/b$i.flags"
  # `env` execs the broker, so $! is the broker's pid.
  env -u FELIX_BIN -u FELIX_DEV_CLUSTER_DATA "$FELIX" serve --cluster-etcd "http://127.0.0.1:$ETCD_PORT" --node-id "b$i" \
    --listen "127.0.0.1:740$i" --advertise "127.0.0.1:740$i" --metrics "127.0.0.1:940$i" \
    --cores 1 --data-dir "$DATA/b$i" "$@" >>"$DATA/b$i.log" 2>&1 &
  echo $! >"$DATA/b$i.pid"
}

if [ "${1:-}" = "restart" ]; then
  i=${2:?usage: bench/dev-cluster.sh restart <broker number>}
  [ -s "$DATA/b$i.pid" ] || { echo "no broker b$i under $DATA (is the cluster running?)" >&2; exit 2; }
  pid=$(cat "$DATA/b$i.pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "b$i (pid $pid) did not stop in 30 s" >&2; exit 1; fi
  mapfile -t flags <"$DATA/b$i.flags"
  start_broker "$i" "${flags[@]}"
  echo "b$i restarted (pid $(cat "$DATA/b$i.pid")); log: $DATA/b$i.log"
  exit 0
fi

if [ "${1:-}" = "--clean" ]; then rm -rf "$DATA"; fi
command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 2; }
[ -n "${FELIX_BIN:-}" ] || cargo build --release --bin felix
mkdir -p "$DATA"
pids=()
# Stops etcd and every broker, restarted ones included (their pids are in the pid files).
stop() {
  for f in "$DATA"/b*.pid; do
    if [ -s "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
    rm -f "$f"
  done
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM
etcd --name dev --data-dir "$DATA/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-cluster "dev=http://127.0.0.1:$((ETCD_PORT + 1))" >"$DATA/etcd.log" 2>&1 &
pids+=($!)
start_broker 1
for _ in $(seq 1 100); do [ -s "$DATA/b1/dev-key.pem" ] && break; sleep 0.1; done
for i in $(seq 2 "$BROKERS"); do
  start_broker "$i" --cert "$DATA/b1/dev-cert.pem" --key "$DATA/b1/dev-key.pem"
done
sleep 3
felix cluster status --etcd "http://127.0.0.1:$ETCD_PORT" || true
cat <<TXT

Cluster up: brokers at 127.0.0.1:7401..740$BROKERS, logs in $DATA/*.log. Try:
  $FELIX streams create --stream acme/app/orders --shards 12 --addr 127.0.0.1:7401 --ca-file $DATA/b1/dev-cert.pem
  $FELIX cluster status --etcd http://127.0.0.1:$ETCD_PORT
Every broker uses b1's development certificate ($DATA/b1/dev-cert.pem). Restart one broker:
  bench/dev-cluster.sh restart 2
Ctrl-C stops all.
TXT
# Until Ctrl-C (restarted brokers are not this shell's children, so wait on etcd).
wait "${pids[0]}"
