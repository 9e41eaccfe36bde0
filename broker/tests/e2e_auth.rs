//! Authentication and tenancy end to end: tokens signed with Ed25519 (EdDSA) and P-256
//! (ES256), verified against the configured public keys.

mod e2e_support;

use e2e_support::{raw_connection, read_frames, TestBroker};
use felix_client::{Client, Record, StartAt, SubscribeOptions};
use felix_proto::{Capabilities, ErrorCode, Frame, Hello, RequestId, Subscribe, PROTOCOL_VERSION};
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

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn claims(tenant: &str, exp_in_s: i64, actions: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "tenant": tenant,
        "exp": now_s() + exp_in_s,
        "permissions": [{ "actions": actions, "namespace": "app*", "stream": "*" }],
    })
}

fn sign(s: &Signer, claims: &serde_json::Value) -> String {
    jsonwebtoken::encode(&Header::new(s.alg), claims, &s.key).unwrap()
}

fn token(s: &Signer, tenant: &str, exp_in_s: i64, actions: &[&str]) -> String {
    sign(s, &claims(tenant, exp_in_s, actions))
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

    // Tenant A (EdDSA) publishes and reads its own stream (created explicitly: with auth,
    // streams need not be auto-created).
    let a = client_with(&broker, token(&ed, "acme", 600, &["publish", "subscribe"])).await;
    a.create_stream("acme/app/orders", 1, Default::default()).await.unwrap();
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
    b.create_stream("globex/app1/x", 1, Default::default()).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbf_and_iat_in_the_future_are_refused_beyond_the_leeway() {
    let dir = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (ed, ed_pub) = keypair(&rcgen::PKCS_ED25519, keys.path(), "ed");
    let broker = TestBroker::start(dir.path(), 1, &["--auth-keys", &ed_pub.display().to_string()]);
    let leeway = felix_broker::app::auth::TOKEN_LEEWAY_SECS as i64;
    let with = |claim: &str, in_s: i64| {
        let mut c = claims("acme", 600, &["publish"]);
        c[claim] = (now_s() + in_s).into();
        sign(&ed, &c)
    };
    // An hour ahead: refused.
    assert_eq!(hello_error(&broker, Some(&with("nbf", 3600))).await, Some(ErrorCode::InvalidToken));
    assert_eq!(hello_error(&broker, Some(&with("iat", 3600))).await, Some(ErrorCode::InvalidToken));
    // Just past the leeway: refused; within it (clock skew between issuer and broker): accepted.
    let past = leeway + 5;
    assert_eq!(hello_error(&broker, Some(&with("nbf", past))).await, Some(ErrorCode::InvalidToken));
    assert_eq!(hello_error(&broker, Some(&with("iat", past))).await, Some(ErrorCode::InvalidToken));
    assert_eq!(hello_error(&broker, Some(&with("nbf", leeway / 2))).await, None);
    assert_eq!(hello_error(&broker, Some(&with("iat", leeway / 2))).await, None);
    // In the past: accepted.
    assert_eq!(hello_error(&broker, Some(&with("nbf", -60))).await, None);
    assert_eq!(hello_error(&broker, Some(&with("iat", -60))).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_closed_with_token_expired_when_its_token_expires() {
    let dir = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (ed, ed_pub) = keypair(&rcgen::PKCS_ED25519, keys.path(), "ed");
    let broker = TestBroker::start(dir.path(), 2, &["--auth-keys", &ed_pub.display().to_string()]);
    let stream = "acme/app/expiring";
    let publisher = client_with(&broker, token(&ed, "acme", 600, &["publish"])).await;
    publisher.create_stream(stream, 1, Default::default()).await.unwrap();
    let p = publisher.publisher(stream).await.unwrap();
    p.publish(Record::unkeyed("before")).await.unwrap();

    // A raw subscriber whose token expires in a few seconds.
    let exp_s = now_s() + 4;
    let mut short = claims("acme", 0, &["subscribe"]);
    short["exp"] = exp_s.into();
    // And a Rust client subscriber on the same token.
    let subscriber = client_with(&broker, sign(&ed, &short)).await;
    let mut client_sub =
        subscriber.subscribe(SubscribeOptions::new(stream).start(StartAt::Earliest)).await.unwrap();
    let r = tokio::time::timeout(e2e_support::WAIT, client_sub.next()).await.unwrap();
    assert_eq!(&r.unwrap().unwrap().value[..], b"before");
    let conn = raw_connection(broker.addr, &broker.dir).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = Frame::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::ALL,
        token: Some(bytes::Bytes::from(sign(&ed, &short))),
    });
    send.write_all(&hello.to_bytes()).await.unwrap();
    let sub = Frame::Subscribe(Subscribe {
        request_id: RequestId(1),
        stream: stream.into(),
        shards: None,
        start: StartAt::Earliest,
        group: None,
        positions: None,
    });
    send.write_all(&sub.to_bytes()).await.unwrap();
    let frames = read_frames(&mut recv, 2).await;
    assert!(matches!(frames.last(), Some(Frame::SubscribeOk(_))), "{frames:?}");
    let mut uni = conn.accept_uni().await.unwrap();
    let values = |frames: &[Frame]| -> Vec<bytes::Bytes> {
        frames
            .iter()
            .filter_map(|f| match f {
                Frame::EventBatch(b) => Some(b.records.iter().map(|r| r.value.to_bytes())),
                _ => None,
            })
            .flatten()
            .collect()
    };
    let first = read_frames(&mut uni, 2).await;
    assert!(matches!(first.first(), Some(Frame::SubscriptionStart(_))), "{first:?}");
    assert_eq!(values(&first), vec![bytes::Bytes::from("before")]);

    // Past the expiry (plus a margin for the broker's timer), publish again with a valid token.
    let expired_at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(exp_s as u64);
    let wait = expired_at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(wait + std::time::Duration::from_millis(1500)).await;
    p.publish(Record::unkeyed("after")).await.unwrap();

    // The subscription delivers nothing more: its connection was closed with TokenExpired.
    let rest = read_frames(&mut uni, 1).await;
    assert!(values(&rest).is_empty(), "delivered after the token expired: {rest:?}");
    let reason = tokio::time::timeout(e2e_support::WAIT, conn.closed()).await.unwrap();
    match reason {
        quinn::ConnectionError::ApplicationClosed(close) => {
            assert_eq!(close.error_code.into_inner(), ErrorCode::TokenExpired as u64);
        }
        other => panic!("closed by {other:?}, not TokenExpired"),
    }
    // The client's subscription fails: its connection closed, and its resume is refused.
    let err = loop {
        match tokio::time::timeout(e2e_support::WAIT, client_sub.next()).await.unwrap() {
            Ok(Some(r)) => assert_ne!(&r.value[..], b"after", "delivered after the expiry"),
            Ok(None) => panic!("the client subscription ended without an error"),
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("TokenExpired"), "{err}");
}

/// The first `sh` block of the "Authentication" section of docs/operations.md.
fn documented_token_script() -> String {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let section = doc.split("\n## Authentication\n").nth(1).expect("an Authentication section");
    let block = section.split("```sh\n").nth(1).expect("a sh block in it");
    block.split("```").next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_key_pair_and_token_are_accepted() {
    if std::process::Command::new("openssl").arg("version").output().is_err() {
        println!("SKIPPED: no openssl command to run the documented example with");
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("sh")
        .args(["-euc", &documented_token_script()])
        .current_dir(keys.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "the documented script failed: {out:?}");
    let token = std::fs::read_to_string(keys.path().join("token.jwt")).unwrap();
    let public = keys.path().join("token-key.pub.pem");

    let auth = felix_broker::app::auth::Authenticator::load(std::slice::from_ref(&public)).unwrap();
    let grant = auth.verify(token.trim().as_bytes()).unwrap();
    assert_eq!(grant.tenant, "acme");
    assert_eq!(grant.exp - grant.iat.unwrap(), 3600);

    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 2, &["--auth-keys", &public.display().to_string()]);
    let client = client_with(&broker, token.trim().to_owned()).await;
    client.create_stream("acme/app/orders", 2, Default::default()).await.unwrap();
    client
        .publisher("acme/app/orders")
        .await
        .unwrap()
        .publish(Record::unkeyed("hi"))
        .await
        .unwrap();
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/orders").start(StartAt::Earliest))
        .await
        .unwrap();
    let r = tokio::time::timeout(e2e_support::WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(&r.value[..], b"hi");
    let err = publish_error(&client, "acme/ops/orders").await;
    assert!(err.contains("Forbidden"), "outside the token's namespaces: {err}");
}
