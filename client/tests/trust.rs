//! TLS trust: fingerprint pins (right, wrong, with colons), CA files, the danger option.

mod support;

use felix_client::{CertFingerprint, Client, ClientConfig, ClientError, Trust};
use support::{BrokerOptions, TestBroker};

fn with_trust(broker: &TestBroker, trust: Trust) -> ClientConfig {
    let mut c = broker.client_config();
    c.trust = Some(trust);
    c
}

#[tokio::test]
async fn a_client_pinned_to_a_wrong_fingerprint_is_refused() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let mut wrong = broker.fingerprint().0;
    wrong[0] ^= 0xff;
    let err = Client::connect(with_trust(&broker, Trust::Fingerprint(CertFingerprint(wrong))))
        .await
        .err()
        .expect("a wrong pin must not connect");
    match err {
        ClientError::CertificateRejected(why) => assert!(why.contains("does not match"), "{why}"),
        other => panic!("expected CertificateRejected, got {other}"),
    }
    assert_eq!(broker.state.lock().hellos, 0, "no Hello may reach a refused broker");
}

#[tokio::test]
async fn the_right_pin_connects_with_or_without_colons() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let hex = broker.fingerprint().to_string();
    let colons = hex
        .as_bytes()
        .chunks(2)
        .map(|c| std::str::from_utf8(c).unwrap().to_ascii_uppercase())
        .collect::<Vec<_>>()
        .join(":");
    for text in [hex, colons] {
        let pin: CertFingerprint = text.parse().unwrap();
        let client = Client::connect(with_trust(&broker, Trust::Fingerprint(pin))).await.unwrap();
        assert!(client.connection_count() >= 1);
        client.close();
    }
    // Through the environment too.
    let env = [
        ("FELIX_ADDR", broker.addr.to_string()),
        ("FELIX_CERT_FINGERPRINT", broker.fingerprint().to_string()),
    ];
    let client = Client::connect(ClientConfig::from_env_map(env).unwrap()).await.unwrap();
    client.list_streams("").await.unwrap();
}

#[tokio::test]
async fn a_ca_file_is_trusted_and_names_are_checked() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("broker.pem");
    std::fs::write(&pem, &broker.cert_pem).unwrap();
    let client = Client::connect(with_trust(&broker, Trust::CaFile(pem.clone()))).await.unwrap();
    client.list_streams("").await.unwrap();
    let der = Trust::CaCertificates(vec![broker.cert.clone()]);
    Client::connect(with_trust(&broker, der)).await.unwrap();
    // The certificate is for "localhost": another name is refused.
    let mut other_name = with_trust(&broker, Trust::CaFile(pem));
    other_name.server_name = "broker.example".into();
    let err = Client::connect(other_name).await.err().expect("wrong name must not connect");
    assert!(matches!(err, ClientError::CertificateRejected(_)), "{err}");
}

#[tokio::test]
async fn a_ca_file_of_another_broker_is_refused() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("other.pem");
    std::fs::write(&pem, other.cert.pem()).unwrap();
    let err = Client::connect(with_trust(&broker, Trust::CaFile(pem))).await.err().unwrap();
    assert!(matches!(err, ClientError::CertificateRejected(_)), "{err}");
    let missing = with_trust(&broker, Trust::CaFile(dir.path().join("missing.pem")));
    assert!(matches!(Client::connect(missing).await, Err(ClientError::Config(_))));
}

#[tokio::test]
async fn danger_accept_any_is_explicit_and_works() {
    let broker = TestBroker::start(BrokerOptions::default()).await;
    let client =
        Client::connect(with_trust(&broker, Trust::DangerAcceptAnyCertificate)).await.unwrap();
    client.list_streams("").await.unwrap();
    let mut none = broker.client_config();
    none.trust = None;
    assert!(matches!(
        Client::connect(none).await,
        Err(ClientError::Config(felix_client::ConfigError::NoTrust))
    ));
}

#[tokio::test]
async fn tokens_are_sent_in_hello_and_refusals_are_typed() {
    let options = BrokerOptions { token: Some("s3cret".into()), ..Default::default() };
    let broker = TestBroker::start(options).await;
    let mut config = broker.client_config();
    let err = Client::connect(config.clone()).await.err().unwrap();
    assert!(
        matches!(err, ClientError::Refused { code: felix_proto::ErrorCode::InvalidToken, .. }),
        "{err}"
    );
    config.token = Some("s3cret".into());
    Client::connect(config).await.unwrap();
    assert!(broker.state.lock().tokens.iter().any(|t| t.as_deref() == Some(&b"s3cret"[..])));
}
