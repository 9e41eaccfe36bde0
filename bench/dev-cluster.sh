#!/usr/bin/env bash
# A local Felix cluster for trying things out: one etcd and three brokers on 127.0.0.1
# (UDP 7401-7403, metrics 9401-9403, etcd 2379), data under ./felix-cluster-data (wiped with
# --clean). Ctrl-C stops everything. Needs etcd (Debian: apt-get install etcd-server).
#
#   bench/dev-cluster.sh            # start (builds the release binary first)
#   felix cluster status --etcd http://127.0.0.1:2379
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${FELIX_DEV_CLUSTER_DATA:-./felix-cluster-data}
BROKERS=${BROKERS:-3}
ETCD_PORT=${ETCD_PORT:-2379}
if [ "${1:-}" = "--clean" ]; then rm -rf "$DATA"; fi
command -v etcd >/dev/null || { echo "etcd not found: apt-get install etcd-server" >&2; exit 2; }
cargo build --release --bin felix
FELIX=target/release/felix
mkdir -p "$DATA"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop EXIT INT TERM
etcd --name dev --data-dir "$DATA/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-cluster "dev=http://127.0.0.1:$((ETCD_PORT + 1))" >"$DATA/etcd.log" 2>&1 &
pids+=($!)
# One development certificate for every broker (b1 makes it), so one --ca-file trusts all.
start_broker() {
  local i=$1; shift
  "$FELIX" serve --cluster-etcd "http://127.0.0.1:$ETCD_PORT" --node-id "b$i" \
    --listen "127.0.0.1:740$i" --advertise "127.0.0.1:740$i" --metrics "127.0.0.1:940$i" \
    --cores 1 --data-dir "$DATA/b$i" "$@" >"$DATA/b$i.log" 2>&1 &
  pids+=($!)
}
start_broker 1
for _ in $(seq 1 100); do [ -s "$DATA/b1/dev-key.pem" ] && break; sleep 0.1; done
for i in $(seq 2 "$BROKERS"); do
  start_broker "$i" --cert "$DATA/b1/dev-cert.pem" --key "$DATA/b1/dev-key.pem"
done
sleep 3
"$FELIX" cluster status --etcd "http://127.0.0.1:$ETCD_PORT" || true
cat <<TXT

Cluster up: brokers at 127.0.0.1:7401..740$BROKERS, logs in $DATA/*.log. Try:
  $FELIX streams create --stream acme/app/orders --shards 12 --addr 127.0.0.1:7401 --ca-file $DATA/b1/dev-cert.pem
  $FELIX cluster status --etcd http://127.0.0.1:$ETCD_PORT
Every broker uses b1's development certificate ($DATA/b1/dev-cert.pem). Ctrl-C stops all.
TXT
wait
