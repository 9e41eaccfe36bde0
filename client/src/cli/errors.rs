//! What the commands say when they fail, and with which exit status.
//!
//! | status | when |
//! |---|---|
//! | 0 | success (also `publish` stopped by one Ctrl-C with every record sent acked) |
//! | 1 | a failure: the broker unreachable, a refusal, a failed record |
//! | 2 | a configuration error: a flag or `FELIX_*` value, a CA or token file |
//! | 130 | interrupted: Ctrl-C while connecting, or a second Ctrl-C |
//!
//! Each message is printed once, as `felix: …`, and says what to do where it can: a refused
//! token names `--token` and `--token-file`, an unreachable broker the addresses tried.

use felix_proto::ErrorCode;

use crate::error::{ClientError, ConfigError};

/// Exit status of a failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status of a configuration error.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status after Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Ctrl-C arrived before the command could stop on its own terms.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// `publish` ended with failed records: the summary line, which names them.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PublishFailed(pub String);

/// No connection to a broker: the addresses tried, the client's error, and the likely cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to {tried}: {error}{hint}")]
pub struct ConnectFailed {
    /// The seed addresses, comma-separated, as configured.
    pub tried: String,
    /// Why the last attempt failed.
    pub error: ClientError,
    /// `; ` and what to check, or empty.
    hint: String,
}

impl ConnectFailed {
    /// The failure to connect to `seeds` with `error`; `None` for a configuration error, which
    /// stays as it is (it names its setting, and exits 2).
    pub fn new(error: ClientError, seeds: &[String]) -> Result<Self, ClientError> {
        let tried = seeds.join(", ");
        let hint = match &error {
            ClientError::Config(_) => return Err(error),
            ClientError::Timeout { .. } => format!(
                "; is a broker running at {tried}? (no answer at all: nothing listens there, \
                 or a firewall drops UDP)"
            ),
            ClientError::Connect(_) | ClientError::PortUnreachable { .. } => {
                format!("; is a broker running at {tried}?")
            }
            ClientError::Resolve { .. } => "; check the host name in --addr (FELIX_ADDR)".into(),
            ClientError::Refused { code, .. } if is_token_refusal(*code) => {
                "; pass a token with --token or --token-file (FELIX_TOKEN, FELIX_TOKEN_FILE)".into()
            }
            ClientError::CertificateRejected(_) => "; check --ca-file, --fingerprint or \
                 --server-name (FELIX_CA_FILE, FELIX_CERT_FINGERPRINT, FELIX_SERVER_NAME)"
                .into(),
            _ => String::new(),
        };
        Ok(ConnectFailed { tried, error, hint })
    }
}

/// The exit status of a command that failed with `e`.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<Interrupted>().is_some() {
        return EXIT_INTERRUPTED;
    }
    let config = e.chain().any(|c| {
        c.downcast_ref::<ConfigError>().is_some()
            || matches!(c.downcast_ref::<ClientError>(), Some(ClientError::Config(_)))
    });
    if config {
        EXIT_CONFIG
    } else {
        EXIT_FAILURE
    }
}

fn is_token_refusal(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::Unauthenticated | ErrorCode::InvalidToken | ErrorCode::TokenExpired)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_errors_exit_2_and_print_their_message_once() {
        let ca = ConfigError::CaFile { path: "/x.pem".into(), reason: "gone".into() };
        let e = anyhow::Error::new(ClientError::from(ca)).context("connecting");
        assert_eq!(exit_code(&e), EXIT_CONFIG);
        assert_eq!(format!("{e:#}"), "connecting: CA file /x.pem: gone");
        assert_eq!(exit_code(&anyhow::Error::new(ConfigError::NoTrust)), EXIT_CONFIG);
        assert_eq!(exit_code(&anyhow::Error::new(Interrupted)), EXIT_INTERRUPTED);
        assert_eq!(exit_code(&anyhow::Error::new(ClientError::Closed)), EXIT_FAILURE);
    }

    #[test]
    fn connect_failures_name_the_addresses_and_the_likely_cause() {
        let seeds = ["10.0.0.1:7400".to_owned(), "10.0.0.2:7400".to_owned()];
        let timeout = ClientError::Timeout { what: "connect", after_ms: 5000 };
        let text = ConnectFailed::new(timeout, &seeds).unwrap().to_string();
        assert!(text.starts_with("cannot connect to 10.0.0.1:7400, 10.0.0.2:7400:"), "{text}");
        assert!(text.contains("is a broker running at 10.0.0.1:7400, 10.0.0.2:7400?"), "{text}");
        let refused = ClientError::Refused {
            code: ErrorCode::Unauthenticated,
            message: "this broker requires a token".into(),
        };
        let text = ConnectFailed::new(refused, &seeds[..1]).unwrap().to_string();
        assert!(text.contains("--token or --token-file"), "{text}");
        assert!(ConnectFailed::new(ConfigError::NoTrust.into(), &seeds).is_err());
    }
}
