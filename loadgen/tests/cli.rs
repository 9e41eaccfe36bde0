//! The binary end to end: every `FELIX_LOADGEN_*` variable takes effect (`--print-config`), and a
//! short mixed run against a real broker (`target/<profile>/felix`, skipped with a message when
//! it has not been built) stores what it sent, writes a JSON result that `merge` and `plot`
//! read back.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LOADGEN: &str = env!("CARGO_BIN_EXE_felix-loadgen");

fn loadgen() -> Command {
    let mut c = Command::new(LOADGEN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FELIX_") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn every_env_var_takes_effect() {
    let cases = [
        ("FELIX_LOADGEN_ADDR", "10.1.2.3:7777,10.1.2.4:7777", "addr = 10.1.2.3:7777,10.1.2.4:7777"),
        ("FELIX_LOADGEN_SERVER_NAME", "felix.test", "server_name = felix.test"),
        ("FELIX_LOADGEN_METRICS", "off", "metrics = -"),
        ("FELIX_LOADGEN_BROKER_PID", "4242", "broker_pid = 4242"),
        ("FELIX_LOADGEN_WORKLOAD", "mixed", "workload = mixed"),
        ("FELIX_LOADGEN_STREAM", "a/b/c", "stream = a/b/c"),
        ("FELIX_LOADGEN_SHARDS", "7", "shards = 7"),
        ("FELIX_LOADGEN_RETENTION_BYTES", "65536", "retention_bytes = 65536"),
        ("FELIX_LOADGEN_SEND_IN_WRITE_ORDER", "true", "send_in_write_order = true"),
        ("FELIX_LOADGEN_IDEMPOTENT", "false", "idempotent = false"),
        ("FELIX_LOADGEN_WORKERS", "3", "workers = 3"),
        ("FELIX_LOADGEN_CPUS", "0", "worker_cpus = 0"),
        ("FELIX_LOADGEN_CONNECTIONS", "5", "connections_per_worker = 5"),
        ("FELIX_LOADGEN_PUBLISHERS", "6", "publishers_per_worker = 6"),
        ("FELIX_LOADGEN_SUBSCRIBERS", "0", "subscribers_per_worker = 0"),
        ("FELIX_LOADGEN_SUBSCRIBE_FROM", "earliest", "subscribe_from = earliest"),
        ("FELIX_LOADGEN_PAYLOAD_BYTES", "512", "payload_bytes = 512"),
        ("FELIX_LOADGEN_BATCH_RECORDS", "16", "batch_records = 16"),
        ("FELIX_LOADGEN_KEYS", "0", "keys = unkeyed"),
        ("FELIX_LOADGEN_ACK", "none", "ack = none"),
        ("FELIX_LOADGEN_RATE", "500", "rate = 500 records/s"),
        ("FELIX_LOADGEN_LINGER_US", "77", "linger_us = 77"),
        ("FELIX_LOADGEN_MAX_UDP_PAYLOAD", "1350", "max_udp_payload = 1350"),
        ("FELIX_LOADGEN_IN_FLIGHT_BATCHES", "11", "in_flight_batches = 11"),
        ("FELIX_LOADGEN_OUTSTANDING", "99", "outstanding_per_worker = 99"),
        ("FELIX_LOADGEN_WARMUP_S", "0.25", "warmup_s = 0.25"),
        ("FELIX_LOADGEN_DURATION_S", "9", "duration_s = 9"),
        ("FELIX_LOADGEN_START_AT", "1700000000123", "start_at = 1700000000123"),
        ("FELIX_LOADGEN_SOAK", "true", "soak = true"),
        ("FELIX_LOADGEN_JSON", "/tmp/x.json", "json = /tmp/x.json"),
        ("FELIX_LOADGEN_PLOTS", "/tmp/plots", "plots = /tmp/plots"),
        ("FELIX_LOADGEN_LABEL", "host-7", "label = host-7"),
        ("FELIX_LOADGEN_QUIET", "true", "progress = false"),
        ("FELIX_LOADGEN_CA_FILE", "/etc/felix.pem", "ca_file = /etc/felix.pem"),
    ];
    for (key, value, expect) in cases {
        let mut c = loadgen();
        c.args(["run", "--print-config"]).env(key, value);
        if key != "FELIX_LOADGEN_CA_FILE" {
            c.args(["--ca-file", "/x.pem"]);
        }
        if key == "FELIX_LOADGEN_SUBSCRIBERS" {
            c.args(["--workload", "publish"]);
        }
        let out = c.output().expect("run felix-loadgen");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{key}={value}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(
            stdout.lines().any(|l| l.trim() == expect),
            "{key}={value} did not show `{expect}` in\n{stdout}"
        );
    }
    let bad = loadgen()
        .args(["run", "--print-config", "--ca-file", "/x.pem"])
        .env("FELIX_LOADGEN_PAYLOAD_BYTES", "3")
        .output()
        .expect("run");
    assert!(!bad.status.success(), "a payload too small for the timestamp is refused");
}

struct Broker {
    child: Child,
    dir: tempfile::TempDir,
    addr: String,
    metrics: String,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn broker_binary() -> Option<PathBuf> {
    let exe = Path::new(LOADGEN);
    let bin = exe.parent()?.join("felix");
    bin.exists().then_some(bin)
}

fn start_broker(bin: &Path) -> Broker {
    start_broker_on(bin, None)
}

/// A broker, pinned to `cpu` (with `taskset`, which execs it: the child's pid is the broker's)
/// when given.
fn start_broker_on(bin: &Path, cpu: Option<usize>) -> Broker {
    let udp = UdpSocket::bind("127.0.0.1:0").expect("udp port");
    let tcp = TcpListener::bind("127.0.0.1:0").expect("tcp port");
    let addr = udp.local_addr().expect("addr").to_string();
    let metrics = tcp.local_addr().expect("addr").to_string();
    drop((udp, tcp));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &cpu.to_string()]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = command
        .args(["serve", "--listen", &addr, "--cores", "1", "--metrics", &metrics])
        .args(["--min-free-bytes", "16777216", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn broker");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if dir.path().join("dev-cert.pem").exists()
            && felix_loadgen::metrics::scrape(&metrics).is_ok()
        {
            return Broker { child, dir, addr, metrics };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("broker did not come up on {addr} / {metrics}");
}

#[test]
fn short_mixed_run_stores_what_it_sent_and_merges() {
    let Some(bin) = broker_binary() else {
        eprintln!(
            "SKIP: no broker binary next to felix-loadgen (build it: cargo build -p felix-broker)"
        );
        return;
    };
    let broker = start_broker(&bin);
    let out_dir = tempfile::tempdir().expect("tempdir");
    let json = out_dir.path().join("r.json");
    let plots = out_dir.path().join("plots");
    let pid = broker.child.id().to_string();
    let out = loadgen()
        .args(["run", "--workload", "mixed", "--stream", "t/lg/mixed", "--shards", "2"])
        .args(["--retention-bytes", "1048576"])
        .args(["--addr", &broker.addr, "--metrics", &broker.metrics, "--broker-pid", &pid])
        .arg("--ca-file")
        .arg(broker.dir.path().join("dev-cert.pem"))
        .args(["--workers", "2", "--publishers", "2", "--payload-bytes", "1024", "--keys", "4"])
        // A 2.5 s window holds two of the broker's histogram publications (once a second).
        .args(["--warmup-s", "0.5", "--duration-s", "2.5", "--rate", "2000", "--label", "t1"])
        .arg("--json")
        .arg(&json)
        .arg("--plots")
        .arg(&plots)
        .output()
        .expect("run loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "loadgen failed\n{stdout}\n{stderr}");
    assert!(stdout.contains("workload = mixed"), "configuration printed first");
    assert!(stderr.contains("stored"), "progress lines on stderr:\n{stderr}");
    // The stream was created with the retention asked for (the broker's stream definition).
    let defs: Vec<String> = std::fs::read_dir(broker.dir.path().join("streams"))
        .expect("streams dir")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect();
    assert!(
        defs.iter().any(|d| d.contains("t/lg/mixed") && d.contains("retention_bytes = 1048576")),
        "{defs:?}"
    );
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse");
    let sent = r["sent_bytes"].as_u64().expect("sent_bytes");
    let stored = r["broker"]["stored_bytes"].as_u64().expect("stored_bytes");
    assert!(sent > 0, "records were sent");
    assert!(stored > 0, "the broker stored bytes in the window");
    assert_eq!(r["errors"].as_u64(), Some(0), "{stdout}");
    assert!(r["acked_records"].as_u64().unwrap_or(0) > 0);
    assert!(r["delivered_records"].as_u64().unwrap_or(0) > 0, "subscribers received records");
    assert_eq!(r["workers"].as_array().map(Vec::len), Some(2));
    let key_shards = r["key_shards"].as_u64().expect("keys mapped to shards");
    assert_eq!(key_shards, 2, "4 keys use both shards of the stream");
    assert!(r["broker"]["cpu_pct"].as_f64().is_some(), "broker CPU sampled from /proc");
    // The broker's latency quantiles are the window's own (its /histograms, differenced).
    let span = r["broker"]["latency_span_ms_per_core"].as_array().expect("latency span");
    assert_eq!(span.len(), 1, "one broker core: {}", r["broker"]);
    let span_ms = span[0].as_u64().expect("span ms");
    assert!((500..=2_600).contains(&span_ms), "between two publications in the window: {span_ms}");
    assert!(r["broker"]["ack_p99_us_per_core"][0].as_u64().unwrap_or(0) > 0, "{}", r["broker"]);
    // The same latency counted once per record, over the same span.
    let per_record = &r["broker"]["ack_record_p99_us_per_core"];
    assert!(per_record[0].as_u64().unwrap_or(0) > 0, "{}", r["broker"]);
    assert!(stdout.contains("per record p99"), "the text report has it:\n{stdout}");
    // Each second also carries the broker's quantiles since its previous publication: at
    // least one second of the run saw a new one, with acks in it.
    let timeline = r["timeline"].as_array().expect("timeline");
    let latest: Vec<&serde_json::Value> = timeline
        .iter()
        .filter(|s| !s["broker_latest_span_ms_per_core"].as_array().is_none_or(Vec::is_empty))
        .collect();
    assert!(!latest.is_empty(), "no second with the broker's latest quantiles: {timeline:?}");
    for s in &latest {
        let span = s["broker_latest_span_ms_per_core"][0].as_u64().expect("span");
        assert!((500..=2_600).contains(&span), "about a second: {span} ms");
    }
    assert!(
        latest.iter().any(|s| s["broker_latest_ack_p99_us_per_core"][0].as_u64().unwrap_or(0) > 0),
        "acks in some second: {latest:?}"
    );
    // The broker's QUIC counters over the window: it sent (acks), and on loopback lost nothing
    // it could not account for.
    let quic_sent = r["broker"]["quic_packets_sent"].as_u64().expect("QUIC packets sent");
    let quic_lost = r["broker"]["quic_packets_lost"].as_u64().expect("QUIC packets lost");
    assert!(quic_sent > 0 && quic_lost <= quic_sent, "{}", r["broker"]);
    let gen_sent = r["client_quic"]["packets_sent"].as_u64().expect("generator's QUIC packets");
    let sent_bytes = r["sent_bytes"].as_u64().expect("sent bytes");
    assert!(gen_sent >= sent_bytes / 1452 / 2, "the generator's packets carry what it sent: {r}");
    assert!(stdout.contains("broker QUIC packets sent"), "the text report has them:\n{stdout}");
    // How long the batches waited in the client before they were written, over the window.
    let send = &r["client_send"];
    let batches = send["batches"].as_u64().expect("client_send.batches");
    let sent_records = r["sent_records"].as_u64().expect("sent records");
    assert!(batches > 0 && batches <= sent_records + 64, "{send} for {sent_records} records");
    let (p50, p99, max) = (
        send["delay_p50_us"].as_u64().expect("p50"),
        send["delay_p99_us"].as_u64().expect("p99"),
        send["delay_max_us"].as_u64().expect("max"),
    );
    assert!(0 < p50 && p50 <= p99 && p99 <= max, "{send}");
    assert!(stdout.contains("client send delay"), "the text report has it:\n{stdout}");
    assert!(
        timeline.iter().any(|s| s["client_send_delay_p99_us"].as_u64().unwrap_or(0) > 0),
        "some second wrote batches: {timeline:?}"
    );
    let per_gen = r["stored_mb_per_generator_cpu_s"].as_f64().expect("MB per generator CPU-s");
    assert!(per_gen > 0.0, "stored bytes over generator CPU");
    assert!(r["broker_busy_pct"].as_f64().is_some(), "broker busy over its one core");
    let bound = r["bound_by"].as_str().expect("bound_by");
    assert!(["broker", "generator", "neither"].contains(&bound), "bound_by {bound}");
    assert!(stdout.contains("bound by: "), "the text report names the bound:\n{stdout}");
    // Both sides may run on every CPU here, so no interrupt time is attributed.
    assert!(
        r["interrupts_attributed"].is_null(),
        "overlapping CPUs: {}",
        r["interrupts_attributed"]
    );
    for f in ["throughput.svg", "latency.svg", "per_core_throughput.svg", "per_core_p99.svg"] {
        assert!(plots.join(f).exists(), "{f} drawn");
    }
    let merged = out_dir.path().join("fleet.json");
    let out = loadgen()
        .arg("merge")
        .arg(&json)
        .arg(&json)
        .arg("--json")
        .arg(&merged)
        .output()
        .expect("merge");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let fleet: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&merged).expect("fleet")).expect("parse");
    assert_eq!(fleet["sent_bytes"].as_u64(), Some(2 * sent), "sent bytes add up");
    assert_eq!(fleet["stored_bytes"].as_u64(), Some(stored), "one broker counted once");
    let acked = r["ack"]["count"].as_u64().expect("ack count");
    assert_eq!(fleet["ack"]["count"].as_u64(), Some(2 * acked), "histograms merged");
}

#[test]
fn interrupt_time_moves_to_the_side_it_served_when_each_side_has_its_own_cpu() {
    let Some(bin) = broker_binary() else {
        eprintln!(
            "SKIP: no broker binary next to felix-loadgen (build it: cargo build -p felix-broker)"
        );
        return;
    };
    let cpus = felix_loadgen::sys::allowed_cpu_list(None).expect("own CPUs");
    let [broker_cpu, generator_cpu, ..] = cpus[..] else {
        eprintln!("SKIP: one CPU; the two sides need one each");
        return;
    };
    let broker = start_broker_on(&bin, Some(broker_cpu));
    let out_dir = tempfile::tempdir().expect("tempdir");
    let json = out_dir.path().join("r.json");
    let pid = broker.child.id().to_string();
    let out = Command::new("taskset")
        .args(["-c", &generator_cpu.to_string(), LOADGEN])
        .args(["run", "--workload", "publish", "--stream", "t/lg/irq", "--shards", "2"])
        .args(["--addr", &broker.addr, "--metrics", &broker.metrics, "--broker-pid", &pid])
        .arg("--ca-file")
        .arg(broker.dir.path().join("dev-cert.pem"))
        .args(["--payload-bytes", "4096", "--keys", "4", "--rate", "8000"])
        .args(["--warmup-s", "0.5", "--duration-s", "2", "--quiet", "--json"])
        .arg(&json)
        .output()
        .expect("run loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json")).expect("parse");
    let a = &r["interrupts_attributed"];
    assert_eq!(a["generator_cpus"], serde_json::json!([generator_cpu]), "{a}");
    assert_eq!(a["broker_cpus"], serde_json::json!([broker_cpu]), "{a}");
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    let (on_gen, on_broker) = (f(a, "on_generator_cpus_s"), f(a, "on_broker_cpus_s"));
    assert!(on_gen >= 0.0 && on_broker >= 0.0, "{a}");
    // Sending 32 MB/s over loopback runs the broker's receive path on the generator's CPU
    // (about a dozen of the kernel's ticks in the window land in it).
    assert!(on_gen > 0.0, "interrupt time on the generator's CPU: {a}");
    // What one side gives up, the other gets: the total CPU is unchanged.
    let before = f(&r, "generator_cpu_s") + f(&r["broker"], "cpu_s");
    let after = f(a, "generator_cpu_s") + f(a, "broker_cpu_s");
    assert!((before - after).abs() < 1e-6, "{before} vs {after}: {a}");
    let bound = a["bound_by"].as_str().expect("bound_by");
    assert!(["broker", "generator", "neither"].contains(&bound), "bound_by {bound}");
    assert!(stdout.contains("interrupts (irq + softirq): "), "in the text report:\n{stdout}");
}
