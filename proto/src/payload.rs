//! Record payloads held as the parts they arrived in.
//!
//! QUIC hands stream data out as one `Bytes` per decrypted packet (about 1.2 KB each), so a
//! 4 KiB record spans several of them. A [`Payload`] keeps those parts as they are (a small
//! rope) instead of copying them into one buffer: the first copy of a published record's bytes
//! is the one into the storage write buffer. Cold paths that want one slice call
//! [`Payload::to_bytes`], which copies only when there is more than one part.

use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// The bytes of one record: one or more `Bytes` parts, in order.
///
/// Equality compares the bytes, not how they are split. Parts are never empty (an empty
/// payload has one empty part). A clone costs two reference counts however many parts there
/// are: the parts after the first are shared.
#[derive(Clone, Default)]
pub struct Payload {
    head: Bytes,
    rest: Option<Arc<[Bytes]>>,
    len: usize,
}

impl Payload {
    /// An empty payload.
    pub const fn new() -> Self {
        Self { head: Bytes::new(), rest: None, len: 0 }
    }

    /// A payload of `parts`, in order; empty parts are dropped.
    pub fn from_parts(parts: impl IntoIterator<Item = Bytes>) -> Self {
        let mut parts: Vec<Bytes> = parts.into_iter().filter(|p| !p.is_empty()).collect();
        Self::from_vec(&mut parts)
    }

    /// A payload of the non-empty `parts`, in order, which it takes (leaving `parts` empty).
    pub(crate) fn from_vec(parts: &mut Vec<Bytes>) -> Self {
        debug_assert!(parts.iter().all(|p| !p.is_empty()), "parts are never empty");
        let len = parts.iter().map(Bytes::len).sum();
        let rest = (parts.len() > 1).then(|| parts.drain(1..).collect());
        let head = parts.pop().unwrap_or_default();
        Self { head, rest, len }
    }

    /// The payload's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parts, in order (an empty payload has one empty part).
    pub fn parts(&self) -> impl Iterator<Item = &Bytes> + '_ {
        std::iter::once(&self.head).chain(self.rest.iter().flat_map(|r| r.iter()))
    }

    /// How many parts the payload holds.
    pub fn part_count(&self) -> usize {
        1 + self.rest.as_ref().map_or(0, |r| r.len())
    }

    /// The bytes as one slice, when they are in one part.
    pub fn as_contiguous(&self) -> Option<&[u8]> {
        self.rest.is_none().then_some(&self.head[..])
    }

    /// The bytes as one `Bytes`: the part itself when there is one, else a copy.
    pub fn to_bytes(&self) -> Bytes {
        if self.rest.is_none() {
            return self.head.clone();
        }
        let mut out = BytesMut::with_capacity(self.len);
        for part in self.parts() {
            out.extend_from_slice(part);
        }
        out.freeze()
    }

    /// The bytes as one `Bytes`, copying only when there is more than one part.
    pub fn into_bytes(self) -> Bytes {
        if self.rest.is_none() {
            self.head
        } else {
            self.to_bytes()
        }
    }

    /// Copies the bytes into `dst`, which must be exactly `len()` long.
    pub fn copy_to_slice(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len, "copy_to_slice: destination length");
        let mut at = 0;
        for part in self.parts() {
            dst[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
    }

    /// Whether the payload holds exactly `bytes`.
    fn eq_slice(&self, mut bytes: &[u8]) -> bool {
        if bytes.len() != self.len {
            return false;
        }
        for part in self.parts() {
            let (here, later) = bytes.split_at(part.len());
            if here != &part[..] {
                return false;
            }
            bytes = later;
        }
        true
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        if let Some(contiguous) = other.as_contiguous() {
            return self.eq_slice(contiguous);
        }
        if let Some(contiguous) = self.as_contiguous() {
            return other.eq_slice(contiguous);
        }
        // Both split: walk the two part lists side by side.
        let mut a = self.parts().flat_map(|p| p.iter());
        let mut b = other.parts().flat_map(|p| p.iter());
        loop {
            match (a.next(), b.next()) {
                (None, None) => return true,
                (x, y) if x == y => continue,
                _ => return false,
            }
        }
    }
}

