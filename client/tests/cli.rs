//! The `felix publish|subscribe|streams` commands against the test broker, with in-memory
//! stdin and stdout.

mod support;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use clap::Parser;
use felix_client::cli::{run_with_io, ClientCommand};
use support::{BrokerOptions, TestBroker};

#[derive(Debug, clap::Parser)]
struct Felix {
    #[command(subcommand)]
    cmd: ClientCommand,
}

/// An AsyncWrite that keeps what was written.
#[derive(Clone, Default)]
struct Out(Arc<Mutex<Vec<u8>>>);

impl Out {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl tokio::io::AsyncWrite for Out {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

async fn felix(broker: &TestBroker, args: &[&str], stdin: &str) -> anyhow::Result<String> {
    felix_with(broker.client_config(), args, stdin).await
}

async fn felix_with(
    config: felix_client::ClientConfig,
    args: &[&str],
    stdin: &str,
) -> anyhow::Result<String> {
    let mut argv = vec!["felix"];
    argv.extend_from_slice(args);
    let cmd = Felix::try_parse_from(argv)?.cmd;
    let out = Out::default();
    let input = tokio::io::BufReader::new(std::io::Cursor::new(stdin.as_bytes().to_vec()));
    let run = run_with_io(cmd, config, input, out.clone());
    tokio::time::timeout(std::time::Duration::from_secs(30), run).await??;
    Ok(out.text())
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[tokio::test]
async fn streams_create_list_describe() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let out = felix(&broker, &["streams", "create", "--stream", "acme/app/a", "--shards", "3"], "")
        .await
        .unwrap();
    assert_eq!(out, "acme/app/a shards=3 retention_bytes=0 retention_ms=0\n");
    felix(&broker, &["streams", "create", "--stream", "acme/app/b"], "").await.unwrap();
    assert_eq!(felix(&broker, &["streams", "list"], "").await.unwrap(), "acme/app/a\nacme/app/b\n");
    let out = felix(&broker, &["streams", "describe", "--stream", "acme/app/a", "--json"], "")
        .await
        .unwrap();
    assert_eq!(json_lines(&out)[0]["shards"], 3);
    assert!(felix(&broker, &["streams", "describe", "--stream", "acme/app/zz"], "").await.is_err());
}

#[tokio::test]
async fn publish_lines_then_subscribe_them_back() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream("acme/app/log", 4);
    let out = felix(
        &broker,
        &[
            "publish",
            "--stream",
            "acme/app/log",
            "--key-separator",
            ":",
            "--ack",
            "durable",
            "--json",
        ],
        "u1:hello\nu2:world\n\nno-key-line\r\nu1:again\n",
    )
    .await
    .unwrap();
    let acks = json_lines(&out);
    assert_eq!(acks.len(), 4, "empty lines are skipped: {out}");
    assert_eq!(acks[0]["key"], "u1");
    assert_eq!(acks[2]["key"], serde_json::Value::Null);
    assert!(acks.iter().all(|a| a["offset"].is_u64() && a["shard"].is_u64()));
    let shard_u1 = felix_proto::shard_for_key(b"u1", 4).0;
    assert_eq!(acks[0]["shard"], shard_u1);
    assert_eq!(acks[3]["shard"], shard_u1);
    assert!(acks[3]["offset"].as_u64() > acks[0]["offset"].as_u64());

    // Plain output, all records, then JSON with a group that commits what it printed.
    let out = felix(
        &broker,
        &["subscribe", "--stream", "acme/app/log", "--from", "earliest", "--count", "4", "-K", "="],
        "",
    )
    .await
    .unwrap();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, vec!["=no-key-line", "u1=again", "u1=hello", "u2=world"]);

