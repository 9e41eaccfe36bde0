//! The `felix serve` command line: precedence of flags, environment and config file, the printed
//! configuration, warnings, start-up errors, and shutdown on SIGTERM.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn felix() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FELIX_")) {
        cmd.env_remove(k);
    }
    cmd
}

fn print_config(cmd: &mut Command) -> String {
    let out = cmd.arg("--print-config").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn flags_beat_environment_beats_file_beats_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("felix.toml");
    let mut f = std::fs::File::create(&file).unwrap();
    writeln!(
        f,
        "cores = 3\ndefault_shards = 7\nsegment_bytes = 1048576\nslow_consumer_secs = 9\n\
         write_sync = \"dsync\"\npreallocate = \"zero\""
    )
    .unwrap();
    let out = print_config(
        felix()
            .args(["serve", "--config"])
            .arg(&file)
            .args(["--default-shards", "5"])
            .env("FELIX_SEGMENT_BYTES", "2097152"),
    );
    assert!(out.contains("cores = 3"), "file value: {out}");
    assert!(out.contains("default_shards = 5"), "flag beats file: {out}");
    assert!(out.contains("segment_bytes = 2097152"), "env beats file: {out}");
    assert!(out.contains("slow_consumer_secs = 9"), "file value: {out}");
    assert!(out.contains("write_sync = \"dsync\""), "file value: {out}");
    let default = print_config(felix().arg("serve"));
    assert!(default.contains("write_sync = \"fdatasync\""), "the default: {default}");
    assert!(out.contains("preallocate = \"zero\""), "file value: {out}");
    assert!(default.contains("preallocate = \"reserve\""), "the default: {default}");
    let bad = felix().args(["serve", "--write-sync", "sometimes", "--print-config"]).output();
    let bad = bad.unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("dsync or fdatasync"), "names the choices: {err}");
    assert!(out.contains("listen = \"127.0.0.1:7400\""), "default: {out}");
}

#[test]
fn every_environment_twin_takes_effect() {
    let cases = [
        ("FELIX_LISTEN", "127.0.0.1:7999", "listen = \"127.0.0.1:7999\""),
        ("FELIX_CORES", "3", "cores = 3"),
        ("FELIX_CPUS", "1,0", "cpus = [1, 0]"),
        ("FELIX_NO_PIN", "true", "no_pin = true"),
        ("FELIX_DATA_DIR", "/tmp/felix-x", "data_dir = \"/tmp/felix-x\""),
        ("FELIX_METRICS", "off", "metrics = \"off\""),
        ("FELIX_STEERING", "cbpf", "steering = \"cbpf\""),
        ("FELIX_MAX_UDP_PAYLOAD", "1400", "max_udp_payload = 1400"),
        ("FELIX_IDLE_TIMEOUT_MS", "1234", "idle_timeout_ms = 1234"),
        ("FELIX_MAX_CONNS_PER_CORE", "77", "max_conns_per_core = 77"),
        ("FELIX_MAX_STREAMS_PER_CONN", "33", "max_streams_per_conn = 33"),
        ("FELIX_HANDSHAKES_PER_SEC_PER_CORE", "55", "handshakes_per_sec_per_core = 55"),
        ("FELIX_AUTO_CREATE", "false", "auto_create = false"),
        ("FELIX_DEFAULT_SHARDS", "11", "default_shards = 11"),
        ("FELIX_SEGMENT_BYTES", "4194304", "segment_bytes = 4194304"),
        ("FELIX_READ_CACHE_BYTES", "2097152", "read_cache_bytes = 2097152"),
        ("FELIX_WRITE_SYNC", "dsync", "write_sync = \"dsync\""),
        ("FELIX_PREALLOCATE", "zero", "preallocate = \"zero\""),
        ("FELIX_RETENTION_BYTES", "999", "retention_bytes = 999"),
        ("FELIX_RETENTION_MS", "888", "retention_ms = 888"),
        ("FELIX_INFLIGHT_BYTES_PER_CONN", "4096", "inflight_bytes_per_conn = 4096"),
        ("FELIX_INFLIGHT_BYTES_PER_CORE", "8192", "inflight_bytes_per_core = 8192"),
        ("FELIX_SLOW_CONSUMER_SECS", "4", "slow_consumer_secs = 4"),
        ("FELIX_ALLOW_ANONYMOUS", "true", "allow_anonymous = true"),
        ("FELIX_REPAIR", "true", "repair = true"),
        ("FELIX_AUTH_KEYS", "/k1.pem,/k2.pem", "auth_keys = [\"/k1.pem\", \"/k2.pem\"]"),
        ("FELIX_MIN_FREE_BYTES", "12345", "min_free_bytes = 12345"),
        ("FELIX_MAX_STREAMS_PER_TENANT", "17", "max_streams_per_tenant = 17"),
        ("FELIX_MAX_GROUP_POSITIONS_PER_CORE", "9", "max_group_positions_per_core = 9"),
        ("FELIX_CLUSTER_NAME", "blue", "cluster_name = \"blue\""),
        ("FELIX_LEASE_TTL_S", "7", "lease_ttl_s = 7"),
        ("FELIX_DEFAULT_REPLICAS", "2", "default_replicas = 2"),
        ("FELIX_MIN_INSYNC", "2", "min_insync = 2"),
        ("FELIX_REPLICA_RESIDENT_BYTES", "65536", "replica_resident_bytes = 65536"),
        ("FELIX_PEER_CA", "/ca.pem", "peer_ca = \"/ca.pem\""),
        ("FELIX_PEER_SERVER_NAME", "peers.felix", "peer_server_name = \"peers.felix\""),
    ];
    for (var, value, expect) in cases {
        let out = print_config(felix().arg("serve").env(var, value));
        assert!(out.contains(expect), "{var}={value} did not take effect:\n{out}");
    }
}

