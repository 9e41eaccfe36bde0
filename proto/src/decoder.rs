//! The streaming frame decoder: bytes in, frames out.
//!
//! Call order: [`FrameDecoder::handle_chunk`] (or [`FrameDecoder::handle_bytes`]) with whatever
//! arrived on a QUIC stream, then [`FrameDecoder::poll_frame`] until it returns `None`. A
//! non-fatal error skips the bad frame (its request id, when readable, is in the error); a fatal
//! one means the byte stream has lost its framing and must be closed.
//!
//! Received chunks are kept as they came, never reassembled: a frame's body is read from the
//! chunks it spans, and a Publish's record payloads are slices of them ([`crate::Payload`]).
//! Chunks shorter than [`MIN_ZERO_COPY_CHUNK_BYTES`] are copied together instead, so that a
//! peer sending tiny chunks cannot make each byte it buffers pin a whole packet buffer.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use crate::codec::Reader;
use crate::correlation::{request_id_bytes, request_id_of};
use crate::error::{DecodeError, FrameError};
use crate::frame::{Frame, RequestId};
use crate::header::{Capabilities, Flags, FrameHeader, FrameType, RawHeader, HEADER_LEN};
use crate::limits::Limits;

/// Received chunks at least this long are kept as they came (zero-copy); shorter ones are
/// copied into a buffer of their own, so buffered bytes pin at most about
/// `packet size / MIN_ZERO_COPY_CHUNK_BYTES` times their size in packet buffers.
pub const MIN_ZERO_COPY_CHUNK_BYTES: usize = 512;

/// The most bytes a header and a request id take: what [`FrameDecoder`] reads before a frame
/// is whole.
const HEAD_PEEK_BYTES: usize = HEADER_LEN + 8;

/// Decodes frames from a byte stream, enforcing limits and negotiated flag bits.
#[derive(Debug)]
pub struct FrameDecoder {
    limits: Limits,
    accepted: Capabilities,
    /// Undecoded bytes, in order: received chunks kept as they came, then `small`.
    parts: VecDeque<Bytes>,
    /// Short chunks copied together; logically after `parts`.
    small: BytesMut,
    /// Bytes in `parts` and `small`.
    buffered: usize,
    /// Body bytes still to discard after a skipped frame.
    skip: usize,
    failed: bool,
}

impl FrameDecoder {
    /// A decoder enforcing `limits` and accepting the flag bits that `accepted` allows (for a
    /// broker: the capabilities it advertised; for a client: none it has not asked for).
    pub fn new(limits: Limits, accepted: Capabilities) -> Self {
        Self {
            limits,
            accepted,
            parts: VecDeque::new(),
            small: BytesMut::new(),
            buffered: 0,
            skip: 0,
            failed: false,
        }
    }

    /// Changes the accepted capabilities (after Hello / HelloOk).
    pub fn set_accepted(&mut self, accepted: Capabilities) {
        self.accepted = accepted;
    }

