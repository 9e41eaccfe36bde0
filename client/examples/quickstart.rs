//! Quickstart: TLS trust, publish with acks, keyed routing, subscribe with a consumer group.
//!
//! Against a running broker (its dev certificate pinned by fingerprint):
//!
//! ```sh
//! FELIX_ADDR=127.0.0.1:7400 FELIX_CERT_FINGERPRINT=<sha256 hex> \
//!     cargo run -p felix-client --example quickstart
//! ```
//!
//! `client/tests/quickstart.rs` runs `run` against the test broker, and `docs/client.md` holds
//! this file verbatim.

use felix_client::{
    AckMode, Client, ClientConfig, ConfigError, PublishSettings, Record, Retention, StartAt,
    SubscribeOptions, Trust,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Trust and everything else from FELIX_* variables (docs/client.md lists them).
    let config = match ClientConfig::from_env() {
        Ok(config) => config,
        Err(ConfigError::NoTrust) => {
            eprintln!("set FELIX_CERT_FINGERPRINT or FELIX_CA_FILE (see docs/client.md)");
            std::process::exit(2);
        }
        Err(e) => return Err(e.into()),
    };
    run(config).await
}

/// The two ways to trust a broker, built in code.
pub fn trust_in_code() -> Result<[ClientConfig; 2], ConfigError> {
    // Pin the broker's (dev) certificate: SHA-256 of its DER bytes, hex, colons optional.
    let pin = "3a:5f:0c:9e:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99:aa:bb:cc";
    let pinned = ClientConfig::new("127.0.0.1:7400", Trust::Fingerprint(pin.parse()?));
    // Or trust a CA (or the broker's own certificate) from a PEM or DER file; the certificate
    // must name `server_name`.
    let mut with_ca = ClientConfig::new("broker.example:7400", Trust::CaFile("ca.pem".into()));
    with_ca.server_name = "broker.example".into();
    Ok([pinned, with_ca])
}

/// Publishes with acks and keys, then reads everything back as a consumer group.
pub async fn run(config: ClientConfig) -> anyhow::Result<()> {
    let client = Client::connect(config).await?;
    println!(
        "connected: {} connections reaching cores {:?} of {}",
        client.connection_count(),
        client.cores_reached(),
        client.core_count()
    );

    let stream = "acme/shop/orders";
    // Answers the stream's settings; creating it again with the same settings is harmless.
    client.create_stream(stream, 4, Retention::default()).await?;

    // Publish with acks: each record resolves to its shard and offset once durable.
    let settings =
        PublishSettings { ack_mode: AckMode::Durable, linger_us: 500, ..Default::default() };
    let publisher = client.publisher_with(stream, settings).await?;
    let receipt = publisher.publish(Record::unkeyed("hello")).await?;
    println!("unkeyed record stored at {receipt:?}");

    // Keyed routing: every record of a key goes to the key's shard, in order. `send` only
    // queues the record (it is batched with others); the ticket resolves on the ack.
    let mut tickets = Vec::new();
    for i in 0..3 {
        tickets.push(publisher.send(Record::keyed("customer-42", format!("order {i}"))).await?);
    }
    for ticket in tickets {
        let receipt = ticket.await?.expect("durable publishes are acked");
        assert_eq!(Some(receipt.shard), publisher.shard_for_key(b"customer-42"));
        println!("order stored at shard {} offset {}", receipt.shard.0, receipt.offset.0);
    }
    publisher.close().await?;

    // Subscribe as the consumer group "billing": it resumes after its last commit, else at
    // the earliest record.
    let options = SubscribeOptions::new(stream).start(StartAt::Earliest).group("billing");
    let mut subscription = client.subscribe(options).await?;
    for _ in 0..4 {
        let Some(record) = subscription.next().await? else { break };
        println!(
            "shard {} offset {} key {:?}: {}",
            record.shard.0,
            record.offset.0,
            record.key.as_deref().map(String::from_utf8_lossy),
            String::from_utf8_lossy(&record.value)
        );
    }
    // Commit what was processed: the next member of the group starts after it.
    subscription.commit_consumed().await?;
    client.close();
    Ok(())
}
