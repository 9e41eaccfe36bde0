//! The streaming frame decoder: bytes in, frames out.
//!
//! Call order: [`FrameDecoder::handle_bytes`] with whatever arrived on a QUIC stream, then
//! [`FrameDecoder::poll_frame`] until it returns `None`. A non-fatal error skips the bad frame
//! (its request id, when readable, is in the error); a fatal one means the byte stream has lost
//! its framing and must be closed.

use bytes::{Bytes, BytesMut};

use crate::error::{DecodeError, FrameError};
use crate::frame::{Frame, RequestId};
use crate::header::{Capabilities, Flags, FrameHeader, FrameType, HEADER_LEN};
use crate::limits::Limits;

/// Decodes frames from a byte stream, enforcing limits and negotiated flag bits.
#[derive(Debug)]
pub struct FrameDecoder {
    limits: Limits,
    accepted: Capabilities,
    /// A received chunk kept as it came (zero-copy) while nothing else is buffered.
    chunk: Bytes,
    /// Accumulated bytes once frames straddle chunks.
    buf: BytesMut,
    /// Body bytes still to discard after a skipped frame.
    skip: usize,
    failed: bool,
}

impl FrameDecoder {
    /// A decoder enforcing `limits` and accepting the flag bits that `accepted` allows (for a
    /// broker: the capabilities it advertised; for a client: none it has not asked for).
    pub fn new(limits: Limits, accepted: Capabilities) -> Self {
        Self { limits, accepted, chunk: Bytes::new(), buf: BytesMut::new(), skip: 0, failed: false }
    }

    /// Changes the accepted capabilities (after Hello / HelloOk).
    pub fn set_accepted(&mut self, accepted: Capabilities) {
        self.accepted = accepted;
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Bytes buffered and not yet decoded. Bounded by one frame plus one input chunk.
    pub fn buffered_bytes(&self) -> usize {
        self.chunk.len() + self.buf.len()
    }

    /// How many bytes this decoder wants before it can yield the next frame; a reader can cap
    /// its next read with it.
    pub fn wanted_bytes(&self) -> usize {
        if self.skip > 0 {
            return self.skip;
        }
        let data = self.data();
        if data.len() < HEADER_LEN {
            return HEADER_LEN - data.len();
        }
        let body_len = u32::from_be_bytes([data[6], data[7], data[8], data[9]]);
        (HEADER_LEN + body_len as usize).saturating_sub(data.len()).max(1)
    }

    /// Feeds bytes received from the peer.
    pub fn handle_bytes(&mut self, mut data: &[u8]) {
        if self.failed {
            return;
        }
        if self.skip > 0 {
            let n = self.skip.min(data.len());
            self.skip -= n;
            data = &data[n..];
        }
        if !self.chunk.is_empty() {
            let chunk = std::mem::take(&mut self.chunk);
            self.buf.extend_from_slice(&chunk);
        }
        self.buf.extend_from_slice(data);
    }

    /// Feeds a received chunk; when the buffer is empty and the chunk holds whole frames this
    /// keeps the chunk's allocation (no copy).
    pub fn handle_chunk(&mut self, chunk: Bytes) {
        if self.buf.is_empty() && self.chunk.is_empty() && self.skip == 0 && !self.failed {
            self.chunk = chunk;
        } else {
            self.handle_bytes(&chunk);
        }
    }

    /// The next complete frame, an error, or `None` when more bytes are needed.
    pub fn poll_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        if self.failed || self.skip > 0 || self.data().len() < HEADER_LEN {
            return None;
        }
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&self.data()[..HEADER_LEN]);
        let raw = match FrameHeader::decode(&head) {
            Ok(raw) => raw,
            Err(error) => return Some(Err(self.fatal(None, error))),
        };
        let total = HEADER_LEN as u64 + u64::from(raw.body_len);
        if total > u64::from(self.limits.max_frame_bytes) {
            let error = DecodeError::FrameTooLarge { len: total, max: self.limits.max_frame_bytes };
            return Some(Err(self.fatal(FrameType::from_u8(raw.frame_type), error)));
        }
        let total = total as usize;
        let frame_type = FrameType::from_u8(raw.frame_type);
        // Header-level errors that leave the framing intact: skip the body, keep going.
        let header_error = match frame_type {
            None => Some(DecodeError::UnknownFrameType(raw.frame_type)),
            Some(t) => check_flags(t, raw.flags, self.accepted).err(),
        };
        if let Some(error) = header_error {
            let request_id = frame_type.and_then(|t| self.peek_request_id(t, raw.flags));
            self.discard(total);
            return Some(Err(FrameError { frame_type, request_id, fatal: false, error }));
        }
        let frame_type = frame_type?;
        if self.data().len() < total {
            return None;
        }
        let mut frame = self.take(total);
        let body = frame.split_off(HEADER_LEN);
        let request_id = request_id_at_start(frame_type, raw.flags, &body);
        Some(Frame::decode_body(frame_type, raw.flags, body, &self.limits).map_err(|error| {
            FrameError { frame_type: Some(frame_type), request_id, fatal: false, error }
        }))
    }

    /// Call when the byte stream ended: an error if it ended inside a frame (correlated with
    /// the frame's request id when enough of it arrived), `None` if it ended between frames.
    pub fn handle_end(&mut self) -> Option<FrameError> {
        if self.failed || (self.skip == 0 && self.data().is_empty()) {
            return None;
        }
        let data = self.data();
        let (frame_type, request_id) = if data.len() >= HEADER_LEN {
            let t = FrameType::from_u8(data[3]);
            let flags = Flags(u16::from_be_bytes([data[4], data[5]]));
            (t, t.and_then(|t| request_id_at_start(t, flags, &data[HEADER_LEN..])))
        } else {
            (None, None)
        };
        let error = DecodeError::Truncated { what: "frame (the stream ended inside it)" };
        let mut e = self.fatal(frame_type, error);
        e.request_id = request_id;
        Some(e)
    }

    fn fatal(&mut self, frame_type: Option<FrameType>, error: DecodeError) -> FrameError {
        self.failed = true;
        self.buf = BytesMut::new();
        self.chunk = Bytes::new();
        FrameError { frame_type, request_id: None, fatal: true, error }
    }

    /// The undecoded bytes: the zero-copy chunk, or the accumulation buffer.
    fn data(&self) -> &[u8] {
        if self.chunk.is_empty() {
            &self.buf
        } else {
            &self.chunk
        }
    }

    /// Takes the first `n` undecoded bytes (which the caller checked are there).
    fn take(&mut self, n: usize) -> Bytes {
        if self.chunk.is_empty() {
            self.buf.split_to(n).freeze()
        } else {
            self.chunk.split_to(n)
        }
    }

    fn discard(&mut self, total: usize) {
        let have = self.data().len();
        if have >= total {
            let _ = self.take(total);
        } else {
            self.skip = total - have;
            self.buf.clear();
            self.chunk = Bytes::new();
        }
    }

    fn peek_request_id(&self, frame_type: FrameType, flags: Flags) -> Option<RequestId> {
        request_id_at_start(frame_type, flags, &self.data()[HEADER_LEN..])
    }
}

