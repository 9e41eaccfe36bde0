//! The `felix publish|subscribe|streams` commands through the real `felix` binary: every
//! connection flag works without its `FELIX_*` twin, and a successful run prints nothing on
//! stderr unless asked (`--show-config`, `FELIX_LOG`; `publish` prints its summary unless
//! `--quiet`, see `cli_expectations.rs`).

mod e2e_support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use e2e_support::TestBroker;
use felix_client::CertFingerprint;

/// The `felix` binary with no `FELIX_*` variable set, run in `cwd` (a directory without a
/// `felix-data`, so the development-certificate default cannot supply trust).
fn felix(cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FELIX_")) {
        cmd.env_remove(k);
    }
    cmd.current_dir(cwd);
    cmd
}

/// Runs `cmd` with `stdin`, bounded by the harness's wait.
fn run(cmd: &mut Command, stdin: &str) -> Output {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(e2e_support::WAIT).is_err() {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    });
    let out = child.wait_with_output().unwrap();
    drop(done_tx);
    watchdog.join().unwrap();
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts success and an empty stderr; returns stdout.
fn quiet_success(out: &Output, what: &str) -> String {
    let err = text(&out.stderr);
    assert!(out.status.success(), "{what}: exit {:?}: {err}", out.status);
    assert_eq!(err, "", "{what}: a successful run prints nothing on stderr");
    text(&out.stdout)
}

#[test]
fn every_connection_flag_works_without_its_environment_twin() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &[]);
    let addr = broker.addr.to_string();
    let ca = dir.path().join("dev-cert.pem");
    let ca_s = ca.display().to_string();
    let der = felix_client::tls::read_ca_file(&ca).unwrap();
    let pin = CertFingerprint::of_der(&der[0]).to_string();
    let stream = "acme/app/flags";

    // --addr and --ca-file (the broker is not on the default address).
    let out = run(
        felix(cwd.path()).args([
            "streams",
            "create",
            "--stream",
            stream,
            "--addr",
            &addr,
            "--ca-file",
            &ca_s,
        ]),
        "",
    );
    assert_eq!(
        quiet_success(&out, "streams create --ca-file"),
        "acme/app/flags shards=1 retention_bytes=0 retention_ms=0\n"
    );

    // --fingerprint, and the publish flags --ack and --linger-us.
    let out = run(
        felix(cwd.path()).args([
            "publish",
            "--stream",
            stream,
            "--addr",
            &addr,
            "--fingerprint",
            &pin,
            "--ack",
            "written",
            "--linger-us",
            "100",
            "--json",
            "--quiet",
        ]),
        "one\ntwo\n",
    );
    let acks = quiet_success(&out, "publish --fingerprint");
    assert_eq!(acks.lines().count(), 2, "{acks}");
    assert!(acks.lines().all(|l| l.contains("\"offset\"")), "acked: {acks}");

    // --danger-accept-any-cert.
    let out = run(
        felix(cwd.path()).args([
            "subscribe",
            "--stream",
            stream,
            "--from",
            "earliest",
            "-c",
            "2",
            "--addr",
            &addr,
            "--danger-accept-any-cert",
        ]),
        "",
    );
    assert_eq!(quiet_success(&out, "subscribe --danger-accept-any-cert"), "one\ntwo\n");

    // --server-name: the certificate does not carry a wrong name, and does carry its own.
    let list = |name: &str| {
        run(
            felix(cwd.path()).args([
                "streams",
                "list",
                "--addr",
                &addr,
                "--ca-file",
                &ca_s,
                "--server-name",
                name,
            ]),
            "",
        )
    };
    let wrong = list("wrong.example");
    assert!(!wrong.status.success(), "a wrong --server-name was not applied");
    assert!(text(&wrong.stderr).contains("certificate"), "{}", text(&wrong.stderr));
    assert_eq!(quiet_success(&list("localhost"), "streams list --server-name"), "acme/app/flags\n");

    // Without trust from a flag, the environment or a dev certificate: a configuration error.
    let out = run(felix(cwd.path()).args(["streams", "list", "--addr", &addr]), "");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no trust configured"), "{}", text(&out.stderr));
}

#[test]
fn show_config_and_felix_log_print_more_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &[]);
    let addr = broker.addr.to_string();
    let ca = dir.path().join("dev-cert.pem").display().to_string();
    let base = ["streams", "list", "--addr", &addr, "--ca-file", &ca];

    quiet_success(&run(felix(cwd.path()).args(base), ""), "streams list");

    let out = run(felix(cwd.path()).args(base).arg("--show-config"), "");
    assert!(out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("addr={addr}")), "--show-config: {err}");
    assert!(err.contains(&format!("trust=ca-file {ca}")), "--show-config: {err}");

    let out = run(felix(cwd.path()).args(base).env("FELIX_LOG", "info"), "");
    assert!(out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("INFO") && err.contains("client configuration"), "FELIX_LOG: {err}");

    // The environment twins still work, and a flag beats its twin.
    let out = run(
        felix(cwd.path())
            .args(["streams", "list", "--ca-file", &ca])
            .env("FELIX_ADDR", &addr)
            .env("FELIX_CERT_FINGERPRINT", "00".repeat(32)),
        "",
    );
    quiet_success(&out, "FELIX_ADDR with --ca-file over FELIX_CERT_FINGERPRINT");
}
