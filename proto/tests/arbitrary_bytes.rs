//! Arbitrary bytes never panic the decoder and never make it allocate past the limits.
//!
//! A counting global allocator measures the bytes allocated while decoding. The bound: what a
//! decoded frame may need is proportional to its input (a `Bytes` handle per record of at
//! least 4 input bytes), so allocation stays under `ALLOC_FACTOR` x input + a constant, and the
//! input itself never exceeds `max_frame_bytes`.

mod strategies;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use felix_proto::*;
use proptest::prelude::*;

struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: delegates to the system allocator unchanged; only counts sizes in a thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + new_size));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ALLOC_FACTOR: usize = 12;
const ALLOC_CONSTANT: usize = 4096;

fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(|a| a.get());
    let out = f();
    let after = ALLOCATED.with(|a| a.get());
    (out, after - before)
}

fn limits() -> Limits {
    Limits { max_frame_bytes: 64 * 1024, max_batch_records: 4096, max_key_bytes: 256 }
}

/// Decodes `input` split at `cut`, returning every result and the bytes allocated.
fn decode_all(input: &[u8], cut: usize) -> (Vec<Result<Frame, FrameError>>, usize) {
    let owned = Bytes::copy_from_slice(input);
    let (out, allocated) = allocated_by(|| {
        let mut d = FrameDecoder::new(limits(), Capabilities::ALL);
        let mut out = Vec::new();
        let cut = cut.min(owned.len());
        d.handle_chunk(owned.slice(..cut));
        while let Some(f) = d.poll_frame() {
            out.push(f);
        }
        d.handle_chunk(owned.slice(cut..));
        while let Some(f) = d.poll_frame() {
            out.push(f);
        }
        assert!(d.buffered_bytes() <= limits().max_frame_bytes as usize + input.len());
        out
    });
    (out, allocated)
}

/// Mutations of valid frames reach far deeper into the decoder than random bytes do.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (strategies::frame(), proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6)).prop_map(
        |(f, edits)| {
            let mut b = f.to_bytes().to_vec();
            for (pos, byte) in edits {
                if !b.is_empty() {
                    let i = pos % b.len();
                    b[i] = byte;
                }
            }
            b
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn random_bytes_never_panic_or_overallocate(
        input in proptest::collection::vec(any::<u8>(), 0..2048),
        cut in 0usize..2048,
    ) {
        let (_, allocated) = decode_all(&input, cut);
        prop_assert!(allocated <= ALLOC_FACTOR * input.len() + ALLOC_CONSTANT,
            "allocated {} bytes for {} input bytes", allocated, input.len());
    }

    #[test]
    fn mutated_frames_never_panic_or_overallocate(input in mutated_frame(), cut in 0usize..512) {
        let (results, allocated) = decode_all(&input, cut);
        prop_assert!(allocated <= ALLOC_FACTOR * input.len() + ALLOC_CONSTANT,
            "allocated {} bytes for {} input bytes", allocated, input.len());
        // A fatal error is always the last thing the decoder says.
        if let Some(pos) = results.iter().position(|r| matches!(r, Err(e) if e.fatal)) {
            prop_assert_eq!(pos, results.len() - 1);
        }
    }
}

#[test]
fn a_huge_claimed_record_count_allocates_nothing_for_it() {
    // Publish, stream "a/b/c", record count 4096 and no records: rejected before Vec::with_capacity.
    let mut body = vec![0, 5, b'a', b'/', b'b', b'/', b'c'];
    body.extend_from_slice(&4096u32.to_be_bytes());
    let mut frame = vec![0x46, 0x58, 1, 0x10, 0, 0];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    let (results, allocated) = decode_all(&frame, frame.len());
    assert_eq!(results.len(), 1);
    let err = results[0].as_ref().unwrap_err();
    assert_eq!(err.error, DecodeError::Truncated { what: "records" });
    assert!(allocated < 1024, "allocated {allocated}");
}

#[test]
fn a_header_claiming_a_huge_body_is_refused_without_buffering() {
    let mut frame = vec![0x46, 0x58, 1, 0x10, 0, 0];
    frame.extend_from_slice(&u32::MAX.to_be_bytes());
    let (results, allocated) = decode_all(&frame, frame.len());
    assert!(matches!(&results[0], Err(e) if e.fatal && e.code() == ErrorCode::FrameTooLarge));
    assert!(allocated < 1024, "allocated {allocated}");
}
