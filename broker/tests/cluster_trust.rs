//! Issue 41, items 5 and 10: a broker whose certificate its peers do not trust (here one
//! started with its own development certificate beside two that share one) joins the cluster
//! but gets no replicas, and the failure is logged on both sides with the flags that fix it;
//! before, it was the least loaded broker, got every shard of the next stream with an in-sync
//! set of itself alone, and every publish then failed while no broker logged anything.

mod cluster_support;
mod e2e_support;

use std::time::{Duration, Instant};

use cluster_support::{status, Hosts, Node};
use e2e_support::{retrying_client_config, WAIT};
use felix_client::Client;
use felix_cluster::testing::Etcd;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_its_peers_do_not_trust_gets_no_replicas_and_both_sides_say_why() {
    let hosts = std::rc::Rc::new(Hosts::new(3));
    let Some(etcd) = Etcd::start_on(&hosts.test_ip().to_string()) else { return };
    let root = tempfile::tempdir().unwrap();
    let url = etcd.client_url.clone();
    let extra = ["--default-replicas", "2"];
    let b1 = Node::start_with(&hosts, 0, "b1", root.path(), &url, &extra);
    let deadline = Instant::now() + WAIT;
    while !(b1.dir.join("dev-cert.pem").exists() && b1.dir.join("dev-key.pem").exists()) {
        assert!(Instant::now() < deadline, "b1 made no certificate: {}", b1.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    // b2 shares b1's certificate (they trust each other); b3 makes its own.
    let b2_dir = root.path().join("b2");
    std::fs::create_dir_all(&b2_dir).unwrap();
    for f in ["dev-cert.pem", "dev-key.pem"] {
        std::fs::copy(b1.dir.join(f), b2_dir.join(f)).unwrap();
    }
    let b2 = Node::start_with(&hosts, 1, "b2", root.path(), &url, &extra);
    let b3 = Node::start_with(&hosts, 2, "b3", root.path(), &url, &extra);
    let nodes = [&b1, &b2, &b3];

    // All three are members; b3 stays unverified.
    let deadline = Instant::now() + WAIT;
    loop {
        let st = status(&url);
        let members = st["members"].as_array().cloned().unwrap_or_default();
        let verified = |id: &str| {
            members.iter().any(|m| {
                m["member"]["node"] == id
                    && m["member"]["peers_verified"] == serde_json::json!(true)
            })
        };
        if members.len() == 3 && verified("b1") && verified("b2") {
            assert!(!verified("b3"), "b3 verified with a certificate nobody trusts: {st:#}");
            break;
        }
        assert!(Instant::now() < deadline, "members not verified: {st:#}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Streams of two replicas land on b1 and b2 only, and take durable publishes.
    let config = retrying_client_config(&b1.addr.to_string(), &b1.dir.join("dev-cert.pem"));
    let client = Client::connect(config).await.expect("client");
    for i in 0..3 {
        let name = format!("acme/app/trust{i}");
        client.create_stream(&name, 4, Default::default()).await.expect("create");
        let publisher = client.publisher(&name).await.unwrap();
        let t = publisher.send(felix_client::Record::keyed("k", b"v".to_vec())).await.unwrap();
        let acked = tokio::time::timeout(Duration::from_secs(30), t).await.expect("ack stalled");
        assert!(matches!(acked, Ok(Some(_))), "{name}: {acked:?}");
    }
    let st = status(&url);
    for stream in st["streams"].as_array().unwrap() {
        let text = stream.to_string();
        assert!(!text.contains("\"b3\""), "b3 holds a replica: {stream:#}");
    }

    // Both sides said why, naming the flags that fix it.
    let deadline = Instant::now() + WAIT;
    loop {
        let said = |n: &Node| {
            let log = n.log_text();
            log.contains("replication link not verified") && log.contains("--peer-ca")
        };
        if said(&b3) && (said(&b1) || said(&b2)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the untrusted link was not logged on both sides:\n{}",
            nodes.iter().map(|n| format!("== {}\n{}", n.id, n.log_text())).collect::<String>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
