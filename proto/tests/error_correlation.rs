//! Every rejected frame whose body starts with a readable request id is answered with that id
//! (docs/protocol.md, "Frame header"), whatever the rejection and however the bytes arrive:
//! all at once, in random chunks, or as a reader that asks for `wanted_bytes()` gets them
//! (the header alone first, as the broker reads).

mod strategies;

use bytes::Bytes;
use felix_proto::*;
use proptest::prelude::*;

/// How a valid frame is spoiled.
#[derive(Clone, Copy, Debug)]
enum Spoil {
    /// A flag bit no frame type defines (bits 5..16).
    UnknownFlag(u8),
    /// A decoder whose frame limit is below the frame's length.
    TooLarge,
    /// One byte appended to the body (and counted in the header).
    TrailingByte,
    /// The stream ends `n` bytes before the frame does (at most the whole body).
    CutByFin(usize),
    /// A decoder that accepts no capabilities (flag bits of a Publish, CreateStream,
    /// Subscribe or SubscribeOk are not advertised).
    NotAdvertised,
}

fn spoil() -> impl Strategy<Value = Spoil> {
    prop_oneof![
        // Bits 0-5 are defined (Publish 0-2 and 5, CreateStream 3, Subscribe and SubscribeOk
        // 4).
        (6u8..16).prop_map(Spoil::UnknownFlag),
        Just(Spoil::TooLarge),
        Just(Spoil::TrailingByte),
        (1usize..64).prop_map(Spoil::CutByFin),
        Just(Spoil::NotAdvertised),
    ]
}

/// How the bytes are handed to the decoder.
#[derive(Clone, Debug)]
enum Feed {
    /// One chunk.
    Whole,
    /// Chunks of these sizes, repeated.
    Chunks(Vec<usize>),
    /// What `wanted_bytes()` asks for, each time.
    AsWanted,
}

fn feed() -> impl Strategy<Value = Feed> {
    prop_oneof![
        Just(Feed::Whole),
        proptest::collection::vec(1usize..24, 1..5).prop_map(Feed::Chunks),
        Just(Feed::AsWanted),
    ]
}

/// The spoiled bytes, the decoder's limits and capabilities, and whether the stream ends
/// after them.
fn spoiled(frame: &Frame, spoil: Spoil) -> (Vec<u8>, Limits, Capabilities, bool) {
    let mut bytes = frame.to_bytes().to_vec();
    let mut limits = Limits::default();
    let mut caps = Capabilities::ALL;
    let mut fin = false;
    match spoil {
        Spoil::UnknownFlag(bit) => {
            let flags = u16::from_be_bytes([bytes[4], bytes[5]]) | (1 << bit);
            bytes[4..6].copy_from_slice(&flags.to_be_bytes());
        }
        Spoil::TooLarge => limits.max_frame_bytes = bytes.len() as u32 - 1,
        Spoil::TrailingByte => {
            let body = bytes.len() - HEADER_LEN + 1;
            bytes[6..10].copy_from_slice(&(body as u32).to_be_bytes());
            bytes.push(0xee);
        }
        Spoil::CutByFin(n) => {
            bytes.truncate(bytes.len() - n.min(bytes.len() - HEADER_LEN));
            fin = true;
        }
        Spoil::NotAdvertised => caps = Capabilities::NONE,
    }
    (bytes, limits, caps, fin)
}

/// Everything the decoder says about `bytes`, fed as `feed` says.
fn decode(
    bytes: &[u8],
    limits: Limits,
    caps: Capabilities,
    fin: bool,
    feed: &Feed,
) -> Vec<Result<Frame, FrameError>> {
    let mut d = FrameDecoder::new(limits, caps);
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = match feed {
            Feed::Whole => bytes.len(),
            Feed::Chunks(sizes) => sizes[i % sizes.len()],
            Feed::AsWanted => d.wanted_bytes(),
        }
        .clamp(1, bytes.len() - at);
        d.handle_chunk(Bytes::copy_from_slice(&bytes[at..at + n]));
        at += n;
        i += 1;
        while let Some(r) = d.poll_frame() {
            out.push(r);
        }
    }
    if fin {
        out.extend(d.handle_end().map(Err));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn a_rejected_frame_carries_its_request_id(
        frame in strategies::frame(),
        spoil in spoil(),
        feed in feed(),
    ) {
        let (bytes, limits, caps, fin) = spoiled(&frame, spoil);
        let out = decode(&bytes, limits, caps, fin, &feed);
        let errors: Vec<&FrameError> = out.iter().filter_map(|r| r.as_ref().err()).collect();
        if errors.is_empty() {
            // Only a spoil that does not apply leaves the frame whole: no flags to refuse.
            prop_assert!(matches!(spoil, Spoil::NotAdvertised), "{:?}: {:?}", spoil, out);
            prop_assert_eq!(out, vec![Ok(frame)]);
            return Ok(());
        }
        prop_assert_eq!(errors.len(), 1, "one frame, one error: {:?}", out);
        let e = errors[0];
        // Every body with a request id is at least 8 bytes long; only a cut can take the id
        // away, and then the error has none.
        let readable = bytes.len() >= HEADER_LEN + 8;
        let expected = frame.request_id().filter(|_| readable);
        prop_assert_eq!(e.request_id, expected, "{:?} {:?} {:?}", spoil, feed, e);
        prop_assert_eq!(e.frame_type, Some(frame.frame_type()));
        let code = match spoil {
            Spoil::UnknownFlag(_) => ErrorCode::UnknownFlags,
            Spoil::TooLarge => ErrorCode::FrameTooLarge,
            Spoil::TrailingByte | Spoil::CutByFin(_) => ErrorCode::Malformed,
            Spoil::NotAdvertised => ErrorCode::FlagNotAdvertised,
        };
        prop_assert_eq!(e.code(), code);
        prop_assert_eq!(e.fatal, matches!(spoil, Spoil::TooLarge | Spoil::CutByFin(_)));
    }

    #[test]
    fn chunking_never_changes_what_a_rejection_says(
        frame in strategies::frame(),
        spoil in spoil(),
        feed in feed(),
    ) {
        let (bytes, limits, caps, fin) = spoiled(&frame, spoil);
        prop_assert_eq!(
            decode(&bytes, limits, caps, fin, &feed),
            decode(&bytes, limits, caps, fin, &Feed::Whole)
        );
    }
}

#[test]
fn the_reported_cases_carry_their_ids() {
    // From the hardening issue: CreateStream with req 77 and Publish with ACKED|0x0100, req
    // 4242, each fed as the broker reads (the header alone first).
    let create = Frame::CreateStream(CreateStream {
        request_id: RequestId(77),
        stream: "a/b/c".into(),
        shards: 1,
        retention: Retention::default(),
        replicas: None,
    });
    let publish = Frame::Publish(Publish {
        oldest_pending: false,
        ack: Some(AckRequest { request_id: RequestId(4242), mode: AckMode::Written }),
        key: None,
        producer: None,
        stream: "a/b/c".into(),
        records: vec![Bytes::from_static(b"x").into()],
    });
    for (frame, id) in [(create, 77), (publish, 4242)] {
        let (bytes, limits, caps, fin) = spoiled(&frame, Spoil::UnknownFlag(8));
        let out = decode(&bytes, limits, caps, fin, &Feed::AsWanted);
        let e = out[0].as_ref().unwrap_err();
        assert_eq!((e.code(), e.request_id), (ErrorCode::UnknownFlags, Some(RequestId(id))));
    }
}
