//! Issue 41, items 5 and 10: the commands of docs/operations.md ("A cluster's certificates")
//! and docs/cluster.md ("The broker in a cluster") run as written: the openssl recipe makes a
//! CA and three broker certificates, three `felix serve` started with the documented command
//! (each in a network namespace of its own) verify each other, and the documented client
//! commands create a 3-replica stream and publish 100 durable records into it.
//!
//! Each block is the fenced `sh` block after a `<!-- run by broker/tests/docs_cluster.rs: NAME -->`
//! line; the test fails if a marked block is missing.

mod cluster_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cluster_support::{status, Hosts};
use felix_cluster::testing::Etcd;

/// The `sh` block after the marker `name` in `doc`.
fn block(doc: &str, name: &str) -> String {
    let marker = format!("<!-- run by broker/tests/docs_cluster.rs: {name} -->");
    let after = doc.split_once(&marker).unwrap_or_else(|| panic!("no block {name:?}")).1;
    let body = after.split_once("```sh\n").expect("a sh block after the marker").1;
    body.split_once("\n```").expect("the block's end").0.to_owned()
}

/// `PATH` with the directory of the `felix` binary under test first.
fn path_with_felix() -> String {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_felix")).parent().unwrap().to_owned();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

/// Kills a process group when dropped (the brokers started through `bash -c`).
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-s", "KILL", "--", &group]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_documented_cluster_commands_run_as_written() {
    let hosts = Hosts::new(3);
    if !hosts.isolated() {
        eprintln!("SKIPPED: needs network namespaces (root)");
        return;
    }
    if Command::new("openssl").arg("version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "openssl is not installed");
        eprintln!("SKIPPED: openssl is not installed");
        return;
    }
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let etcd_endpoint = etcd.client_url.trim_start_matches("http://").to_owned();
    let operations = include_str!("../../docs/operations.md");
    let cluster = include_str!("../../docs/cluster.md");
    let dir = tempfile::tempdir().unwrap();
    let path = path_with_felix();

    let certs = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block(operations, "cluster certificates")])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(certs.status.success(), "the certificate recipe failed: {certs:?}");
    for f in ["ca.pem", "b1.pem", "b1-key.pem", "b3.pem", "b3-key.pem"] {
        assert!(dir.path().join(f).exists(), "the recipe made no {f}");
    }

    let serve = block(cluster, "cluster serve");
    let brokers: Vec<Group> = (0..3)
        .map(|i| {
            let log = std::fs::File::create(dir.path().join(format!("b{}.log", i + 1))).unwrap();
            let mut cmd = hosts.command(i, "bash");
            cmd.args(["-c", &serve])
                .current_dir(dir.path())
                .env("PATH", &path)
                .env("ETCD", &etcd_endpoint)
                .env("NODE", format!("b{}", i + 1))
                .env("ADDR", hosts.ip(i).to_string())
                .stdout(Stdio::null())
                .stderr(log);
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            Group(cmd.spawn().unwrap())
        })
        .collect();
    let logs = || {
        (1..=3)
            .map(|i| {
                let log = std::fs::read_to_string(dir.path().join(format!("b{i}.log")));
                format!("== b{i}\n{}", log.unwrap_or_default())
            })
            .collect::<String>()
    };

    // The three verify each other as peers.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = status(&etcd.client_url);
        let members = st["members"].as_array().cloned().unwrap_or_default();
        let verified = members.iter().filter(|m| m["member"]["peers_verified"] == true).count();
        if verified == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "brokers not verified: {st:#}\n{}", logs());
        std::thread::sleep(Duration::from_millis(200));
    }

    let used = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block(cluster, "cluster use")])
        .current_dir(dir.path())
        .env("PATH", &path)
        .env("ETCD", &etcd_endpoint)
        .env("B1", hosts.ip(0).to_string())
        .env("B2", hosts.ip(1).to_string())
        .env("B3", hosts.ip(2).to_string())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&used.stdout);
    let err = String::from_utf8_lossy(&used.stderr);
    assert!(
        used.status.success(),
        "the documented client commands failed:\n{out}\n{err}\n{}",
        logs()
    );
    assert!(out.contains("acme/app/orders"), "status names the stream: {out}");
    let st = status(&etcd.client_url);
    let orders = st["streams"].as_array().unwrap().iter().find(|s| s["name"] == "acme/app/orders");
    let orders = orders.expect("the stream is defined");
    assert_eq!(orders["replicas"], 3, "{orders:#}");
    drop(brokers);
}
