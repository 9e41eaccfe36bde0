//! CRC32C computed in the same pass as the copy: [`copy_append`] copies a payload part into
//! the write buffer and extends the batch's CRC over it, so a received payload byte is read
//! once (from the buffer it was decrypted in) and written once, and the CRC never reads the
//! copy again.
//!
//! On x86-64 with SSE4.2 (`sys::copy_crc32c` checks the CPU once per call and dispatches), the
//! kernel runs three independent CRC chains over three lanes of each [`BLOCK`]-byte block,
//! copying the 8-byte words it feeds them, and joins the chains with two table-driven shifts
//! (the CRC instruction has a latency of three cycles and a throughput of one: one chain
//! would leave it two thirds idle). What is left after the blocks goes through one chain.
//! Elsewhere, it is `copy_from_slice` followed by the `crc32c` crate. Both give exactly
//! `crc32c::crc32c_append(crc, src)` (property-tested below against that crate).
//!
//! The arithmetic: write `raw(s, d)` for the CRC register after feeding `d` from register `s`
//! (what the instruction computes; a finished CRC32C is `!raw(!crc, d)`). `raw` is linear over
//! GF(2), so for lanes `a`, `b`, `c` of `n` bytes each,
//! `raw(s, a b c) = zeros(zeros(raw(s, a)) ^ raw(0, b)) ^ raw(0, c)`, where `zeros(x)` is
//! `raw(x, n zero bytes)`, itself linear: four 256-entry tables (one per byte of `x`) give it
//! in four lookups. [`Shifts`] holds the tables for `n` and `2n` bytes.

use std::sync::OnceLock;

/// Bytes per lane: a block of three lanes is one kernel step. 128 keeps a QUIC-sized part
/// (about 1.2 KB) mostly in blocks (three of them, then under 384 bytes in one chain) while the
/// join (eight table lookups) stays a small share of a block's 48 CRC instructions.
pub const LANE_BYTES: usize = 128;
/// Bytes per kernel block: three lanes.
pub const BLOCK: usize = 3 * LANE_BYTES;

/// Copies `src` into `dst` (the same length) and returns `crc` (a finished CRC32C, as
/// `crc32c::crc32c_append` takes it: 0 for nothing so far) extended over `src`.
///
/// # Panics
/// When `dst` and `src` differ in length (a caller's bug, never data).
pub fn copy_append(dst: &mut [u8], src: &[u8], crc: u32) -> u32 {
    assert_eq!(dst.len(), src.len(), "copy_append needs equal lengths");
    if let Some(raw) = crate::sys::copy_crc32c(dst, src, !crc) {
        return !raw;
    }
    dst.copy_from_slice(src);
    crc32c::crc32c_append(crc, src)
}

/// The CRC register after `n` zero bytes, as a linear map of the register before: one table
/// per byte of the register.
pub(crate) struct Shift([[u32; 256]; 4]);

impl Shift {
    fn new(n: usize) -> Self {
        let zeros = vec![0u8; n];
        let mut t = [[0u32; 256]; 4];
        for (k, table) in t.iter_mut().enumerate() {
            for (b, slot) in table.iter_mut().enumerate() {
                let register = (b as u32) << (8 * k);
                // raw(s, d) = !crc32c_append(!s, d)
                *slot = !crc32c::crc32c_append(!register, &zeros);
            }
        }
        Self(t)
    }

    /// `raw(x, n zero bytes)`.
    #[inline(always)]
    pub(crate) fn apply(&self, x: u32) -> u32 {
        let [b0, b1, b2, b3] = x.to_le_bytes();
        self.0[0][usize::from(b0)]
            ^ self.0[1][usize::from(b1)]
            ^ self.0[2][usize::from(b2)]
            ^ self.0[3][usize::from(b3)]
    }
}

/// The shifts the kernel joins its three chains with: over one lane and over two.
pub(crate) struct Shifts {
    pub(crate) one_lane: Shift,
    pub(crate) two_lanes: Shift,
}

/// The tables, built on first use (16 KiB, about 2,000 short CRC runs) and read-only after.
pub(crate) fn shifts() -> &'static Shifts {
    static SHIFTS: OnceLock<Shifts> = OnceLock::new();
    SHIFTS.get_or_init(|| Shifts {
        one_lane: Shift::new(LANE_BYTES),
        two_lanes: Shift::new(2 * LANE_BYTES),
    })
}

/// The x86-64 kernel: `raw(s, src)` while copying `src` to `dst` (equal lengths). Safe to
/// call only where the CPU has SSE4.2: `sys::copy_crc32c` checks before it calls.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
pub(crate) fn copy_raw_sse42(dst: &mut [u8], src: &[u8], mut s: u32, t: &Shifts) -> u32 {
    use std::arch::x86_64::_mm_crc32_u64;
    const WORDS: usize = LANE_BYTES / 8;
    let (src_blocks, src_rest) = src.as_chunks::<BLOCK>();
    let (dst_blocks, dst_rest) = dst.as_chunks_mut::<BLOCK>();
    for (sb, db) in src_blocks.iter().zip(dst_blocks.iter_mut()) {
        let (sw, _) = sb.as_chunks::<8>();
        let (dw, _) = db.as_chunks_mut::<8>();
        let (mut x, mut y, mut z) = (u64::from(s), 0u64, 0u64);
        for i in 0..WORDS {
            let a = u64::from_le_bytes(sw[i]);
            let b = u64::from_le_bytes(sw[i + WORDS]);
            let c = u64::from_le_bytes(sw[i + 2 * WORDS]);
            x = _mm_crc32_u64(x, a);
            y = _mm_crc32_u64(y, b);
            z = _mm_crc32_u64(z, c);
            dw[i] = a.to_le_bytes();
            dw[i + WORDS] = b.to_le_bytes();
            dw[i + 2 * WORDS] = c.to_le_bytes();
        }
        // The chains hold 32-bit registers: the instruction zero-extends its result.
        s = t.two_lanes.apply(x as u32) ^ t.one_lane.apply(y as u32) ^ z as u32;
    }
    tail_sse42(dst_rest, src_rest, s)
}

