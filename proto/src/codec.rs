//! The bounded reader and the writer every frame is built on.
//!
//! `Reader` reads from one `Bytes` or from several parts in order (the chunks a QUIC stream
//! arrived in) and hands out zero-copy slices. Every read is checked against what remains;
//! nothing is read past the end and nothing is allocated from an unchecked length.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::DecodeError;
use crate::payload::Payload;

/// A bounded, zero-copy reader over one frame body, held in one or more parts.
#[derive(Debug)]
pub struct Reader {
    /// The body's parts; `parts[at]` is the first with unread bytes (read from its front).
    parts: Vec<Bytes>,
    at: usize,
    remaining: usize,
}

impl Reader {
    /// A reader over the whole of `buf`.
    pub fn new(buf: Bytes) -> Self {
        Self::from_parts(vec![buf])
    }

    /// A reader over `parts`, read in order as one body.
    pub fn from_parts(parts: Vec<Bytes>) -> Self {
        let remaining = parts.iter().map(Bytes::len).sum();
        Self { parts, at: 0, remaining }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Takes the next `len` bytes as a slice of the input (no copy when they lie in one part;
    /// a field straddling parts is copied, so keep this for small fields and use
    /// [`Reader::payload`] for record payloads).
    pub fn bytes(&mut self, len: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if len > self.remaining {
            return Err(DecodeError::Truncated { what });
        }
        self.skip_empty();
        if len == 0 {
            return Ok(Bytes::new());
        }
        let part = &mut self.parts[self.at];
        if part.len() >= len {
            self.remaining -= len;
            return Ok(part.split_to(len));
        }
        let mut out = BytesMut::with_capacity(len);
        self.copy_into(len, |b| out.extend_from_slice(b));
        Ok(out.freeze())
    }

    /// Takes the next `len` bytes as a payload of slices of the input's parts (never a copy).
    pub fn payload(&mut self, len: usize, what: &'static str) -> Result<Payload, DecodeError> {
        if len > self.remaining {
            return Err(DecodeError::Truncated { what });
        }
        self.skip_empty();
        if let Some(part) = self.parts.get_mut(self.at).filter(|p| p.len() >= len) {
            self.remaining -= len;
            return Ok(Payload::from(part.split_to(len)));
        }
        self.remaining -= len;
        let mut out = Vec::new();
        let mut left = len;
        while left > 0 {
            let part = &mut self.parts[self.at];
            if part.len() > left {
                out.push(part.split_to(left));
                left = 0;
            } else {
                left -= part.len();
                if !part.is_empty() {
                    out.push(std::mem::take(part));
                }
                self.at += 1;
            }
        }
        Ok(Payload::from_vec(&mut out))
    }

    /// A reader over the next `len` bytes; this reader moves past them (rustls' `Reader::sub`).
    pub fn sub(&mut self, len: usize, what: &'static str) -> Result<Reader, DecodeError> {
        let payload = self.payload(len, what)?;
        Ok(Reader::from_parts(payload.parts().cloned().collect()))
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        if N > self.remaining {
            return Err(DecodeError::Truncated { what });
        }
        let mut out = [0u8; N];
        self.skip_empty();
        let part = &mut self.parts[self.at];
        if part.len() >= N {
            out.copy_from_slice(&part[..N]);
            part.advance(N);
            self.remaining -= N;
        } else {
            let mut filled = 0;
            self.copy_into(N, |b| {
                out[filled..filled + b.len()].copy_from_slice(b);
                filled += b.len();
            });
        }
        Ok(out)
    }

    /// Moves `at` past parts with nothing left to read.
    fn skip_empty(&mut self) {
        while self.at < self.parts.len() && self.parts[self.at].is_empty() {
            self.at += 1;
        }
    }

    /// Consumes the next `len` bytes (which the caller checked remain), handing each part's
    /// share to `sink`.
    fn copy_into(&mut self, len: usize, mut sink: impl FnMut(&[u8])) {
        self.remaining -= len;
        let mut left = len;
        while left > 0 {
            let part = &mut self.parts[self.at];
            let n = part.len().min(left);
            sink(&part[..n]);
            part.advance(n);
            left -= n;
            if part.is_empty() {
                self.at += 1;
            }
        }
    }

    /// Reads one byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// Reads a big-endian u16.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    /// Reads a big-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    /// Reads a big-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    /// Reads a u16-length-prefixed field of at most `max` bytes.
    pub fn bytes_u16(&mut self, max: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        let len = usize::from(self.u16(what)?);
        if len > max {
            return Err(DecodeError::FieldTooLong { what, len, max });
        }
        self.bytes(len, what)
    }

    /// Reads a u16-length-prefixed UTF-8 string of at most `max` bytes.
    pub fn string_u16(&mut self, max: usize, what: &'static str) -> Result<String, DecodeError> {
        let raw = self.bytes_u16(max, what)?;
        match std::str::from_utf8(&raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(DecodeError::InvalidUtf8 { what }),
        }
    }

    /// Checks that every byte was read.
    pub fn expect_end(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

/// Writes the fields of a frame body.
pub(crate) trait WriteExt {
    fn put_bytes_u16(&mut self, bytes: &[u8]);
}

impl WriteExt for BytesMut {
    /// Writes a u16 length and the bytes. Callers keep fields within their limits, which are
    /// all below `u16::MAX` (checked at compile time in `limits`).
    fn put_bytes_u16(&mut self, bytes: &[u8]) {
        let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
        self.put_u16(len);
        self.put_slice(&bytes[..usize::from(len)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded_and_zero_copy() {
        let input = Bytes::from_static(&[0, 3, b'a', b'b', b'c', 0xff]);
        let mut r = Reader::new(input.clone());
        let s = r.bytes_u16(10, "s").unwrap();
        assert_eq!(&s[..], b"abc");
        // The slice points into the input buffer.
        assert_eq!(s.as_ptr(), input[2..].as_ptr());
        assert_eq!(r.u16("x"), Err(DecodeError::Truncated { what: "x" }));
        assert_eq!(r.expect_end(), Err(DecodeError::TrailingBytes(1)));
        assert_eq!(r.u8("y"), Ok(0xff));
        assert_eq!(r.expect_end(), Ok(()));
    }

    #[test]
    fn reads_across_parts_match_reads_of_the_whole() {
        let whole: Vec<u8> = (0u8..40).collect();
        for cut_a in 0..whole.len() {
            for cut_b in cut_a..whole.len() {
                let b = Bytes::from(whole.clone());
                let parts = vec![b.slice(..cut_a), b.slice(cut_a..cut_b), b.slice(cut_b..)];
                let mut r = Reader::from_parts(parts);
                assert_eq!(r.u8("a"), Ok(0));
                assert_eq!(r.u16("b"), Ok(0x0102));
                assert_eq!(r.u32("c"), Ok(0x0304_0506));
                assert_eq!(r.u64("d"), Ok(0x0708_090a_0b0c_0d0e));
                assert_eq!(&r.bytes(5, "e").unwrap()[..], &whole[15..20]);
                let p = r.payload(10, "f").unwrap();
                assert_eq!(p, whole[20..30]);
                let mut sub = r.sub(6, "g").unwrap();
                assert_eq!(sub.remaining(), 6);
                assert_eq!(&sub.bytes(6, "h").unwrap()[..], &whole[30..36]);
                assert_eq!(sub.expect_end(), Ok(()));
                assert_eq!(r.remaining(), 4);
                assert_eq!(r.u64("i"), Err(DecodeError::Truncated { what: "i" }));
                assert_eq!(r.payload(5, "j"), Err(DecodeError::Truncated { what: "j" }));
                assert_eq!(r.u32("k"), Ok(0x2425_2627));
                assert_eq!(r.expect_end(), Ok(()));
            }
        }
    }

    #[test]
    fn payloads_are_slices_of_the_parts() {
        let a = Bytes::from_static(b"abcd");
        let b = Bytes::from_static(b"efgh");
        let mut r = Reader::from_parts(vec![a.clone(), b.clone()]);
        r.u8("x").unwrap();
        let p = r.payload(6, "p").unwrap();
        let parts: Vec<_> = p.parts().collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].as_ptr(), a[1..].as_ptr());
        assert_eq!(parts[1].as_ptr(), b.as_ptr());
    }

    #[test]
    fn length_prefix_over_limit_is_rejected_before_reading() {
        let mut r = Reader::new(Bytes::from_static(&[0xff, 0xff]));
        assert_eq!(
            r.bytes_u16(16, "key"),
            Err(DecodeError::FieldTooLong { what: "key", len: 0xffff, max: 16 })
        );
    }
}