#[test]
fn unknown_felix_variables_are_named_in_a_warning() {
    let out = felix().args(["serve", "--print-config"]).env("FELIX_CORSE", "4").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FELIX_CORSE"), "{err}");
}

#[test]
fn non_loopback_without_auth_is_refused() {
    let out =
        felix().args(["serve", "--listen", "0.0.0.0:7401", "--print-config"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-anonymous"));
    let ok = felix()
        .args(["serve", "--listen", "0.0.0.0:7401", "--allow-anonymous", "--print-config"])
        .output()
        .unwrap();
    assert!(ok.status.success());
}

#[test]
fn start_errors_are_one_clear_line() {
    // A data directory that cannot be created.
    let file = tempfile::NamedTempFile::new().unwrap();
    let bad = file.path().join("sub");
    let out = felix()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "off",
            "--cores",
            "1",
            "--data-dir",
        ])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().any(|l| l.starts_with("felix: data directory")), "{err}");

    // A port in use.
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = felix()
        .args(["serve", "--listen", &addr, "--metrics", "off", "--cores", "1", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().any(|l| l.starts_with("felix: port in use")), "{err}");
}

#[test]
fn sigterm_drains_and_exits_zero() {
    let err = serve_and_stop("2", &[], &[]);
    assert!(err.contains("felix: stopped"), "{err}");
}

