# Shared by the cluster benchmarks (sourced): a fresh etcd and N brokers on 127.0.0.1, one
# core each, all on CPU 0 (the generator takes another). The caller sets DATA_ROOT, ETCD_PORT,
# T (the binaries' directory) and PORT_BASE (brokers on UDP ${PORT_BASE}1.., metrics on
# ${METRICS_BASE}1..); BROKER_FLAGS adds flags to every broker. pids: every process started;
# brokers: the broker processes.
pids=()
brokers=()
stop_all() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=(); brokers=(); }
trap stop_all EXIT

# start_cluster N: etcd, then b1 (which makes the development certificate), then b2..bN with
# b1's certificate, each waited for until its /health answers.
start_cluster() {
  local n=$1
  rm -rf "$DATA_ROOT"; mkdir -p "$DATA_ROOT"
  etcd --name bench --data-dir "$DATA_ROOT/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "bench=http://127.0.0.1:$((ETCD_PORT + 1))" >"$DATA_ROOT/etcd.log" 2>&1 &
  pids+=($!)
  for i in $(seq 1 "$n"); do
    local cert=()
    if [ "$i" -gt 1 ]; then cert=(--cert "$DATA_ROOT/b1/dev-cert.pem" --key "$DATA_ROOT/b1/dev-key.pem"); fi
    # shellcheck disable=SC2086
    taskset -c 0 "$T/felix" serve --cluster-etcd "http://127.0.0.1:$ETCD_PORT" --node-id "b$i" \
      --listen "127.0.0.1:${PORT_BASE}$i" --advertise "127.0.0.1:${PORT_BASE}$i" \
      --metrics "127.0.0.1:${METRICS_BASE}$i" --cores 1 --no-pin --data-dir "$DATA_ROOT/b$i" \
      --min-free-bytes 0 ${BROKER_FLAGS:-} "${cert[@]}" >"$DATA_ROOT/b$i.log" 2>&1 &
    pids+=($!)
    brokers+=($!)
    for _ in $(seq 1 200); do
      [ -s "$DATA_ROOT/b$i/dev-key.pem" ] && curl -sf "127.0.0.1:${METRICS_BASE}$i/health" >/dev/null && break
      sleep 0.05
    done
  done
  sleep 1
}
