//! Authentication and tenancy: bearer tokens (JWT signed with EdDSA or ES256) verified against
//! the configured public keys.
//!
//! A token's claims (`docs/operations.md`, "Authentication", shows how to make a key pair and a
//! token):
//!
//! ```json
//! { "tenant": "acme", "exp": 1767225600, "iat": 1767222000, "nbf": 1767222000,
//!   "permissions": [ { "actions": ["publish", "subscribe"], "namespace": "app*", "stream": "*" } ] }
//! ```
//!
//! A token for tenant `acme` reaches only streams `acme/<namespace>/<stream>`, and only where a
//! permission's `namespace` and `stream` patterns (`*` matches any run of characters) and its
//! actions allow it. Creating a stream needs `publish`; describing and listing need either.
//! `exp` is required and exact (no leeway); `nbf` and `iat` are optional, and a token whose
//! `nbf` or `iat` lies more than [`TOKEN_LEEWAY_SECS`] in the future is refused. Expired
//! tokens get `TokenExpired`; malformed, wrongly signed and not-yet-valid ones `InvalidToken`;
//! a connection without a token, where tokens are required, gets `Unauthenticated`.
//!
//! A token is checked at Hello and on every request; when it expires, [`close_at_expiry`]
//! closes the whole connection with the QUIC application code `TokenExpired` (14), which ends
//! its subscriptions (as NATS disconnects a client whose credentials expire). A client
//! reconnects with a fresh token.

use std::path::PathBuf;
use std::time::Duration;

use felix_proto::{ErrorCode, StreamName};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::error::WireError;
use crate::net::Connection;

/// How far a token's `nbf` (not before) and `iat` (issued at) may lie in the future, in
/// seconds: the clock skew tolerated between the token's issuer and the broker.
pub const TOKEN_LEEWAY_SECS: u64 = 60;
/// The longest the expiry timer of a connection sleeps before it reads the clock again, in
/// milliseconds (a wall clock that is set back or forward is noticed within this).
pub const EXPIRY_CHECK_INTERVAL_MAX_MS: u64 = 60 * 60 * 1000;

/// What a request wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Publish (and create, alter and delete streams).
    Publish,
    /// Subscribe and commit positions.
    Subscribe,
    /// Describe or list: either permission will do.
    Read,
}

/// The verified content of a token.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Grant {
    /// The tenant: the first segment of every stream name the token reaches.
    pub tenant: String,
    /// Expiry, Unix seconds: the token is refused from this second on.
    pub exp: u64,
    /// Not before, Unix seconds (optional): refused while it lies more than
    /// [`TOKEN_LEEWAY_SECS`] ahead.
    #[serde(default)]
    pub nbf: Option<u64>,
    /// Issued at, Unix seconds (optional): refused while it lies more than
    /// [`TOKEN_LEEWAY_SECS`] ahead.
    #[serde(default)]
    pub iat: Option<u64>,
    /// What the token allows.
    #[serde(default)]
    pub permissions: Vec<Permission>,
}

/// One permission of a token.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Permission {
    /// `publish` and/or `subscribe`.
    pub actions: Vec<String>,
    /// Namespace pattern.
    pub namespace: String,
    /// Stream pattern.
    pub stream: String,
}

impl Grant {
    /// Whether the token is valid at `now_s` (Unix seconds): not expired (`exp` exactly), and
    /// neither `nbf` nor `iat` more than [`TOKEN_LEEWAY_SECS`] ahead.
    pub fn check_time(&self, now_s: u64) -> Result<(), WireError> {
        if now_s >= self.exp {
            return Err(WireError::new(ErrorCode::TokenExpired, "the token has expired"));
        }
        let ahead = |claim: &str, at: Option<u64>| match at {
            Some(t) if t > now_s.saturating_add(TOKEN_LEEWAY_SECS) => Err(WireError::new(
                ErrorCode::InvalidToken,
                format!(
                    "the token's {claim} ({t}) lies {} s in the future (leeway \
                     {TOKEN_LEEWAY_SECS} s)",
                    t - now_s
                ),
            )),
            _ => Ok(()),
        };
        ahead("nbf", self.nbf)?;
        ahead("iat", self.iat)
    }

    /// Whether this grant allows `action` on `name` at `now_s`.
    pub fn check(&self, action: Action, name: &StreamName, now_s: u64) -> Result<(), WireError> {
        if now_s >= self.exp {
            return Err(WireError::new(ErrorCode::TokenExpired, "the token has expired"));
        }
        if name.tenant() != self.tenant {
            return Err(WireError::new(
                ErrorCode::Forbidden,
                format!("tenant {} may not use {name}", self.tenant),
            ));
        }
        let allowed = self.permissions.iter().any(|p| {
            let acts = |a: &str| p.actions.iter().any(|x| x == a);
            let action_ok = match action {
                Action::Publish => acts("publish"),
                Action::Subscribe => acts("subscribe"),
                Action::Read => acts("publish") || acts("subscribe"),
            };
            action_ok && glob(&p.namespace, name.namespace()) && glob(&p.stream, name.stream())
        });
        if allowed {
            Ok(())
        } else {
            Err(WireError::new(
                ErrorCode::Forbidden,
                format!("the token does not allow {action:?} on {name}"),
            ))
        }
    }
}