/// `raw(s, src)` while copying `src` to `dst` for what is left after the blocks (under
/// [`BLOCK`] bytes), on one chain. Written without a loop whose body is only the copy: the
/// compiler turns such a loop into a call of `memcpy` (the profile then counts that part of
/// the one copy as memmove, and a short call costs more than the stores). The 64-byte steps
/// each copy eight words with their CRC instructions; what is left after them goes in halving
/// steps (32, 16, 8, 4, 2, 1 bytes), each taken at most once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn tail_sse42(dst: &mut [u8], src: &[u8], s: u32) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};
    let (src_steps, mut src) = src.as_chunks::<64>();
    let (dst_steps, mut dst) = dst.as_chunks_mut::<64>();
    let mut r = u64::from(s);
    for (ss, ds) in src_steps.iter().zip(dst_steps.iter_mut()) {
        let (sw, _) = ss.as_chunks::<8>();
        let (dw, _) = ds.as_chunks_mut::<8>();
        for i in 0..8 {
            let w = u64::from_le_bytes(sw[i]);
            r = _mm_crc32_u64(r, w);
            dw[i] = w.to_le_bytes();
        }
    }
    for width in [32, 16, 8] {
        if src.len() >= width && dst.len() >= width {
            let (sh, st) = src.split_at(width);
            let (dh, dt) = std::mem::take(&mut dst).split_at_mut(width);
            let (sw, _) = sh.as_chunks::<8>();
            let (dw, _) = dh.as_chunks_mut::<8>();
            for (s8, d8) in sw.iter().zip(dw.iter_mut()) {
                let w = u64::from_le_bytes(*s8);
                r = _mm_crc32_u64(r, w);
                *d8 = w.to_le_bytes();
            }
            (src, dst) = (st, dt);
        }
    }
    let mut s = r as u32;
    if src.len() >= 4 && dst.len() >= 4 {
        let (sh, st) = src.split_at(4);
        let (dh, dt) = std::mem::take(&mut dst).split_at_mut(4);
        let w = [sh[0], sh[1], sh[2], sh[3]];
        s = _mm_crc32_u32(s, u32::from_le_bytes(w));
        dh.copy_from_slice(&w);
        (src, dst) = (st, dt);
    }
    if src.len() >= 2 && dst.len() >= 2 {
        let (sh, st) = src.split_at(2);
        let (dh, dt) = std::mem::take(&mut dst).split_at_mut(2);
        let w = [sh[0], sh[1]];
        s = _mm_crc32_u16(s, u16::from_le_bytes(w));
        dh.copy_from_slice(&w);
        (src, dst) = (st, dt);
    }
    if let (Some(b), Some(d)) = (src.first(), dst.first_mut()) {
        s = _mm_crc32_u8(s, *b);
        *d = *b;
    }
    s
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn check(src: &[u8], crc: u32) {
        let mut dst = vec![0xA5u8; src.len()];
        let got = copy_append(&mut dst, src, crc);
        assert_eq!(got, crc32c::crc32c_append(crc, src), "len {}", src.len());
        assert_eq!(dst, src, "copied, len {}", src.len());
    }

    #[test]
    fn every_length_around_the_block_sizes_matches_the_crate() {
        let data: Vec<u8> = (0..4 * BLOCK + 64).map(|i| (i * 131 + 7) as u8).collect();
        for len in 0..=data.len() {
            check(&data[..len], 0);
            check(&data[..len], 0xDEAD_BEEF);
        }
        // Unaligned sources and destinations, every tail length after a block.
        for start in 1..9 {
            for len in BLOCK..2 * BLOCK {
                check(&data[start..start + len], 0x1234_5678);
            }
        }
    }

    #[test]
    fn the_check_value_and_a_split_copy_agree() {
        // The CRC32C check value of "123456789".
        let mut dst = [0u8; 9];
        assert_eq!(copy_append(&mut dst, b"123456789", 0), 0xE306_9283);
        // Extending over two parts gives the CRC of the whole.
        let data = vec![0x5Au8; 3 * BLOCK + 17];
        let mut out = vec![0u8; data.len()];
        let (a, b) = out.split_at_mut(BLOCK + 3);
        let crc = copy_append(a, &data[..BLOCK + 3], 0);
        let crc = copy_append(b, &data[BLOCK + 3..], crc);
        assert_eq!(crc, crc32c::crc32c(&data));
        assert_eq!(out, data);
    }

    #[test]
    #[should_panic(expected = "equal lengths")]
    fn unequal_lengths_are_refused() {
        copy_append(&mut [0u8; 3], &[1u8; 4], 0);
    }

    proptest! {
        #[test]
        fn any_part_copies_and_extends_like_the_crate(
            src in proptest::collection::vec(any::<u8>(), 0..3000),
            crc in any::<u32>(),
        ) {
            let mut dst = vec![0u8; src.len()];
            prop_assert_eq!(copy_append(&mut dst, &src, crc), crc32c::crc32c_append(crc, &src));
            prop_assert_eq!(dst, src);
        }
    }
}