    /// Changes the limits, for the frames whose header is decoded from now on (a stream whose
    /// first frame is known to be small can be read with tight limits until it arrived).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Bytes buffered and not yet decoded. Bounded by one frame plus one input chunk.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered
    }

    /// How many bytes this decoder wants before it can yield the next frame; a reader can cap
    /// its next read with it.
    pub fn wanted_bytes(&self) -> usize {
        if self.skip > 0 {
            return self.skip;
        }
        let need = match self.header() {
            None | Some(Err(_)) => HEADER_LEN,
            Some(Ok(raw)) => match self.header_error(&raw) {
                Some(_) => HEADER_LEN + request_id_bytes(&raw),
                None => HEADER_LEN + raw.body_len as usize,
            },
        };
        need.saturating_sub(self.buffered).max(1)
    }

    /// Feeds bytes received from the peer (copied).
    pub fn handle_bytes(&mut self, data: &[u8]) {
        let Some(data) = self.unskipped(data) else { return };
        self.small.extend_from_slice(data);
        self.buffered += data.len();
    }

    /// Feeds a received chunk. The chunk is kept as it is (its payload bytes are not copied)
    /// unless it is shorter than [`MIN_ZERO_COPY_CHUNK_BYTES`].
    pub fn handle_chunk(&mut self, chunk: Bytes) {
        self.push_chunk(chunk, MIN_ZERO_COPY_CHUNK_BYTES);
    }

    /// The next complete frame, an error, or `None` when more bytes are needed.
    ///
    /// A frame rejected by its header alone (too large, unknown type, flag bits) is reported
    /// once the first 8 bytes of its body arrived when its type puts a request id there, so
    /// the error carries it; nothing more of the body is waited for.
    pub fn poll_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        if self.failed || self.skip > 0 {
            return None;
        }
        let raw = match self.header()? {
            Ok(raw) => raw,
            Err(error) => return Some(Err(self.fatal(None, None, error))),
        };
        let frame_type = FrameType::from_u8(raw.frame_type);
        let total = HEADER_LEN + raw.body_len as usize;
        if let Some((error, fatal)) = self.header_error(&raw) {
            if self.buffered < HEADER_LEN + request_id_bytes(&raw) {
                return None;
            }
            let request_id = self.request_id(&raw);
            if fatal {
                return Some(Err(self.fatal(frame_type, request_id, error)));
            }
            self.discard(total);
            return Some(Err(FrameError { frame_type, request_id, fatal: false, error }));
        }
        let frame_type = frame_type?;
        if self.buffered < total {
            return None;
        }
        let request_id = self.request_id(&raw);
        let mut parts = self.take(total);
        skip_front(&mut parts, HEADER_LEN);
        let body = Reader::from_parts(parts);
        Some(Frame::decode_parts(frame_type, raw.flags, body, &self.limits).map_err(|error| {
            FrameError { frame_type: Some(frame_type), request_id, fatal: false, error }
        }))
    }

    /// Call when the byte stream ended: an error if it ended inside a frame (correlated with
    /// the frame's request id when enough of it arrived), `None` if it ended between frames.
    /// A frame whose header was already wrong is reported with that error, else `Truncated`.
    pub fn handle_end(&mut self) -> Option<FrameError> {
        if self.failed || (self.skip == 0 && self.buffered == 0) {
            return None;
        }
        let truncated = DecodeError::Truncated { what: "frame (the stream ended inside it)" };
        let (frame_type, request_id, error) = match self.header() {
            Some(Ok(raw)) => (
                FrameType::from_u8(raw.frame_type),
                self.request_id(&raw),
                self.header_error(&raw).map_or(truncated, |(error, _)| error),
            ),
            Some(Err(error)) => (None, None, error),
            None => (None, None, truncated),
        };
        Some(self.fatal(frame_type, request_id, error))
    }

    /// Buffers `chunk` past any bytes still to skip: as it is when at least `min_zero_copy`
    /// long, else copied into `small`.
    fn push_chunk(&mut self, mut chunk: Bytes, min_zero_copy: usize) {
        let Some(rest) = self.unskipped(&chunk) else { return };
        let skipped = chunk.len() - rest.len();
        chunk.advance(skipped);
        if chunk.is_empty() {
            return;
        }
        self.buffered += chunk.len();
        if chunk.len() < min_zero_copy {
            self.small.extend_from_slice(&chunk);
            return;
        }
        self.flush_small();
        self.parts.push_back(chunk);
    }

    /// What of `data` is left once the bytes still to skip are dropped; `None` after a fatal
    /// error.
    fn unskipped<'a>(&mut self, data: &'a [u8]) -> Option<&'a [u8]> {
        if self.failed {
            return None;
        }
        let n = self.skip.min(data.len());
        self.skip -= n;
        Some(&data[n..])
    }

    /// Moves the copied short chunks into `parts`, keeping the byte order.
    fn flush_small(&mut self) {
        if !self.small.is_empty() {
            self.parts.push_back(self.small.split().freeze());
        }
    }

    /// Copies the first bytes buffered into `dst`, as many as are here; returns how many.
    fn peek(&self, dst: &mut [u8]) -> usize {
        let mut at = 0;
        for part in self.parts.iter().map(|p| &p[..]).chain(std::iter::once(&self.small[..])) {
            if at == dst.len() {
                break;
            }
            let n = part.len().min(dst.len() - at);
            dst[at..at + n].copy_from_slice(&part[..n]);
            at += n;
        }
        at
    }

    /// The header of the next frame, once its 10 bytes are here.
    fn header(&self) -> Option<Result<RawHeader, DecodeError>> {
        let mut head = [0u8; HEADER_LEN];
        if self.peek(&mut head) < HEADER_LEN {
            return None;
        }
        Some(FrameHeader::decode(&head))
    }

    /// The request id of the next frame (whose header is here), when it carries one and its
    /// bytes arrived.
    fn request_id(&self, raw: &RawHeader) -> Option<RequestId> {
        let mut head = [0u8; HEAD_PEEK_BYTES];
        let have = self.peek(&mut head);
        request_id_of(raw, &head[HEADER_LEN..have])
    }

    /// What the header alone rejects, and whether that loses the framing: a frame too large
    /// to read (fatal), or one whose body is skipped by its length (unknown type, flag bits).
    fn header_error(&self, raw: &RawHeader) -> Option<(DecodeError, bool)> {
        let total = HEADER_LEN as u64 + u64::from(raw.body_len);
        let frame_type = FrameType::from_u8(raw.frame_type);
        if total > u64::from(self.limits.max_frame_bytes) {
            let error = DecodeError::FrameTooLarge { len: total, max: self.limits.max_frame_bytes };
            return Some((error, true));
        }
        match frame_type {
            None => Some((DecodeError::UnknownFrameType(raw.frame_type), false)),
            Some(t) => check_flags(t, raw.flags, self.accepted).err().map(|e| (e, false)),
        }
    }

    fn fatal(
        &mut self,
        frame_type: Option<FrameType>,
        request_id: Option<RequestId>,
        error: DecodeError,
    ) -> FrameError {
        self.failed = true;
        self.clear();
        self.skip = 0;
        FrameError { frame_type, request_id, fatal: true, error }
    }

    /// Drops every buffered byte, releasing the chunks.
    fn clear(&mut self) {
        self.parts = VecDeque::new();
        self.small = BytesMut::new();
        self.buffered = 0;
    }

    /// Takes the first `n` buffered bytes (which the caller checked are there), as the parts
    /// they are in.
    fn take(&mut self, n: usize) -> Vec<Bytes> {
        debug_assert!(n <= self.buffered, "take: {n} of {} buffered", self.buffered);
        self.flush_small();
        self.buffered -= n;
        let mut out = Vec::with_capacity(4);
        let mut left = n;
        while left > 0 {
            // The caller checked that `n` bytes are buffered: a part is here.
            let Some(part) = self.parts.front_mut() else { break };
            if part.len() > left {
                out.push(part.split_to(left));
                left = 0;
            } else {
                left -= part.len();
                if let Some(part) = self.parts.pop_front() {
                    out.push(part);
                }
            }
        }
        out
    }

    fn discard(&mut self, total: usize) {
        if self.buffered >= total {
            let _ = self.take(total);
        } else {
            self.skip = total - self.buffered;
            self.clear();
        }
    }
}