/// Decodes exactly one frame from `buf`, which must hold it whole and nothing else.
pub fn decode_frame(
    buf: Bytes,
    limits: &Limits,
    accepted: Capabilities,
) -> Result<Frame, FrameError> {
    let mut decoder = FrameDecoder::new(*limits, accepted);
    let len = buf.len();
    decoder.handle_chunk(buf);
    match decoder.poll_frame() {
        Some(Ok(frame)) if decoder.buffered_bytes() == 0 => Ok(frame),
        Some(Ok(frame)) => Err(FrameError {
            frame_type: Some(frame.frame_type()),
            request_id: None,
            fatal: true,
            error: DecodeError::TrailingBytes(decoder.buffered_bytes()),
        }),
        Some(Err(e)) => Err(e),
        None => Err(FrameError {
            frame_type: None,
            request_id: None,
            fatal: true,
            error: DecodeError::Truncated {
                what: if len < HEADER_LEN { "header" } else { "body" },
            },
        }),
    }
}

fn check_flags(
    frame_type: FrameType,
    flags: Flags,
    accepted: Capabilities,
) -> Result<(), DecodeError> {
    let unknown = flags.0 & !frame_type.known_flags().0;
    if unknown != 0 {
        return Err(DecodeError::UnknownFlags { frame_type, flags: unknown });
    }
    let unadvertised = flags.0 & !accepted.allowed_flags(frame_type).0;
    if unadvertised != 0 {
        return Err(DecodeError::FlagNotAdvertised { frame_type, flags: unadvertised });
    }
    Ok(())
}

