//! Stream names: `tenant/namespace/stream`.

use crate::limits::{MAX_STREAM_NAME_BYTES, MAX_STREAM_SEGMENT_BYTES as MAX_SEGMENT_BYTES};

/// A validated stream name: three segments `tenant/namespace/stream`, each 1 to 64 bytes of
/// `[A-Za-z0-9._-]`, not `.` or `..`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamName {
    full: String,
    tenant_len: usize,
    namespace_end: usize,
}

/// Why a stream name is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamNameError {
    /// Not three `/`-separated segments.
    #[error("stream name {0:?} is not tenant/namespace/stream")]
    Shape(String),
    /// A segment is empty, too long, `.`/`..`, or has a character outside `[A-Za-z0-9._-]`.
    #[error("stream name {0:?} has an invalid segment (1-64 bytes of A-Z a-z 0-9 . _ -)")]
    Segment(String),
}

impl StreamName {
    /// Validates `name`.
    pub fn parse(name: &str) -> Result<Self, StreamNameError> {
        if name.len() > MAX_STREAM_NAME_BYTES {
            return Err(StreamNameError::Shape(name.chars().take(64).collect()));
        }
        let parts: Vec<&str> = name.split('/').collect();
        if parts.len() != 3 {
            return Err(StreamNameError::Shape(name.to_owned()));
        }
        if !parts.iter().all(|p| valid_segment(p)) {
            return Err(StreamNameError::Segment(name.to_owned()));
        }
        let tenant_len = parts[0].len();
        Ok(Self {
            full: name.to_owned(),
            tenant_len,
            namespace_end: tenant_len + 1 + parts[1].len(),
        })
    }

    /// The whole name.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The tenant segment.
    pub fn tenant(&self) -> &str {
        &self.full[..self.tenant_len]
    }

    /// The namespace segment.
    pub fn namespace(&self) -> &str {
        &self.full[self.tenant_len + 1..self.namespace_end]
    }

    /// The stream segment.
    pub fn stream(&self) -> &str {
        &self.full[self.namespace_end + 1..]
    }
}

impl std::fmt::Display for StreamName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full)
    }
}

fn valid_segment(s: &str) -> bool {
    (1..=MAX_SEGMENT_BYTES).contains(&s.len())
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_three_segments() {
        let n = StreamName::parse("acme/orders/eu-1").unwrap();
        assert_eq!((n.tenant(), n.namespace(), n.stream()), ("acme", "orders", "eu-1"));
    }

    #[test]
    fn rejects_bad_names() {
        for bad in ["", "a/b", "a/b/c/d", "a//c", "a/../c", "a/b/c d", "a/b/ü", "/b/c"] {
            assert!(StreamName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(StreamName::parse(&format!("a/b/{}", "x".repeat(65))).is_err());
    }
}
