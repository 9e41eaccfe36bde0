//! TLS: the rustls client configuration for each [`Trust`] choice.
//!
//! TLS 1.3 only, ALPN `felix/1`, the ring provider. A fingerprint pin and the explicitly named
//! danger mode use their own [`ServerCertVerifier`]; both still verify the handshake signature
//! with the provider's algorithms, so the peer must hold the certificate's private key.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::config::{CertFingerprint, Trust};
use crate::error::ConfigError;

/// The most certificates read from one CA file.
pub const CA_FILE_CERTS_MAX: usize = 256;

/// Why a verifier refused a certificate, kept so that connect can report it precisely.
pub(crate) type RejectionNote = Arc<Mutex<Option<String>>>;

/// A quinn client configuration and the slot where a verifier records its refusal.
pub(crate) struct TlsSetup {
    pub quic: quinn::ClientConfig,
    pub rejection: RejectionNote,
}

/// Builds the QUIC client configuration for `trust`. A connection whose peer is silent for
/// `idle_timeout` is closed (the broker's own idle timeout applies too: the smaller wins);
/// keep-alives every third of it keep a quiet but healthy connection open. Path MTU discovery
/// grows datagrams up to `max_udp_payload`. With `send_in_write_order` quinn sends each stream's
/// data before the next stream's instead of round-robin (`ClientConfig::send_in_write_order`).
pub(crate) fn client_config(
    trust: &Trust,
    idle_timeout: std::time::Duration,
    max_udp_payload: u16,
    send_in_write_order: bool,
) -> Result<TlsSetup, ConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let rejection: RejectionNote = Arc::default();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ConfigError::Tls(e.to_string()))?;
    let mut tls = match trust {
        Trust::CaFile(path) => {
            builder.with_root_certificates(roots(read_ca_file(path)?)?).with_no_client_auth()
        }
        Trust::CaCertificates(certs) => {
            builder.with_root_certificates(roots(certs.clone())?).with_no_client_auth()
        }
        Trust::Fingerprint(pin) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                pin: Some(*pin),
                provider,
                rejection: rejection.clone(),
            }))
            .with_no_client_auth(),
        Trust::DangerAcceptAnyCertificate => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedVerifier {
                pin: None,
                provider,
                rejection: rejection.clone(),
            }))
            .with_no_client_auth(),
    };
    tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| ConfigError::Tls(e.to_string()))?;
    let mut quic = quinn::ClientConfig::new(Arc::new(crypto));
    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(idle_timeout)
        .map_err(|e| ConfigError::Tls(format!("idle timeout: {e}")))?;
    transport.max_idle_timeout(Some(idle));
    transport.keep_alive_interval(Some(idle_timeout / 3));
    let mut mtud = quinn::MtuDiscoveryConfig::default();
    mtud.upper_bound(max_udp_payload);
    transport.mtu_discovery_config(Some(mtud));
    let mut acks = quinn::AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(crate::config::ACK_ELICITING_THRESHOLD_PACKETS.into())
        .max_ack_delay(Some(std::time::Duration::from_micros(
            crate::config::REQUESTED_MAX_ACK_DELAY_US,
        )));
    transport.ack_frequency_config(Some(acks));
    transport.send_fairness(!send_in_write_order);
    quic.transport_config(Arc::new(transport));
    Ok(TlsSetup { quic, rejection })
}

/// Reads certificates from `path`: PEM (any number of `CERTIFICATE` blocks) or one DER.
pub fn read_ca_file(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let err = |reason: String| ConfigError::CaFile { path: path.display().to_string(), reason };
    let data = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let certs: Vec<CertificateDer<'static>> = if data.starts_with(b"-----") {
        CertificateDer::pem_slice_iter(&data)
            .take(CA_FILE_CERTS_MAX)
            .collect::<Result<_, _>>()
            .map_err(|e| err(format!("{e:?}")))?
    } else {
        vec![CertificateDer::from(data)]
    };
    if certs.is_empty() {
        return Err(err("no certificate found".into()));
    }
    Ok(certs)
}

fn roots(certs: Vec<CertificateDer<'static>>) -> Result<Arc<rustls::RootCertStore>, ConfigError> {
    let mut store = rustls::RootCertStore::empty();
    for cert in certs {
        store.add(cert).map_err(|e| ConfigError::Tls(format!("CA certificate refused: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// Accepts the certificate whose SHA-256 is `pin`, or any certificate when `pin` is `None`
/// (only reachable through `Trust::DangerAcceptAnyCertificate`).
#[derive(Debug)]
struct PinnedVerifier {
    pin: Option<CertFingerprint>,
    provider: Arc<CryptoProvider>,
    rejection: RejectionNote,
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(pin) = self.pin else {
            return Ok(ServerCertVerified::assertion());
        };
        let got = CertFingerprint::of_der(end_entity.as_ref());
        if got == pin {
            return Ok(ServerCertVerified::assertion());
        }
        let why = format!("certificate fingerprint {got} does not match the pinned {pin}");
        if let Ok(mut note) = self.rejection.lock() {
            *note = Some(why);
        }
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_ca_files_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        assert!(matches!(read_ca_file(&missing), Err(ConfigError::CaFile { .. })));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "-----BEGIN NOTHING-----\n-----END NOTHING-----\n").unwrap();
        assert!(matches!(read_ca_file(&empty), Err(ConfigError::CaFile { .. })));
    }

    #[test]
    fn pem_and_der_files_both_load() {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("ca.pem");
        std::fs::write(&pem, cert.cert.pem()).unwrap();
        let der = dir.path().join("ca.der");
        std::fs::write(&der, cert.cert.der()).unwrap();
        assert_eq!(read_ca_file(&pem).unwrap(), vec![cert.cert.der().clone()]);
        assert_eq!(read_ca_file(&der).unwrap(), vec![cert.cert.der().clone()]);
        assert!(client_config(
            &Trust::CaFile(pem),
            std::time::Duration::from_secs(10),
            1452,
            false
        )
        .is_ok());
    }

    #[test]
    fn send_in_write_order_turns_quinn_send_fairness_off() {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let trust = Trust::CaCertificates(vec![cert.cert.der().clone()]);
        let idle = std::time::Duration::from_secs(10);
        // quinn's TransportConfig has no getters; its Debug output lists every setting.
        for (in_write_order, shown) in
            [(false, "send_fairness: true"), (true, "send_fairness: false")]
        {
            let setup = client_config(&trust, idle, 1452, in_write_order).unwrap();
            let debug = format!("{:?}", setup.quic);
            assert!(debug.contains(shown), "{in_write_order}: {debug}");
        }
    }
}
