//! Regression test: every `FELIX_*` variable the client documents changes the configuration.
//!
//! The previous design's load generator ignored its environment for months. Here the table
//! below must name every key of `ENV_KEYS` (checked), and each key, set alone on top of a
//! minimal environment, must change exactly the field it names, to the value given.

use std::path::PathBuf;

use felix_client::{AckMode, CertFingerprint, ClientConfig, Trust, ENV_KEYS};

const PIN: &str = "aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99";

/// A token file holding `tok-from-file` and a newline.
const TOKEN_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/token-file.txt");

type Check = fn(&ClientConfig) -> bool;

fn table() -> Vec<(&'static str, &'static str, Check)> {
    vec![
        ("FELIX_ADDR", "10.1.2.3:9999,10.1.2.4:9999", |c| {
            c.seeds() == ["10.1.2.3:9999", "10.1.2.4:9999"]
        }),
        ("FELIX_SERVER_NAME", "broker.internal", |c| c.server_name == "broker.internal"),
        ("FELIX_CA_FILE", "/etc/felix/ca.pem", |c| {
            c.trust == Some(Trust::CaFile(PathBuf::from("/etc/felix/ca.pem")))
        }),
        ("FELIX_CERT_FINGERPRINT", PIN, |c| {
            c.trust == Some(Trust::Fingerprint(PIN.parse::<CertFingerprint>().unwrap()))
        }),
        ("FELIX_DANGER_ACCEPT_ANY_CERT", "1", |c| {
            c.trust == Some(Trust::DangerAcceptAnyCertificate)
        }),
        ("FELIX_TOKEN", "tok-123", |c| c.token.as_deref() == Some("tok-123")),
        ("FELIX_TOKEN_FILE", TOKEN_FILE, |c| c.token.as_deref() == Some("tok-from-file")),
        ("FELIX_CONNECTIONS", "7", |c| c.connections == Some(7)),
        ("FELIX_STREAMS_PER_CONNECTION", "9", |c| c.streams_per_connection == 9),
        ("FELIX_COVER_CORES", "false", |c| !c.cover_cores),
        ("FELIX_SUBSCRIBE_PER_CORE", "false", |c| !c.subscribe_per_core),
        ("FELIX_CONNECT_TIMEOUT_MS", "1234", |c| c.connect_timeout_ms == 1234),
        ("FELIX_CONNECT_ATTEMPT_TIMEOUT_MS", "321", |c| c.connect_attempt_timeout_ms == 321),
        ("FELIX_ACK_TIMEOUT_MS", "4321", |c| c.ack_timeout_ms == 4321),
        ("FELIX_CLIENT_IDLE_TIMEOUT_MS", "2500", |c| c.idle_timeout_ms == 2500),
        ("FELIX_CLIENT_MAX_UDP_PAYLOAD", "1350", |c| c.max_udp_payload == 1350),
        ("FELIX_CLIENT_SEND_IN_WRITE_ORDER", "true", |c| c.send_in_write_order),
        ("FELIX_RECONNECT_BACKOFF_MIN_MS", "7", |c| c.reconnect_backoff_min_ms == 7),
        ("FELIX_RECONNECT_BACKOFF_MAX_MS", "77777", |c| c.reconnect_backoff_max_ms == 77777),
        ("FELIX_RECONNECT_ATTEMPTS_MAX", "3", |c| c.reconnect_attempts_max == 3),
        ("FELIX_ACK_MODE", "written", |c| c.publish.ack_mode == AckMode::Written),
        ("FELIX_LINGER_US", "555", |c| c.publish.linger_us == 555),
        ("FELIX_BATCH_RECORDS_MAX", "77", |c| c.publish.batch_records_max == 77),
        ("FELIX_BATCH_BYTES_MAX", "8888", |c| c.publish.batch_bytes_max == 8888),
        ("FELIX_IN_FLIGHT_BATCHES_MAX", "5", |c| c.publish.in_flight_batches_max == 5),
        ("FELIX_IDEMPOTENT", "false", |c| !c.publish.idempotent),
        ("FELIX_RETRY_TIMEOUT_MS", "1234", |c| c.publish.retry_timeout_ms == 1234),
    ]
}

