//! Authentication and tenancy: bearer tokens (JWT signed with EdDSA or ES256) verified against
//! the configured public keys.
//!
//! A token's claims:
//!
//! ```json
//! { "tenant": "acme", "exp": 1767225600,
//!   "permissions": [ { "actions": ["publish", "subscribe"], "namespace": "app*", "stream": "*" } ] }
//! ```
//!
//! A token for tenant `acme` reaches only streams `acme/<namespace>/<stream>`, and only where a
//! permission's `namespace` and `stream` patterns (`*` matches any run of characters) and its
//! actions allow it. Creating a stream needs `publish`; describing and listing need either.
//! `exp` is required. Expired, malformed and wrongly signed tokens get `TokenExpired` or
//! `InvalidToken`; a connection without a token, where tokens are required, gets
//! `Unauthenticated`.

use std::path::PathBuf;

use felix_proto::{ErrorCode, StreamName};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::mesh::WireError;

/// What a request wants to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Publish (and create streams).
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
    /// Expiry, Unix seconds.
    pub exp: u64,
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
    pub fn load(paths: &[PathBuf]) -> Result<Self, String> {
        let mut keys = Vec::new();
        for path in paths {
            let pem =
                std::fs::read(path).map_err(|e| format!("auth key {}: {e}", path.display()))?;
            if let Ok(k) = DecodingKey::from_ed_pem(&pem) {
                keys.push((Algorithm::EdDSA, k));
            } else if let Ok(k) = DecodingKey::from_ec_pem(&pem) {
                keys.push((Algorithm::ES256, k));
            } else {
                return Err(format!(
                    "auth key {}: not an Ed25519 or P-256 public key in PEM",
                    path.display()
                ));
            }
        }
        if keys.is_empty() {
            return Err("no auth keys given".into());
        }
        Ok(Self { keys })
    }

    /// Verifies `token` and returns its grant.
    pub fn verify(&self, token: &[u8]) -> Result<Grant, WireError> {
        let token = std::str::from_utf8(token)
            .map_err(|_| WireError::new(ErrorCode::InvalidToken, "the token is not UTF-8"))?;
        let mut last = WireError::new(ErrorCode::InvalidToken, "no key verifies the token");
        for (alg, key) in &self.keys {
            let mut v = Validation::new(*alg);
            v.leeway = 0;
            v.validate_aud = false;
            v.set_required_spec_claims(&["exp"]);
            match jsonwebtoken::decode::<Grant>(token, key, &v) {
                Ok(data) => return Ok(data.claims),
                Err(e) => {
                    last = match e.kind() {
                        ErrorKind::ExpiredSignature => {
                            return Err(WireError::new(
                                ErrorCode::TokenExpired,
                                "the token has expired",
                            ))
                        }
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
}