/// The request id at offset 0 of a body, for frame types that carry one there.
fn request_id_at_start(frame_type: FrameType, flags: Flags, body: &[u8]) -> Option<RequestId> {
    let has = frame_type.has_request_id()
        || (frame_type == FrameType::Publish && flags.contains(Flags::ACKED));
    if !has || body.len() < 8 {
        return None;
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&body[..8]);
    Some(RequestId(u64::from_be_bytes(id)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::AckRequest;
    use crate::frame::Publish;
    use crate::AckMode;

    fn publish(ack: bool, key: bool) -> Frame {
        Frame::Publish(Publish {
            ack: ack.then_some(AckRequest { request_id: RequestId(42), mode: AckMode::Durable }),
            key: key.then(|| Bytes::from_static(b"k")),
            stream: "t/n/s".into(),
            records: vec![Bytes::from_static(b"hello")],
        })
    }

    #[test]
    fn frames_split_across_chunks_are_reassembled() {
        let bytes = [publish(true, true).to_bytes(), Frame::Ping(7).to_bytes()].concat();
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        let mut out = Vec::new();
        for b in bytes.chunks(3) {
            d.handle_bytes(b);
            while let Some(f) = d.poll_frame() {
                out.push(f.unwrap());
            }
        }
        assert_eq!(out, vec![publish(true, true), Frame::Ping(7)]);
        assert_eq!(d.buffered_bytes(), 0);
    }

    #[test]
    fn unadvertised_flag_is_rejected_with_request_id_and_skipped() {
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::PUBLISH_ACKED);
        d.handle_bytes(&publish(true, true).to_bytes());
        d.handle_bytes(&Frame::Ping(1).to_bytes());
        let err = d.poll_frame().unwrap().unwrap_err();
        assert_eq!(err.request_id, Some(RequestId(42)));
        assert!(!err.fatal);
        assert_eq!(
            err.error,
            DecodeError::FlagNotAdvertised { frame_type: FrameType::Publish, flags: 0x0002 }
        );
        assert_eq!(d.poll_frame().unwrap().unwrap(), Frame::Ping(1));
    }

    #[test]
    fn unknown_flag_is_rejected_not_masked() {
        let mut bytes = BytesMut::from(&Frame::Ping(1).to_bytes()[..]);
        bytes[5] |= 0x80;
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(&bytes);
        let err = d.poll_frame().unwrap().unwrap_err();
        assert_eq!(
            err.error,
            DecodeError::UnknownFlags { frame_type: FrameType::Ping, flags: 0x80 }
        );
        assert!(!err.fatal);
        assert!(d.poll_frame().is_none());
    }

    #[test]
    fn oversized_frame_is_fatal_before_buffering_its_body() {
        let limits = Limits { max_frame_bytes: 64, ..Limits::default() };
        let mut d = FrameDecoder::new(limits, Capabilities::ALL);
        let big = Frame::Publish(Publish {
            ack: None,
            key: None,
            stream: "t/n/s".into(),
            records: vec![Bytes::from(vec![0u8; 100])],
        });
        d.handle_bytes(&big.to_bytes()[..HEADER_LEN]);
        let err = d.poll_frame().unwrap().unwrap_err();
        assert!(err.fatal);
        assert_eq!(err.error.code(), crate::ErrorCode::FrameTooLarge);
        d.handle_bytes(b"more");
        assert!(d.poll_frame().is_none());
        assert_eq!(d.buffered_bytes(), 0);
    }

    #[test]
    fn malformed_body_keeps_framing_and_correlates() {
        // An acked publish whose ack mode byte is 9.
        let mut bytes = BytesMut::from(&publish(true, false).to_bytes()[..]);
        bytes[HEADER_LEN + 8] = 9;
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(&bytes);
        d.handle_bytes(&Frame::Pong(3).to_bytes());
        let err = d.poll_frame().unwrap().unwrap_err();
        assert_eq!(err.request_id, Some(RequestId(42)));
        assert_eq!(err.error, DecodeError::InvalidValue { what: "ack_mode", value: 9 });
        assert_eq!(d.poll_frame().unwrap().unwrap(), Frame::Pong(3));
    }

    #[test]
    fn a_stream_ending_inside_a_frame_is_reported_with_its_request_id() {
        let bytes = publish(true, false).to_bytes();
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(&bytes[..bytes.len() - 3]);
        assert!(d.poll_frame().is_none());
        let err = d.handle_end().unwrap();
        assert_eq!(err.request_id, Some(RequestId(42)));
        assert!(matches!(err.error, DecodeError::Truncated { .. }));
        let mut clean = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        clean.handle_bytes(&bytes);
        assert!(clean.poll_frame().unwrap().is_ok());
        assert!(clean.handle_end().is_none());
    }

    #[test]
    fn bad_magic_is_fatal() {
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(b"GET / HTTP/1.1\r\n");
        let err = d.poll_frame().unwrap().unwrap_err();
        assert!(err.fatal);
        assert_eq!(err.error, DecodeError::BadMagic(0x4745));
    }

    #[test]
    fn decode_frame_rejects_trailing_and_short_input() {
        let mut b = Frame::Ping(1).to_bytes().to_vec();
        b.push(0);
        let err = decode_frame(Bytes::from(b), &Limits::default(), Capabilities::ALL).unwrap_err();
        assert_eq!(err.error, DecodeError::TrailingBytes(1));
        let err = decode_frame(Bytes::from_static(b"FX"), &Limits::default(), Capabilities::ALL)
            .unwrap_err();
        assert_eq!(err.error, DecodeError::Truncated { what: "header" });
    }

    #[test]
    fn zero_copy_payloads_point_into_the_input() {
        let bytes = publish(false, true).to_bytes();
        let frame = decode_frame(bytes.clone(), &Limits::default(), Capabilities::ALL).unwrap();
        let Frame::Publish(p) = frame else { panic!("not a publish") };
        let pos = bytes.len() - 5;
        assert_eq!(p.records[0].as_ptr(), bytes[pos..].as_ptr());
    }
}