/// The minimal environment: trust is required, everything else defaults.
fn base() -> Vec<(String, String)> {
    vec![("FELIX_DANGER_ACCEPT_ANY_CERT".into(), "1".into())]
}

#[test]
fn the_table_names_every_documented_key() {
    let mut named: Vec<&str> = table().iter().map(|(k, _, _)| *k).collect();
    named.sort_unstable();
    let mut keys = ENV_KEYS.to_vec();
    keys.sort_unstable();
    assert_eq!(named, keys);
}

#[test]
fn each_environment_setting_takes_effect() {
    let default = ClientConfig::from_env_map(base()).unwrap();
    for (key, value, check) in table() {
        let mut env: Vec<(String, String)> = base();
        let trust_key =
            key.contains("CA_FILE") || key.contains("FINGERPRINT") || key.contains("DANGER");
        if trust_key {
            env.clear(); // one trust choice at a time
        }
        env.push((key.into(), value.into()));
        let config = ClientConfig::from_env_map(env)
            .unwrap_or_else(|e| panic!("{key}={value} refused: {e}"));
        assert!(check(&config), "{key}={value} did not take effect:\n{config}");
        if key.contains("DANGER") {
            // Without it there is no trust at all: the setting is what makes the config valid.
            let none: [(&str, &str); 0] = [];
            assert_eq!(ClientConfig::from_env_map(none), Err(felix_client::ConfigError::NoTrust));
            continue;
        }
        assert!(!check(&default), "{key}: the default already satisfies the check");
        assert_ne!(config, default, "{key}={value} changed nothing");
    }
}

#[test]
fn all_settings_together_take_effect_and_other_variables_are_ignored() {
    let mut env: Vec<(String, String)> = table()
        .into_iter()
        // One trust choice, and one token source (FELIX_TOKEN_FILE is checked alone).
        .filter(|(k, _, _)| !k.contains("CA_FILE") && !k.contains("DANGER"))
        .filter(|(k, _, _)| !k.contains("TOKEN_FILE"))
        .map(|(k, v, _)| (k.to_owned(), v.to_owned()))
        .collect();
    env.push(("PATH".into(), "/bin".into()));
    env.push(("FELIX_ACK_MODE_TYPO".into(), "x".into()));
    let config = ClientConfig::from_env_map(env).unwrap();
    for (key, value, check) in table() {
        if key.contains("CA_FILE") || key.contains("DANGER") || key.contains("TOKEN_FILE") {
            continue;
        }
        assert!(check(&config), "{key}={value} lost when combined:\n{config}");
    }
}

#[test]
fn a_token_comes_from_one_source_and_a_token_file_must_hold_one() {
    let with = |extra: &[(&str, &str)]| {
        let mut env = base();
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        ClientConfig::from_env_map(env)
    };
    let both = with(&[("FELIX_TOKEN", "t"), ("FELIX_TOKEN_FILE", TOKEN_FILE)]);
    assert_eq!(both, Err(felix_client::ConfigError::ConflictingToken));
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = dir.path().join("missing");
    for (path, reason) in [(&empty, "empty"), (&missing, "No such file")] {
        let e = with(&[("FELIX_TOKEN_FILE", path.to_str().unwrap())]).unwrap_err();
        assert!(matches!(e, felix_client::ConfigError::TokenFile { .. }), "{e}");
        assert!(e.to_string().contains(reason), "{e}");
    }
}

#[test]
fn from_env_reads_the_process_environment() {
    // Only reads: no test mutates the process environment. Whatever it holds, the result is
    // the same as passing it explicitly.
    let explicit = ClientConfig::from_env_map(std::env::vars());
    assert_eq!(ClientConfig::from_env(), explicit);
}
