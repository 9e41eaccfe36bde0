//! The bounded reader and the writer every frame is built on.
//!
//! `Reader` reads from a `Bytes` and hands out zero-copy slices. Every read is checked against
//! what remains; nothing is read past the end and nothing is allocated from an unchecked length.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::DecodeError;

/// A bounded, zero-copy reader over one frame body.
#[derive(Debug)]
pub struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    /// A reader over the whole of `buf`.
    pub fn new(buf: Bytes) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Takes the next `len` bytes as a slice of the input (no copy).
    pub fn bytes(&mut self, len: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if len > self.remaining() {
            return Err(DecodeError::Truncated { what });
        }
        let out = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(out)
    }

    /// A reader over the next `len` bytes; this reader moves past them (rustls' `Reader::sub`).
    pub fn sub(&mut self, len: usize, what: &'static str) -> Result<Reader, DecodeError> {
        Ok(Reader::new(self.bytes(len, what)?))
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        if N > self.remaining() {
            return Err(DecodeError::Truncated { what });
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
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
    fn length_prefix_over_limit_is_rejected_before_reading() {
        let mut r = Reader::new(Bytes::from_static(&[0xff, 0xff]));
        assert_eq!(
            r.bytes_u16(16, "key"),
            Err(DecodeError::FieldTooLong { what: "key", len: 0xffff, max: 16 })
        );
    }
}