/// Why [`Authenticator::load`] refused the `--auth-keys` files.
#[derive(Debug, thiserror::Error)]
pub enum AuthKeysError {
    /// A key file cannot be read.
    #[error("auth key {}: {source}", path.display())]
    Read {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A key file holds no Ed25519 or P-256 public key in PEM.
    #[error("auth key {}: not an Ed25519 or P-256 public key in PEM", path.display())]
    NotAKey {
        /// The key file.
        path: PathBuf,
    },
    /// No key file was given.
    #[error("no auth keys given")]
    NoKeys,
}

/// Verifies tokens against a set of public keys.
pub struct Authenticator {
    keys: Vec<(Algorithm, DecodingKey)>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Authenticator({} keys)", self.keys.len())
    }
}

impl Authenticator {
    /// Loads PEM public keys (Ed25519 for EdDSA, P-256 for ES256).
    pub fn load(paths: &[PathBuf]) -> Result<Self, AuthKeysError> {
        let mut keys = Vec::new();
        for path in paths {
            let pem = std::fs::read(path)
                .map_err(|source| AuthKeysError::Read { path: path.clone(), source })?;
            if let Ok(k) = DecodingKey::from_ed_pem(&pem) {
                keys.push((Algorithm::EdDSA, k));
            } else if let Ok(k) = DecodingKey::from_ec_pem(&pem) {
                keys.push((Algorithm::ES256, k));
            } else {
                return Err(AuthKeysError::NotAKey { path: path.clone() });
            }
        }
        if keys.is_empty() {
            return Err(AuthKeysError::NoKeys);
        }
        Ok(Self { keys })
    }

    /// Verifies `token` now and returns its grant.
    pub fn verify(&self, token: &[u8]) -> Result<Grant, WireError> {
        self.verify_at(token, super::tasks::now_ms() / 1000)
    }

    /// Verifies `token`'s signature, then its times at `now_s` (Unix seconds, see
    /// [`Grant::check_time`]), and returns its grant.
    pub fn verify_at(&self, token: &[u8], now_s: u64) -> Result<Grant, WireError> {
        let token = std::str::from_utf8(token)
            .map_err(|_| WireError::new(ErrorCode::InvalidToken, "the token is not UTF-8"))?;
        let mut last = WireError::new(ErrorCode::InvalidToken, "no key verifies the token");
        for (alg, key) in &self.keys {
            let mut v = Validation::new(*alg);
            // Times are checked by `Grant::check_time` against `now_s`, not the library's clock.
            v.validate_exp = false;
            v.validate_nbf = false;
            v.leeway = 0;
            v.validate_aud = false;
            v.set_required_spec_claims(&["exp"]);
            match jsonwebtoken::decode::<Grant>(token, key, &v) {
                Ok(data) => {
                    data.claims.check_time(now_s)?;
                    return Ok(data.claims);
                }
                Err(e) => {
                    last = match e.kind() {
                        ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm => {
                            WireError::new(
                                ErrorCode::InvalidToken,
                                "no configured key verifies the token",
                            )
                        }
                        other => WireError::new(
                            ErrorCode::InvalidToken,
                            format!("malformed token: {other:?}"),
                        ),
                    }
                }
            }
        }
        Err(last)
    }
}

/// Closes `conn` with the application code `TokenExpired` (14) when a token that expires at
/// `exp_s` (Unix seconds) has expired, which ends every subscription of the connection; returns
/// early when the connection closes first. Spawned once per connection whose Hello carried a
/// valid token.
pub async fn close_at_expiry(conn: Connection, exp_s: u64) {
    loop {
        let left_ms = expires_in_ms(exp_s, super::tasks::now_ms());
        if left_ms == 0 {
            conn.close(ErrorCode::TokenExpired as u32, b"the token has expired");
            return;
        }
        let nap = Duration::from_millis(left_ms.min(EXPIRY_CHECK_INTERVAL_MAX_MS));
        let closed = async {
            conn.closed().await;
            true
        };
        let slept = async {
            glommio::timer::sleep(nap).await;
            false
        };
        if futures_lite::future::or(closed, slept).await {
            return;
        }
    }
}

