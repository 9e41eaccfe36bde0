//! Authentication and tenancy end to end: tokens signed with Ed25519 (EdDSA) and P-256
//! (ES256), verified against the configured public keys.

mod e2e_support;

use e2e_support::{raw_connection, read_frames, TestBroker};
use felix_client::{Client, Record, StartAt, SubscribeOptions};
use felix_proto::{Capabilities, ErrorCode, Frame, Hello, PROTOCOL_VERSION};
use jsonwebtoken::{Algorithm, EncodingKey, Header};

struct Signer {
    key: EncodingKey,
    alg: Algorithm,
}

fn keypair(
    alg: &'static rcgen::SignatureAlgorithm,
    dir: &std::path::Path,
    name: &str,
) -> (Signer, std::path::PathBuf) {
    let kp = rcgen::KeyPair::generate_for(alg).unwrap();
    let public = dir.join(format!("{name}.pub.pem"));
    std::fs::write(&public, kp.public_key_pem()).unwrap();
    let pem = kp.serialize_pem();
    let (key, alg) = if alg == &rcgen::PKCS_ED25519 {
        (EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(), Algorithm::EdDSA)
    } else {
        (EncodingKey::from_ec_pem(pem.as_bytes()).unwrap(), Algorithm::ES256)
    };
    (Signer { key, alg }, public)
}

fn token(s: &Signer, tenant: &str, exp_in_s: i64, actions: &[&str]) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
        as i64;
    let claims = serde_json::json!({
        "tenant": tenant,
        "exp": now + exp_in_s,
        "permissions": [{ "actions": actions, "namespace": "app*", "stream": "*" }],
    });
    jsonwebtoken::encode(&Header::new(s.alg), &claims, &s.key).unwrap()
}

async fn hello_error(broker: &TestBroker, token: Option<&str>) -> Option<ErrorCode> {
    let conn = raw_connection(broker.addr, &broker.dir).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Frame::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::ALL,
        token: token.map(|t| bytes::Bytes::copy_from_slice(t.as_bytes())),
    });
    send.write_all(&hello.to_bytes()).await.unwrap();
    match read_frames(&mut recv, 1).await.first() {
        Some(Frame::HelloOk(_)) => None,
        Some(Frame::Error(e)) => Some(e.code),
        other => panic!("unexpected {other:?}"),
    }
}

/// The error of publishing one record to `stream` (creating the publisher may fail already).
async fn publish_error(client: &Client, stream: &str) -> String {
    match client.publisher(stream).await {
        Err(e) => e.to_string(),
        Ok(p) => p.publish(Record::unkeyed("x")).await.expect_err("publish must fail").to_string(),
    }
}

async fn client_with(broker: &TestBroker, token: String) -> Client {
    let mut c = broker.client_config();
    c.token = Some(token);
    Client::connect(c).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_scope_tenants_and_bad_tokens_get_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (ed, ed_pub) = keypair(&rcgen::PKCS_ED25519, keys.path(), "ed");
    let (ec, ec_pub) = keypair(&rcgen::PKCS_ECDSA_P256_SHA256, keys.path(), "ec");
    let (rogue, _) = keypair(&rcgen::PKCS_ED25519, keys.path(), "rogue");
    let key_list = format!("{},{}", ed_pub.display(), ec_pub.display());
    let broker = TestBroker::start(dir.path(), 2, &["--auth-keys", &key_list]);

    // Tenant A (EdDSA) publishes and reads its own stream.
    let a = client_with(&broker, token(&ed, "acme", 600, &["publish", "subscribe"])).await;
    a.publisher("acme/app/orders").await.unwrap().publish(Record::unkeyed("a1")).await.unwrap();
    let mut sub = a
        .subscribe(SubscribeOptions::new("acme/app/orders").start(StartAt::Earliest))
        .await
        .unwrap();
    let r = tokio::time::timeout(e2e_support::WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(&r.value[..], b"a1");

    // Tenant B (ES256) can neither publish to nor read tenant A's stream.
    let b = client_with(&broker, token(&ec, "globex", 600, &["publish", "subscribe"])).await;
    let err = publish_error(&b, "acme/app/orders").await;
    assert!(err.contains("Forbidden"), "{err}");
    let err = b
        .subscribe(SubscribeOptions::new("acme/app/orders").start(StartAt::Earliest))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("Forbidden"), "{err}");
    assert!(!b.list_streams("").await.unwrap().contains(&"acme/app/orders".to_owned()));
    // B's own namespace works; a namespace outside its patterns does not.
    b.publisher("globex/app1/x").await.unwrap().publish(Record::unkeyed("b2")).await.unwrap();
    let err = publish_error(&b, "globex/ops/x").await;
    assert!(err.contains("Forbidden"), "{err}");

    // A publish-only token cannot subscribe.
    let p = client_with(&broker, token(&ed, "acme", 600, &["publish"])).await;
    let err = p
        .subscribe(SubscribeOptions::new("acme/app/orders").start(StartAt::Earliest))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("Forbidden"), "{err}");

    // Bad tokens.
    assert_eq!(hello_error(&broker, None).await, Some(ErrorCode::Unauthenticated));
    assert_eq!(hello_error(&broker, Some("not-a-jwt")).await, Some(ErrorCode::InvalidToken));
    assert_eq!(
        hello_error(&broker, Some(&token(&rogue, "acme", 600, &["publish"]))).await,
        Some(ErrorCode::InvalidToken)
    );
    assert_eq!(
        hello_error(&broker, Some(&token(&ed, "acme", -10, &["publish"]))).await,
        Some(ErrorCode::TokenExpired)
    );
    assert_eq!(hello_error(&broker, Some(&token(&ec, "acme", 600, &["publish"]))).await, None);
}
