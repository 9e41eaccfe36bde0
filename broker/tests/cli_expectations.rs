//! The `felix` command line as kcat, rpk and `nats` users expect it (issue 47), through the
//! real binary: tokens from a flag or a file, errors that say what to do, exit statuses,
//! `publish`'s summary and Ctrl-C, `subscribe --exit-at-end`, output flushed when the input
//! pauses, shell completions and the man page.

mod e2e_support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use e2e_support::{spawn_felix_cores, TestBroker, WAIT};
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// The `felix` binary with no `FELIX_*` variable set, run in `cwd`, trusting the broker whose
/// data directory is `data`.
fn felix(cwd: &Path, addr: &str, data: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FELIX_")) {
        cmd.env_remove(k);
    }
    cmd.current_dir(cwd).env("FELIX_ADDR", addr).env("FELIX_CA_FILE", data.join("dev-cert.pem"));
    cmd
}

/// Runs `cmd` with `stdin`, killed after [`WAIT`].
fn run(cmd: &mut Command, stdin: &str) -> Output {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let pid = child.id();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(WAIT) {
            signal(pid, "KILL");
        }
    });
    let out = child.wait_with_output().unwrap();
    drop(done_tx);
    watchdog.join().unwrap();
    out
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status();
    assert!(status.unwrap().success(), "kill -{sig} {pid}");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A running command whose stdout lines arrive on a channel.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn spawn(cmd: &mut Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Running { child, lines }
    }

    fn write(&mut self, input: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// The next `n` stdout lines, each within [`WAIT`]: they come while the command runs, so
    /// its output was written when its input paused, not at its end.
    fn lines(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| self.lines.recv_timeout(WAIT).unwrap_or_else(|_| panic!("line {i} of {n}")))
            .collect()
    }

    /// Waits for the exit (killed after [`WAIT`]): the status code and stderr.
    fn wait(mut self) -> (Option<i32>, String) {
        let deadline = std::time::Instant::now() + WAIT;
        while self.child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the command did not exit");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = self.child.wait_with_output().unwrap();
        (out.status.code(), text(&out.stderr))
    }
}

#[test]
fn publish_summarises_on_stderr_and_subscribe_exits_at_end() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let addr = broker.addr.to_string();
    let felix = || felix(cwd.path(), &addr, dir.path());
    let stream = "acme/app/lines";
    let out = run(felix().args(["streams", "create", "-s", stream, "--shards", "3"]), "");
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = run(felix().args(["publish", "-s", stream, "-K", ":"]), "a:1\n\nb:2\nc:3\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!("felix: publish to {stream}: 3 sent, 3 acked, 0 failed\n")
    );
    let out = run(felix().args(["publish", "-s", stream, "--quiet"]), "d\ne\n");
    assert!(out.status.success());
    assert_eq!(text(&out.stderr), "", "--quiet");

    // Every shard read up to its end as of the start, then the command exits.
    let out = run(felix().args(["subscribe", "-s", stream, "-o", "earliest", "--exit-at-end"]), "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut got: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    got.sort();
    assert_eq!(got, ["1", "2", "3", "d", "e"]);
    let out = run(felix().args(["subscribe", "-s", stream, "-o", "latest", "-e"]), "");
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "", "from the end: nothing to read");
    let out =
        run(felix().args(["subscribe", "-s", stream, "-o", "earliest", "-e", "--shard", "1"]), "");
    assert!(out.status.success());
    assert!(text(&out.stdout).lines().count() < 5, "one shard of three");

    // A shard the stream does not have is named as such.
    let out = run(felix().args(["subscribe", "-s", stream, "--shard", "99"]), "");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!("felix: shard 99 does not exist: {stream} has 3 shards, 0 to 2\n")
    );
}

