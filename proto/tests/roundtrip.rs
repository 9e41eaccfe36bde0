//! Every frame survives encode → decode, whole and split into arbitrary chunks.

mod strategies;

use bytes::Bytes;
use felix_proto::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_frame_round_trips(frame in strategies::frame()) {
        let bytes = frame.to_bytes();
        let decoded = decode_frame(bytes, &Limits::default(), Capabilities::ALL);
        prop_assert_eq!(decoded, Ok(frame));
    }

    #[test]
    fn frame_sequences_round_trip_through_any_chunking(
        frames in proptest::collection::vec(strategies::frame(), 1..6),
        cut in 1usize..64,
    ) {
        let wire: Vec<u8> = frames.iter().flat_map(|f| f.to_bytes().to_vec()).collect();
        let mut decoder = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        let mut out = Vec::new();
        for (i, chunk) in wire.chunks(cut).enumerate() {
            // Alternate the copying and the zero-copy entry points.
            if i % 2 == 0 {
                decoder.handle_bytes(chunk);
            } else {
                decoder.handle_chunk(Bytes::copy_from_slice(chunk));
            }
            while let Some(f) = decoder.poll_frame() {
                out.push(f.unwrap());
            }
        }
        prop_assert_eq!(out, frames);
        prop_assert_eq!(decoder.buffered_bytes(), 0);
    }
}

/// A publish with records long enough to span several QUIC-sized chunks.
fn large_publish() -> impl Strategy<Value = Frame> {
    (
        proptest::option::of(any::<u64>()),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        proptest::collection::vec((0usize..6000, any::<u8>()), 1..8),
    )
        .prop_map(|(ack, key, records)| {
            Frame::Publish(Publish {
                oldest_pending: false,
                ack: ack.map(|id| AckRequest { request_id: RequestId(id), mode: AckMode::Durable }),
                key: key.map(Bytes::from),
                producer: None,
                stream: "a/b/c".into(),
                records: records.into_iter().map(|(len, b)| vec![b; len].into()).collect(),
            })
        })
}

/// Splits `wire` into chunks whose lengths cycle through `sizes`.
fn chunked(wire: &Bytes, sizes: &[usize]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at == wire.len() {
            break;
        }
        let end = (at + size).min(wire.len());
        out.push(wire.slice(at..end));
        at = end;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Frames decoded from chunks as QUIC hands them out (any split, records spanning many
    /// chunks) equal the frames decoded from the contiguous bytes; with every chunk long enough
    /// to be kept, every record payload is slices of the input (no byte copied).
    #[test]
    fn chunked_decoding_equals_contiguous_decoding(
        frames in proptest::collection::vec(
            prop_oneof![large_publish(), strategies::frame()], 1..5),
        sizes in proptest::collection::vec(1usize..3000, 1..8),
    ) {
        let contiguous: Vec<Frame> = frames
            .iter()
            .map(|f| decode_frame(f.to_bytes(), &Limits::default(), Capabilities::ALL).unwrap())
            .collect();
        let wire = Bytes::from(frames.iter().flat_map(|f| f.to_bytes().to_vec()).collect::<Vec<u8>>());
        let mut decoder = FrameDecoder::new(Limits::default(), Capabilities::ALL);
        let mut out = Vec::new();
        let chunks = chunked(&wire, &sizes);
        let all_kept =
            chunks.iter().all(|c| c.len() >= felix_proto::decoder::MIN_ZERO_COPY_CHUNK_BYTES);
        for chunk in chunks {
            decoder.handle_chunk(chunk);
            while let Some(f) = decoder.poll_frame() {
                out.push(f.unwrap());
            }
            prop_assert!(decoder.buffered_bytes() <= Limits::default().max_frame_bytes as usize + 3000);
        }
        prop_assert_eq!(&out, &contiguous);
        prop_assert_eq!(decoder.buffered_bytes(), 0);
        prop_assert!(decoder.handle_end().is_none());
        if all_kept {
            let range = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
            for frame in &out {
                if let Frame::Publish(p) = frame {
                    for part in p.records.iter().flat_map(|r| r.parts()) {
                        prop_assert!(part.is_empty() || range.contains(&(part.as_ptr() as usize)),
                            "a payload part was copied");
                    }
                }
            }
        }
    }
}