/// Milliseconds from `now_ms` (Unix milliseconds) until a token with `exp_s` (Unix seconds)
/// expires; 0 once it has.
pub fn expires_in_ms(exp_s: u64, now_ms: u64) -> u64 {
    exp_s.saturating_mul(1000).saturating_sub(now_ms)
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*", "anything"));
        assert!(glob("app*", "app-eu"));
        assert!(!glob("app*", "billing"));
        assert!(glob("a*c*e", "abcde"));
        assert!(!glob("a*c*e", "abde"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(!glob("ab*ba", "aba"));
    }

    #[test]
    fn grants_are_scoped_to_tenant_pattern_and_action() {
        let g = Grant {
            tenant: "acme".into(),
            exp: 100,
            nbf: None,
            iat: None,
            permissions: vec![Permission {
                actions: vec!["publish".into()],
                namespace: "app*".into(),
                stream: "*".into(),
            }],
        };
        let n = |s| StreamName::parse(s).unwrap();
        assert!(g.check(Action::Publish, &n("acme/app1/s"), 10).is_ok());
        assert!(g.check(Action::Read, &n("acme/app1/s"), 10).is_ok());
        assert_eq!(
            g.check(Action::Subscribe, &n("acme/app1/s"), 10).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert_eq!(
            g.check(Action::Publish, &n("other/app1/s"), 10).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert_eq!(
            g.check(Action::Publish, &n("acme/ops/s"), 10).unwrap_err().code,
            ErrorCode::Forbidden
        );
        assert_eq!(
            g.check(Action::Publish, &n("acme/app1/s"), 100).unwrap_err().code,
            ErrorCode::TokenExpired
        );
    }

    /// An Ed25519 authenticator and a signer of tokens with the given claims.
    fn ed25519() -> (Authenticator, impl Fn(serde_json::Value) -> Vec<u8>, tempfile::TempDir) {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let public = dir.path().join("ed.pub.pem");
        std::fs::write(&public, kp.public_key_pem()).unwrap();
        let auth = Authenticator::load(&[public]).unwrap();
        let key = jsonwebtoken::EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).unwrap();
        let sign = move |claims: serde_json::Value| {
            let header = jsonwebtoken::Header::new(Algorithm::EdDSA);
            jsonwebtoken::encode(&header, &claims, &key).unwrap().into_bytes()
        };
        (auth, sign, dir)
    }

    #[test]
    fn nbf_and_iat_ahead_of_the_leeway_are_refused_and_exp_is_exact() {
        let (auth, sign, _dir) = ed25519();
        let now = 1_767_225_600u64;
        let code =
            |claims: serde_json::Value| auth.verify_at(&sign(claims), now).err().map(|e| e.code);
        let perms = serde_json::json!([]);
        let with = |field: &str, at: u64| {
            let mut c =
                serde_json::json!({ "tenant": "acme", "exp": now + 600, "permissions": perms });
            c[field] = at.into();
            c
        };
        assert_eq!(code(with("nbf", now + TOKEN_LEEWAY_SECS + 1)), Some(ErrorCode::InvalidToken));
        assert_eq!(code(with("iat", now + TOKEN_LEEWAY_SECS + 1)), Some(ErrorCode::InvalidToken));
        assert_eq!(code(with("nbf", now + 3600)), Some(ErrorCode::InvalidToken));
        assert_eq!(code(with("nbf", now + TOKEN_LEEWAY_SECS)), None);
        assert_eq!(code(with("iat", now + TOKEN_LEEWAY_SECS)), None);
        assert_eq!(code(with("nbf", now - 10)), None);
        assert_eq!(code(with("iat", now)), None);
        assert_eq!(code(with("exp", now)), Some(ErrorCode::TokenExpired));
        assert_eq!(code(with("exp", now + 1)), None);
        let g = auth.verify_at(&sign(with("nbf", now - 5)), now).unwrap();
        assert_eq!(
            (g.tenant.as_str(), g.exp, g.nbf, g.iat),
            ("acme", now + 600, Some(now - 5), None)
        );
        // A wrongly signed token is refused as such whatever its times.
        let (_, rogue, _rogue_dir) = ed25519();
        assert_eq!(
            auth.verify_at(&rogue(with("exp", now - 1)), now).unwrap_err().code,
            ErrorCode::InvalidToken
        );
        // `exp` is required.
        let no_exp = serde_json::json!({ "tenant": "acme", "permissions": perms });
        assert_eq!(code(no_exp), Some(ErrorCode::InvalidToken));
    }

    #[test]
    fn loading_keys_fails_with_a_typed_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = Authenticator::load(std::slice::from_ref(&missing)).unwrap_err();
        assert!(
            matches!(&err, AuthKeysError::Read { path, source }
                if *path == missing && source.kind() == std::io::ErrorKind::NotFound),
            "{err:?}"
        );
        assert!(err.to_string().starts_with(&format!("auth key {}: ", missing.display())));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, b"not a key").unwrap();
        let err = Authenticator::load(std::slice::from_ref(&junk)).unwrap_err();
        assert!(matches!(&err, AuthKeysError::NotAKey { path } if *path == junk), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("auth key {}: not an Ed25519 or P-256 public key in PEM", junk.display())
        );
        let err = Authenticator::load(&[]).unwrap_err();
        assert!(matches!(err, AuthKeysError::NoKeys), "{err:?}");
        assert_eq!(err.to_string(), "no auth keys given");
    }

    #[test]
    fn the_expiry_timer_counts_to_exp_in_milliseconds() {
        assert_eq!(expires_in_ms(100, 99_000), 1_000);
        assert_eq!(expires_in_ms(100, 99_999), 1);
        assert_eq!(expires_in_ms(100, 100_000), 0);
        assert_eq!(expires_in_ms(100, 200_000), 0);
        assert_eq!(expires_in_ms(u64::MAX, 0), u64::MAX);
    }
}