#[test]
fn output_is_flushed_when_the_input_pauses_and_ctrl_c_stops_both_commands() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let addr = broker.addr.to_string();
    let felix = || felix(cwd.path(), &addr, dir.path());
    let stream = "acme/app/follow";
    assert!(run(felix().args(["streams", "create", "-s", stream]), "").status.success());

    let subscriber = Running::spawn(felix().args(["subscribe", "-s", stream, "-o", "earliest"]));
    let mut publisher = Running::spawn(felix().args(["publish", "-s", stream, "--json"]));
    publisher.write("one\ntwo\n");
    let acks = publisher.lines(2);
    assert!(acks.iter().all(|l| l.contains("\"offset\"")), "{acks:?}");
    assert_eq!(subscriber.lines(2), ["one", "two"]);

    // The first Ctrl-C: publish stops reading (its stdin is still open), waits for its acks,
    // prints the summary and exits 0; subscribe stops following.
    signal(publisher.child.id(), "INT");
    let (code, stderr) = publisher.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stderr,
        format!("felix: publish to {stream} interrupted: 2 sent, 2 acked, 0 failed\n")
    );
    signal(subscriber.child.id(), "INT");
    let (code, stderr) = subscriber.wait();
    assert_eq!((code, stderr.as_str()), (Some(0), ""));
}

#[test]
fn ctrl_c_waits_a_bounded_time_for_acks_and_a_second_one_exits_at_once() {
    let data = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let addr = e2e_support::free_addr();
    let broker = spawn_felix_cores(data.path(), &addr, 1, &[]);
    let felix = || felix(cwd.path(), &addr, data.path());
    let stream = "acme/app/stuck";
    let deadline = std::time::Instant::now() + WAIT;
    while !run(felix().args(["streams", "create", "-s", stream]), "").status.success() {
        assert!(std::time::Instant::now() < deadline, "broker did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let broker_pid = broker.0.id();
    for second in [false, true] {
        let mut publisher = Running::spawn(
            felix().args(["publish", "-s", stream, "--json"]).env("FELIX_ACK_TIMEOUT_MS", "60000"),
        );
        publisher.write("acked\n");
        publisher.lines(1);
        // The broker stops answering: the next record is sent and never acked.
        signal(broker_pid, "STOP");
        publisher.write("unacked\n");
        // Time to read and send it (nothing shows that it was sent: no ack comes).
        std::thread::sleep(Duration::from_millis(1000));
        signal(publisher.child.id(), "INT");
        if second {
            std::thread::sleep(Duration::from_millis(100));
            signal(publisher.child.id(), "INT");
        }
        let started = std::time::Instant::now();
        let (code, stderr) = publisher.wait();
        signal(broker_pid, "CONT");
        if second {
            assert_eq!(code, Some(130), "{stderr}");
            assert!(
                started.elapsed()
                    < Duration::from_millis(felix_client::cli::PUBLISH_INTERRUPT_WAIT_MS),
                "the second Ctrl-C did not exit at once"
            );
        } else {
            assert_eq!(code, Some(1), "{stderr}");
            assert!(
                stderr.contains("interrupted: 2 sent, 1 acked, 1 failed (1 unconfirmed after 5 s)"),
                "{stderr}"
            );
        }
    }
}

#[test]
fn errors_say_what_to_do_and_exit_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &[]);
    let addr = broker.addr.to_string();

    // A missing CA file is a configuration error: exit 2, said once.
    let out = run(
        felix(cwd.path(), &addr, dir.path()).args(["streams", "list", "--ca-file", "/no/ca.pem"]),
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.matches("/no/ca.pem").count(), 1, "{err}");
    assert!(err.starts_with("felix: CA file /no/ca.pem: "), "{err}");

    // Nothing listens on the port: refused at once (whatever the connect timeout), named.
    let closed = e2e_support::free_addr();
    let out = run(
        felix(cwd.path(), &closed, dir.path())
            .args(["streams", "list"])
            .env("FELIX_CONNECT_TIMEOUT_MS", "60000"),
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{closed} refused the connection")), "{err}");
    assert!(err.contains(&format!("is a broker running at {closed}?")), "{err}");

    // Something holds the port and never answers: the timeout, and the addresses tried.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let silent = silent.local_addr().unwrap().to_string();
    let seeds = format!("{silent},{closed}");
    let out = run(
        felix(cwd.path(), &seeds, dir.path())
            .args(["streams", "list"])
            .env("FELIX_CONNECT_TIMEOUT_MS", "300"),
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with(&format!("felix: cannot connect to {silent}, {closed}: ")), "{err}");
    assert!(err.contains(&format!("is a broker running at {silent}, {closed}?")), "{err}");

    // Ctrl-C while it waits for an answer: 130, at once.
    let waiting = Running::spawn(
        felix(cwd.path(), &silent, dir.path())
            .args(["streams", "list"])
            .env("FELIX_CONNECT_TIMEOUT_MS", "60000"),
    );
    std::thread::sleep(Duration::from_millis(300));
    signal(waiting.child.id(), "INT");
    let (code, err) = waiting.wait();
    assert_eq!((code, err.as_str()), (Some(130), "felix: interrupted\n"));
}

struct Signer {
    key: EncodingKey,
}

fn signer(dir: &Path) -> (Signer, String) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let public = dir.join("key.pub.pem");
    std::fs::write(&public, kp.public_key_pem()).unwrap();
    let key = EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).unwrap();
    (Signer { key }, public.display().to_string())
}

