//! Arbitrary bytes, split at an arbitrary point, into the streaming decoder: it must never
//! panic, never buffer past one frame plus the input, and every decoded frame must re-encode to
//! bytes that decode to the same frame.
#![no_main]

use bytes::Bytes;
use felix_proto::{decode_frame, Capabilities, FrameDecoder, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_frame_bytes: 1 << 20, max_batch_records: 4096, max_key_bytes: 512 };
    let (cut, input) = match data.split_first() {
        Some((c, rest)) => (usize::from(*c), rest),
        None => return,
    };
    let input = Bytes::copy_from_slice(input);
    let cut = cut.min(input.len());
    let mut decoder = FrameDecoder::new(limits, Capabilities::ALL);
    let mut frames = Vec::new();
    for part in [input.slice(..cut), input.slice(cut..)] {
        decoder.handle_chunk(part);
        while let Some(result) = decoder.poll_frame() {
            if let Ok(frame) = result {
                frames.push(frame);
            }
        }
        assert!(decoder.buffered_bytes() <= limits.max_frame_bytes as usize + input.len());
    }
    for frame in frames {
        let again = decode_frame(frame.to_bytes(), &limits, Capabilities::ALL);
        assert_eq!(again.as_ref(), Ok(&frame));
    }
});
