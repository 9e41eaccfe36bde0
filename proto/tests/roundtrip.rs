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