    let args = [
        "subscribe",
        "--stream",
        "acme/app/log",
        "--from",
        "earliest",
        "--group",
        "g",
        "--count",
        "2",
        "--json",
    ];
    let first = json_lines(&felix(&broker, &args, "").await.unwrap());
    let second = json_lines(&felix(&broker, &args, "").await.unwrap());
    let mut seen: Vec<(u64, u64)> = first
        .iter()
        .chain(second.iter())
        .map(|r| (r["shard"].as_u64().unwrap(), r["offset"].as_u64().unwrap()))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 4, "the group resumed after its commits");
    assert!(first.iter().all(|r| r["stream"] == "acme/app/log" && r["value"].is_string()));
}

#[tokio::test]
async fn publish_with_a_fixed_key_and_binary_values_in_json() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    broker.create_stream("acme/app/bin", 2);
    felix(&broker, &["publish", "--stream", "acme/app/bin", "--key", "K"], "a\nb\n").await.unwrap();
    {
        let o = broker.state.lock();
        let shard = felix_proto::shard_for_key(b"K", 2).0 as usize;
        let stored: Vec<_> =
            o.streams["acme/app/bin"].shards[shard].iter().map(|r| r.value.clone()).collect();
        assert_eq!(stored, vec![bytes::Bytes::from("a"), bytes::Bytes::from("b")]);
    }
    // A non-UTF-8 payload comes out as value_b64, a UTF-8 one as value.
    broker.create_stream("acme/app/raw", 1);
    broker.state.lock().streams.get_mut("acme/app/raw").unwrap().shards[0].push(support::Stored {
        timestamp_ms: 1,
        key: Some(bytes::Bytes::from_static(b"k")),
        value: bytes::Bytes::from_static(&[0xff, 0xfe]),
    });
    let out = felix(
        &broker,
        &["subscribe", "--stream", "acme/app/raw", "--from", "earliest", "-c", "1", "--json"],
        "",
    )
    .await
    .unwrap();
    let rec = &json_lines(&out)[0];
    assert_eq!(rec["value_b64"], "//4=", "{rec}");
    assert_eq!(rec["key"], "k");
    assert_eq!(rec["timestamp_ms"], 1);
    assert!(rec.get("value").is_none());
}

#[tokio::test]
async fn publish_and_subscribe_through_a_list_of_seeds() {
    let cluster = support::cluster::MockCluster::start(3).await;
    let owners = [0, 1, 2];
    cluster.create_stream("acme/app/orders", &owners);
    // The flag's list wins over the configuration's address; the first seed is unreachable.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let seeds = format!("{},{}", silent.local_addr().unwrap(), cluster.broker(2).addr);
    let mut config = cluster.client_config(&[0]);
    config.connect_timeout_ms = 500;
    let input: String = (0..12).map(|i| format!("k{i}:v{i}\n")).collect();
    let args = ["publish", "-s", "acme/app/orders", "-K", ":", "--json", "--addr", &seeds];
    let out = felix_with(config.clone(), &args, &input).await.unwrap();
    let receipts = json_lines(&out);
    assert_eq!(receipts.len(), 12);
    for r in &receipts {
        let (shard, key) = (r["shard"].as_u64().unwrap() as usize, r["key"].as_str().unwrap());
        let at_owner = cluster.stored(owners[shard], "acme/app/orders");
        assert!(at_owner[shard].iter().any(|s| s.key.as_deref() == Some(key.as_bytes())));
    }
    let stored: usize = (0..3)
        .map(|m| cluster.stored(m, "acme/app/orders").iter().map(Vec::len).sum::<usize>())
        .sum();
    assert_eq!(stored, 12, "each record stored once");
    let args =
        ["subscribe", "-s", "acme/app/orders", "--from", "earliest", "-c", "12", "--addr", &seeds];
    let out = felix_with(config, &args, "").await.unwrap();
    let mut values: Vec<&str> = out.lines().collect();
    values.sort_unstable();
    let mut want: Vec<String> = (0..12).map(|i| format!("v{i}")).collect();
    want.sort_unstable();
    assert_eq!(values, want);
}