impl Eq for Payload {}

impl PartialEq<[u8]> for Payload {
    fn eq(&self, other: &[u8]) -> bool {
        self.eq_slice(other)
    }
}

impl PartialEq<&[u8]> for Payload {
    fn eq(&self, other: &&[u8]) -> bool {
        self.eq_slice(other)
    }
}

impl PartialEq<Bytes> for Payload {
    fn eq(&self, other: &Bytes) -> bool {
        self.eq_slice(other)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rest.is_none() {
            return fmt::Debug::fmt(&self.head, f);
        }
        // The bytes as one `Bytes` prints them as `Bytes` does, whatever the split.
        write!(f, "{:?} ({} parts)", self.to_bytes(), self.part_count())
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Self {
        Self { len: bytes.len(), head: bytes, rest: None }
    }
}

impl From<BytesMut> for Payload {
    fn from(bytes: BytesMut) -> Self {
        Self::from(bytes.freeze())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Self::from(Bytes::from(bytes))
    }
}

impl From<String> for Payload {
    fn from(s: String) -> Self {
        Self::from(Bytes::from(s))
    }
}

impl From<&'static [u8]> for Payload {
    fn from(bytes: &'static [u8]) -> Self {
        Self::from(Bytes::from_static(bytes))
    }
}

impl<const N: usize> From<&'static [u8; N]> for Payload {
    fn from(bytes: &'static [u8; N]) -> Self {
        Self::from(Bytes::from_static(bytes))
    }
}

impl From<&'static str> for Payload {
    fn from(s: &'static str) -> Self {
        Self::from(Bytes::from_static(s.as_bytes()))
    }
}

impl From<Payload> for Bytes {
    fn from(payload: Payload) -> Self {
        payload.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(bytes: &[u8], cuts: &[usize]) -> Payload {
        let whole = Bytes::copy_from_slice(bytes);
        let mut at = 0;
        let mut parts = Vec::new();
        for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
            parts.push(whole.slice(at..cut));
            at = cut;
        }
        Payload::from_parts(parts)
    }

    #[test]
    fn equality_ignores_the_split() {
        let a = split(b"hello world", &[3, 7]);
        let b = split(b"hello world", &[1, 2, 10]);
        assert_eq!(a, b);
        assert_eq!(a, Payload::from(&b"hello world"[..]));
        assert_eq!(a, b"hello world"[..]);
        assert_ne!(a, split(b"hello worle", &[3, 7]));
        assert_ne!(a, split(b"hello worl", &[3, 7]));
        assert_eq!(a.part_count(), 3);
        assert_eq!(a.len(), 11);
    }

    #[test]
    fn one_part_is_not_copied() {
        let whole = Bytes::from_static(b"abc");
        let p = Payload::from(whole.clone());
        assert_eq!(p.to_bytes().as_ptr(), whole.as_ptr());
        assert_eq!(p.as_contiguous(), Some(&b"abc"[..]));
        let many = split(b"abcdef", &[2]);
        assert_eq!(many.as_contiguous(), None);
        assert_eq!(many.to_bytes(), Bytes::from_static(b"abcdef"));
        let mut dst = [0u8; 6];
        many.copy_to_slice(&mut dst);
        assert_eq!(&dst, b"abcdef");
    }

    #[test]
    fn empty_parts_are_dropped() {
        let p = Payload::from_parts([Bytes::new(), Bytes::from_static(b"a"), Bytes::new()]);
        assert_eq!((p.len(), p.part_count()), (1, 1));
        assert!(Payload::new().is_empty());
        assert_eq!(Payload::new(), Payload::from(Vec::new()));
        assert_eq!(Payload::from_parts([]).part_count(), 1);
    }

    #[test]
    fn clones_share_the_parts() {
        let p = split(b"abcdef", &[2, 4]);
        let q = p.clone();
        let (a, b): (Vec<_>, Vec<_>) =
            (p.parts().map(|x| x.as_ptr()).collect(), q.parts().map(|x| x.as_ptr()).collect());
        assert_eq!(a, b);
        assert_eq!(q.part_count(), 3);
    }
}