/// Drops the first `n` bytes of `parts` (which hold at least that many).
fn skip_front(parts: &mut Vec<Bytes>, mut n: usize) {
    let mut whole = 0;
    for part in parts.iter_mut() {
        if n == 0 {
            break;
        }
        let k = part.len().min(n);
        part.advance(k);
        n -= k;
        if part.is_empty() {
            whole += 1;
        }
    }
    parts.drain(..whole);
}

/// Decodes exactly one frame from `buf`, which must hold it whole and nothing else.
pub fn decode_frame(
    buf: Bytes,
    limits: &Limits,
    accepted: Capabilities,
) -> Result<Frame, FrameError> {
    let mut decoder = FrameDecoder::new(*limits, accepted);
    let len = buf.len();
    // The caller holds the whole frame: kept as it is, however short.
    decoder.push_chunk(buf, 0);
    match decoder.poll_frame() {
        Some(Ok(frame)) if decoder.buffered_bytes() == 0 => Ok(frame),
        Some(Ok(frame)) => Err(FrameError {
            frame_type: Some(frame.frame_type()),
            request_id: frame.request_id(),
            fatal: true,
            error: DecodeError::TrailingBytes(decoder.buffered_bytes()),
        }),
        Some(Err(e)) => Err(e),
        // Short input: the frame's header error, or `Truncated`, with its request id if readable.
        None => Err(match decoder.handle_end() {
            Some(e) if len >= HEADER_LEN => e,
            _ => FrameError {
                frame_type: None,
                request_id: None,
                fatal: true,
                error: DecodeError::Truncated { what: "header" },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::AckRequest;
    use crate::frame::Publish;
    use crate::AckMode;

    fn publish(ack: bool, key: bool) -> Frame {
        Frame::Publish(Publish {
            oldest_pending: false,
            ack: ack.then_some(AckRequest { request_id: RequestId(42), mode: AckMode::Durable }),
            key: key.then(|| Bytes::from_static(b"k")),
            producer: None,
            stream: "t/n/s".into(),
            records: vec![Bytes::from_static(b"hello").into()],
        })
    }

    /// `frame` with `extra` flag bits set in its header.
    fn with_flags(frame: &Frame, extra: u16) -> Vec<u8> {
        let mut bytes = frame.to_bytes().to_vec();
        let flags = u16::from_be_bytes([bytes[4], bytes[5]]) | extra;
        bytes[4..6].copy_from_slice(&flags.to_be_bytes());
        bytes
    }

    fn create_stream(id: u64) -> Frame {
        Frame::CreateStream(crate::CreateStream {
            request_id: RequestId(id),
            stream: "t/n/s".into(),
            shards: 1,
            retention: crate::Retention::default(),
            replicas: None,
        })
    }

    /// A reader that asks for `wanted_bytes()` gets the header alone first (the broker's
    /// reader does exactly that): the error must still carry the request id.
    fn feed_as_wanted(d: &mut FrameDecoder, bytes: &[u8]) -> Vec<Result<Frame, FrameError>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = d.wanted_bytes().clamp(1, bytes.len() - at);
            d.handle_bytes(&bytes[at..at + n]);
            at += n;
            while let Some(r) = d.poll_frame() {
                out.push(r);
            }
        }
        out
    }

    #[test]
    fn unknown_flags_carry_the_request_id_when_the_header_arrives_alone() {
        let bytes = [with_flags(&create_stream(77), 0x0100), Frame::Ping(1).to_bytes().to_vec()];
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        let out = feed_as_wanted(&mut d, &bytes.concat());
        let err = out[0].clone().unwrap_err();
        assert_eq!(
            err.error,
            DecodeError::UnknownFlags { frame_type: FrameType::CreateStream, flags: 0x0100 }
        );
        assert_eq!((err.request_id, err.fatal), (Some(RequestId(77)), false));
        assert_eq!(out[1], Ok(Frame::Ping(1)));
        assert_eq!(out.len(), 2);

        let mut p = publish(true, false);
        if let Frame::Publish(p) = &mut p {
            p.ack = Some(AckRequest { request_id: RequestId(4242), mode: AckMode::Written });
        }
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        let out = feed_as_wanted(&mut d, &with_flags(&p, 0x0100));
        let err = out[0].clone().unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::UnknownFlags);
        assert_eq!(err.request_id, Some(RequestId(4242)));
        assert_eq!(d.buffered_bytes(), 0);
    }

    #[test]
    fn a_header_error_waits_for_the_request_id_and_no_more() {
        let bytes = with_flags(&create_stream(5), 0x8000);
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(&bytes[..HEADER_LEN]);
        assert!(d.poll_frame().is_none());
        assert_eq!(d.wanted_bytes(), 8);
        d.handle_bytes(&bytes[HEADER_LEN..HEADER_LEN + 7]);
        assert!(d.poll_frame().is_none());
        assert_eq!(d.wanted_bytes(), 1);
        d.handle_bytes(&bytes[HEADER_LEN + 7..HEADER_LEN + 8]);
        let err = d.poll_frame().unwrap().unwrap_err();
        assert_eq!(err.request_id, Some(RequestId(5)));
        // The rest of the body is skipped as it arrives.
        assert_eq!(d.wanted_bytes(), bytes.len() - HEADER_LEN - 8);
        d.handle_bytes(&bytes[HEADER_LEN + 8..]);
        d.handle_bytes(&Frame::Ping(2).to_bytes());
        assert_eq!(d.poll_frame(), Some(Ok(Frame::Ping(2))));
    }

    #[test]
    fn a_header_error_without_a_request_id_does_not_wait() {
        // Unknown type: its layout, so its request id, is unknown.
        let mut bytes = create_stream(5).to_bytes().to_vec();
        bytes[3] = 0x7f;
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(&bytes[..HEADER_LEN]);
        let err = d.poll_frame().unwrap().unwrap_err();
        assert_eq!((err.error, err.request_id), (DecodeError::UnknownFrameType(0x7f), None));
        // An unacked publish has no request id; a body shorter than 8 bytes cannot hold one.
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(&with_flags(&publish(false, false), 0x0100)[..HEADER_LEN]);
        assert_eq!(d.poll_frame().unwrap().unwrap_err().request_id, None);
        let mut short = with_flags(&create_stream(5), 0x0100)[..HEADER_LEN + 4].to_vec();
        short[6..10].copy_from_slice(&4u32.to_be_bytes());
        let mut d = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        d.handle_bytes(&short[..HEADER_LEN]);
        assert_eq!(d.poll_frame().unwrap().unwrap_err().request_id, None);
    }

    #[test]
    fn an_oversized_frame_with_a_request_id_carries_it() {
        let limits = Limits { max_frame_bytes: 64, ..Limits::default() };
        let big = Frame::Publish(Publish {
            oldest_pending: false,
            ack: Some(AckRequest { request_id: RequestId(9), mode: AckMode::Written }),
            key: None,
            producer: None,
            stream: "t/n/s".into(),
            records: vec![vec![0u8; 100].into()],
        });
        let mut d = FrameDecoder::new(limits, Capabilities::ALL);
        let out = feed_as_wanted(&mut d, &big.to_bytes());
        assert_eq!(out.len(), 1);
        let err = out[0].clone().unwrap_err();
        assert_eq!(
            (err.code(), err.request_id, err.fatal),
            (crate::ErrorCode::FrameTooLarge, Some(RequestId(9)), true)
        );
    }

    #[test]
    fn a_stream_ending_after_a_bad_header_reports_the_header_error() {
        let limits = Limits { max_frame_bytes: 64, ..Limits::default() };
        let mut d = FrameDecoder::new(limits, Capabilities::ALL);
        let bytes = with_flags(&create_stream(5), 0x0100);
        d.handle_bytes(&bytes[..HEADER_LEN + 3]);
        assert!(d.poll_frame().is_none());
        let err = d.handle_end().unwrap();
        assert_eq!(err.code(), crate::ErrorCode::UnknownFlags);
        assert_eq!((err.request_id, err.fatal), (None, true));
        assert!(d.handle_end().is_none());
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
            oldest_pending: false,
            ack: None,
            key: None,
            producer: None,
            stream: "t/n/s".into(),
            records: vec![vec![0u8; 100].into()],
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
    fn tight_limits_for_a_first_frame_then_the_full_ones() {
        // A stream read with a small limit until its first (small) frame arrived, then with
        // the full limits: the large frame after it decodes.
        let first = Frame::Pong(7);
        let big = Frame::Publish(Publish {
            oldest_pending: false,
            ack: None,
            key: None,
            producer: None,
            stream: "t/n/s".into(),
            records: vec![vec![0u8; 1000].into()],
        });
        let tight = Limits { max_frame_bytes: first.to_bytes().len() as u32, ..Limits::default() };
        let mut d = FrameDecoder::new(tight, Capabilities::ALL);
        d.handle_bytes(&first.to_bytes());
        d.handle_bytes(&big.to_bytes());
        assert_eq!(d.poll_frame().unwrap().unwrap(), first);
        d.set_limits(Limits::default());
        assert_eq!(d.poll_frame().unwrap().unwrap(), big);
        // Without the change, the large frame is refused by its header.
        let mut d = FrameDecoder::new(tight, Capabilities::ALL);
        d.handle_bytes(&big.to_bytes());
        assert!(d.poll_frame().unwrap().is_err());
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
        assert_eq!(p.records[0].as_contiguous().unwrap().as_ptr(), bytes[pos..].as_ptr());
    }
}