#[test]
fn cluster_settings_come_from_flags_environment_and_file_and_are_checked() {
    let cluster = [
        ("FELIX_CLUSTER_ETCD", "http://10.0.0.9:2379,http://10.0.0.8:2379"),
        ("FELIX_NODE_ID", "b7"),
        ("FELIX_ADVERTISE", "10.0.0.7:7400"),
    ];
    let mut cmd = felix();
    cmd.arg("serve");
    for (k, v) in cluster {
        cmd.env(k, v);
    }
    let out = print_config(&mut cmd);
    for want in [
        "cluster_etcd = [\"http://10.0.0.9:2379\", \"http://10.0.0.8:2379\"]",
        "node_id = \"b7\"",
        "advertise = \"10.0.0.7:7400\"",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("felix.toml");
    std::fs::write(
        &file,
        "cluster_etcd = [\"http://e:2379\"]\nnode_id = \"f1\"\nadvertise = \"h:1\"\nlease_ttl_s = 3\n",
    )
    .unwrap();
    let out = print_config(felix().args(["serve", "--node-id", "f2", "--config"]).arg(&file));
    assert!(out.contains("node_id = \"f2\"") && out.contains("lease_ttl_s = 3"), "{out}");
    // Incomplete or invalid cluster settings are refused with a message naming the flag.
    for (args, says) in [
        (vec!["--cluster-etcd", "http://e:2379"], "--node-id"),
        (vec!["--cluster-etcd", "http://e:2379", "--node-id", "b1"], "--advertise"),
        (
            vec!["--cluster-etcd", "http://e:2379", "--node-id", "b/1", "--advertise", "h:1"],
            "node id",
        ),
        (
            vec!["--cluster-etcd", "http://e:2379", "--node-id", "b1", "--advertise", "nope"],
            "HOST:PORT",
        ),
        (
            vec![
                "--cluster-etcd",
                "http://e:2379",
                "--node-id",
                "b1",
                "--advertise",
                "h:1",
                "--lease-ttl-s",
                "1",
            ],
            "--lease-ttl-s",
        ),
    ] {
        let out = felix().arg("serve").args(&args).arg("--print-config").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    }
}

/// Two brokers on one data directory would each recover, append to and truncate the other's
/// logs (acked records vanished that way): the second is refused, naming the directory and the
/// holder's pid; a holder killed with -9 leaves no lock behind.
#[test]
fn a_second_broker_on_the_same_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |dir: &std::path::Path| {
        felix()
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--metrics",
                "off",
                "--cores",
                "1",
                "--no-pin",
                "--data-dir",
            ])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut first = serve(dir.path());
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.path().join("core-0").exists() {
        assert!(Instant::now() < deadline, "broker did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let second = serve(dir.path()).wait_with_output().unwrap();
    assert!(!second.status.success(), "a second broker started on the same data directory");
    let err = String::from_utf8_lossy(&second.stderr);
    let line = err.lines().find(|l| l.starts_with("felix: data directory")).unwrap_or("");
    assert!(line.contains(&dir.path().display().to_string()), "names the directory: {err}");
    assert!(line.contains(&format!("pid {}", first.id())), "names the holder's pid: {err}");
    assert!(line.contains("--data-dir"), "says what to do: {err}");
    assert!(first.try_wait().unwrap().is_none(), "the first broker keeps running");

    // kill -9 releases the lock with the process: a restart on the directory starts.
    first.kill().unwrap();
    first.wait().unwrap();
    let mut third = serve(dir.path());
    std::thread::sleep(Duration::from_millis(1500));
    let still_running = third.try_wait().unwrap().is_none();
    third.kill().unwrap();
    let out = third.wait_with_output().unwrap();
    assert!(
        still_running,
        "a restart after kill -9 was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a broker of `cores` cores (with `env` and `extra` flags before `serve`) until it
/// serves, stops it with SIGTERM, requires a zero exit within 20 s, and returns its stderr.
fn serve_and_stop(cores: &str, env: &[(&str, &str)], extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = felix()
        .envs(env.iter().copied())
        .args(extra)
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics", "off", "--cores", cores])
        .args(["--no-pin", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it serves: every core opened its directory.
    let last_core = format!("core-{}", cores.parse::<usize>().unwrap() - 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.path().join(&last_core).exists() {
        assert!(Instant::now() < deadline, "broker did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "exit {status:?}: {err}");
    err
}

/// Logs into a pipe (a file, a journal) carry no colour codes; every line has a timestamp;
/// `--log-format json` writes one JSON object per log line.
#[test]
fn logs_are_plain_when_piped_and_json_on_request() {
    let text = serve_and_stop("1", &[("FELIX_LOG", "debug")], &[]);
    assert!(!text.contains('\u{1b}'), "colour codes in piped logs:\n{text}");
    let logged: Vec<&str> =
        text.lines().filter(|l| l.contains(" DEBUG ") || l.contains(" INFO ")).collect();
    assert!(!logged.is_empty(), "no log lines:\n{text}");
    for line in &logged {
        // RFC 3339 timestamp first: 2026-12-07T20:41:00.123456Z
        let ts = line.split_whitespace().next().unwrap_or_default();
        assert!(ts.len() >= 20 && ts.as_bytes()[4] == b'-' && ts.contains('T'), "{line}");
    }

    let json = serve_and_stop("1", &[("FELIX_LOG", "debug")], &["--log-format", "json"]);
    assert!(!json.contains('\u{1b}'), "{json}");
    let objects: Vec<&str> = json.lines().filter(|l| l.starts_with('{')).collect();
    assert!(!objects.is_empty(), "no JSON lines:\n{json}");
    for line in objects {
        assert!(line.ends_with('}'), "{line}");
        for field in ["\"timestamp\":", "\"level\":", "\"fields\":"] {
            assert!(line.contains(field), "{field} missing: {line}");
        }
    }
}