fn token(s: &Signer, namespace: &str, actions: &[&str]) -> String {
    let exp =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let claims = serde_json::json!({
        "tenant": "acme", "exp": exp,
        "permissions": [{ "actions": actions, "namespace": namespace, "stream": "*" }],
    });
    jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &s.key).unwrap()
}

#[test]
fn tokens_come_from_a_flag_or_a_file_and_refusals_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let (signer, public) = signer(cwd.path());
    let broker = TestBroker::start(dir.path(), 2, &["--auth-keys", &public]);
    let addr = broker.addr.to_string();
    let felix = || felix(cwd.path(), &addr, dir.path());
    let stream = "acme/app/secured";
    let full = token(&signer, "app", &["publish", "subscribe"]);
    let read_only = cwd.path().join("read-only.jwt");
    std::fs::write(&read_only, format!("{}\n", token(&signer, "app", &["subscribe"]))).unwrap();
    let elsewhere = token(&signer, "other", &["publish", "subscribe"]);

    // No token: the refusal says how to give one.
    let out = run(felix().args(["streams", "list"]), "");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("requires a token") && err.contains("--token or --token-file"), "{err}");

    let out = run(felix().args(["streams", "create", "-s", stream, "--token", &full]), "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(felix().args(["publish", "-s", stream, "-q"]).env("FELIX_TOKEN", &full), "x\n");
    assert!(out.status.success(), "FELIX_TOKEN: {}", text(&out.stderr));

    // A token that may only subscribe: each record fails, named by line and key.
    let out = run(
        felix().args(["publish", "-s", stream, "-K", ":", "--token-file"]).arg(&read_only),
        "k1:v1\n\nk2:v2\nnokey\n",
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("does not allow Publish"), "{err}");
    assert!(err.contains(": 3 sent, 0 acked, 3 failed"), "{err}");
    assert!(
        err.contains("failed: line 1 (key \"k1\"), line 3 (key \"k2\"), line 4 (no key)"),
        "{err}"
    );
    // The file through its environment twin reads.
    let out = run(
        felix()
            .args(["subscribe", "-s", stream, "-o", "earliest", "-e"])
            .env("FELIX_TOKEN_FILE", &read_only),
        "",
    );
    assert_eq!(
        (text(&out.stdout).as_str(), out.status.code()),
        ("x\n", Some(0)),
        "{}",
        text(&out.stderr)
    );

    // A token with no right on the stream: publish hears of Publish, not of Read.
    let out = run(felix().args(["publish", "-s", stream, "--token", &elsewhere]), "x\n");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("the token does not allow Publish on {stream}")), "{err}");
    assert!(!err.contains("Read"), "{err}");
}

#[test]
fn completions_and_the_man_page_come_from_the_clap_definitions() {
    let felix = || Command::new(env!("CARGO_BIN_EXE_felix"));
    for (shell, marker) in
        [("bash", "_felix()"), ("zsh", "#compdef felix"), ("fish", "complete -c felix")]
    {
        let out = run(felix().args(["completions", shell]), "");
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: no {marker:?}");
        for flag in ["exit-at-end", "token-file", "quiet", "danger-accept-any-cert"] {
            assert!(script.contains(flag), "{shell}: --{flag} not completed");
        }
    }
    let out = run(felix().args(["completions", "tcsh"]), "");
    assert_eq!(out.status.code(), Some(2), "an unknown shell is a usage error");
    let out = run(felix().arg("man"), "");
    assert!(out.status.success());
    let page = text(&out.stdout);
    assert!(page.contains(".TH felix 1"), "{page}");
    for command in ["serve", "publish", "subscribe", "streams", "completions"] {
        assert!(page.contains(command), "the man page lacks {command}");
    }
}
