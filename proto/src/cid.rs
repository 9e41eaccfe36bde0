//! The connection-ID layout every Felix CID follows: the broker issues CIDs that name the core
//! owning the connection, and a client (or another broker) may open a connection with an
//! Initial whose destination CID names the core it wants. Byte-exact description with
//! examples: `docs/connection-ids.md`.
//!
//! ```text
//! byte 0      bits 7..5  config rotation id (Felix: CONFIG_ID = 0b000; 0b111 = unroutable)
//!             bits 4..0  random
//! byte 1      core index (0..=254; 0xFF is reserved and never issued)
//! bytes 2..7  random
//! byte 7      check value: CRC-8/I-432-1 of bytes 0..7 (`check_value`)
//! ```
//!
//! The check value is what tells a CID in this layout from the random Initial DCID of a client
//! that knows nothing of it (aioquic and Chromium pick 8 random bytes): without it one such
//! DCID in 8 has the config bits, and its core byte would be taken for a core. With it a random
//! 8-byte DCID decodes to a core once in about 2,000; a client that names a core on purpose
//! computes the check value with [`cid_for_core`].
//!
//! Pure: the caller brings the random bytes.

use crate::CoreId;

/// Length in bytes of every Felix connection ID.
pub const CID_LEN: usize = 8;

/// The config rotation id Felix writes into bits 7..5 of the first CID octet.
pub const CONFIG_ID: u8 = 0b000;

/// The config rotation id that QUIC-LB reserves for "unroutable" CIDs; Felix never issues it.
pub const CONFIG_ID_UNROUTABLE: u8 = 0b111;

/// Shift of the config rotation id within the first CID octet.
pub const CONFIG_ID_SHIFT: u32 = 5;

/// Mask of the random bits within the first CID octet (bits 4..0).
pub const FIRST_OCTET_RANDOM_MASK: u8 = 0b0001_1111;

/// Index of the CID byte that names the core.
pub const CORE_BYTE_INDEX: usize = 1;

/// Core byte value that is reserved (never issued, decodes to `None`).
pub const CORE_BYTE_RESERVED: u8 = 0xFF;

/// Index of the CID byte that holds the check value of the bytes before it.
pub const CHECK_BYTE_INDEX: usize = CID_LEN - 1;

/// The most cores a CID can name: the core byte is one octet and 0xFF is reserved, so cores
/// `0..=254`.
pub const MAX_STEERABLE_CORES: usize = 255;

/// Generator polynomial of the check value's CRC-8 (x^8 + x^2 + x + 1).
const CHECK_POLY: u8 = 0x07;
/// Final XOR of the check value's CRC-8: the check value of all-zero bytes is not zero, so a
/// DCID of zeros names no core.
const CHECK_XOR_OUT: u8 = 0x55;

const _: () = assert!(CID_LEN <= 20, "QUIC limits connection IDs to 20 bytes");
const _: () = assert!(CID_LEN >= 8, "a client's Initial DCID has at least 8 bytes (RFC 9000)");
const _: () = assert!(CORE_BYTE_INDEX < CID_LEN);
const _: () = assert!(CHECK_BYTE_INDEX > CORE_BYTE_INDEX, "the check value covers the core byte");
const _: () = assert!(CHECK_BYTE_INDEX == CID_LEN - 1, "the check value is the last byte");
const _: () = assert!(CONFIG_ID != CONFIG_ID_UNROUTABLE);
const _: () = assert!(CONFIG_ID >> 3 == 0, "the config id has three bits");
const _: () = assert!(MAX_STEERABLE_CORES == CORE_BYTE_RESERVED as usize);

/// CRC-8/I-432-1 (polynomial 0x07, initial value 0, not reflected, final XOR 0x55) by byte.
const CHECK_TABLE: [u8; 256] = check_table();

const fn check_table() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x80 != 0 { (crc << 1) ^ CHECK_POLY } else { crc << 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// The check value a CID in this layout carries in its byte [`CHECK_BYTE_INDEX`]:
/// CRC-8/I-432-1 of the bytes before it (the ATM header check: polynomial 0x07, initial value
/// 0, not reflected, final XOR 0x55; its catalogue check value is `0xA1`, for the ASCII bytes
/// `123456789`). The byte at [`CHECK_BYTE_INDEX`] itself is not read.
pub fn check_value(cid: &[u8; CID_LEN]) -> u8 {
    crc8(&cid[..CHECK_BYTE_INDEX]) ^ CHECK_XOR_OUT
}

fn crc8(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |crc, &b| CHECK_TABLE[usize::from(crc ^ b)])
}

/// A CID naming `core`, its random bits from `random` (bytes 1 and 7 of `random` are not
/// used: they become the core byte and the check value); `None` when `core` cannot be named
/// (`>= MAX_STEERABLE_CORES`).
pub fn cid_for_core(core: CoreId, random: [u8; CID_LEN]) -> Option<[u8; CID_LEN]> {
    let core_byte = u8::try_from(core.0).ok().filter(|&b| b != CORE_BYTE_RESERVED)?;
    let mut cid = random;
    cid[0] = (CONFIG_ID << CONFIG_ID_SHIFT) | (random[0] & FIRST_OCTET_RANDOM_MASK);
    cid[CORE_BYTE_INDEX] = core_byte;
    cid[CHECK_BYTE_INDEX] = check_value(&cid);
    Some(cid)
}

/// The core named by a destination CID, or `None` when the CID is shorter than [`CID_LEN`],
/// carries other config bits than [`CONFIG_ID`], has the reserved core byte, or a wrong check
/// value (the random DCID of a client that does not use this layout, almost always). Only the
/// first [`CID_LEN`] bytes are read.
pub fn core_of(dcid: &[u8]) -> Option<CoreId> {
    let core = core_byte_of(dcid)?;
    let cid = dcid.first_chunk::<CID_LEN>()?;
    if cid[CHECK_BYTE_INDEX] != check_value(cid) {
        return None;
    }
    Some(core)
}

/// The core a CID names by its config bits and core byte alone, without the check value (what
/// the broker's SO_REUSEPORT programs read from a short header); `None` when `dcid` is shorter
/// than [`CID_LEN`], has other config bits or the reserved core byte.
fn core_byte_of(dcid: &[u8]) -> Option<CoreId> {
    let cid = dcid.get(..CID_LEN)?;
    if cid[0] >> CONFIG_ID_SHIFT != CONFIG_ID {
        return None;
    }
    let core_byte = cid[CORE_BYTE_INDEX];
    if core_byte == CORE_BYTE_RESERVED {
        return None;
    }
    Some(CoreId(u16::from(core_byte)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// splitmix64: a seeded source of random DCIDs, the same on every run.
    fn random_dcids(seed: u64) -> impl Iterator<Item = [u8; CID_LEN]> {
        let mut state = seed;
        std::iter::repeat_with(move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)).to_le_bytes()
        })
    }

    #[test]
    fn a_cid_for_a_core_names_that_core_and_keeps_the_random_bits() {
        let random = [0xFF, 0xAA, 1, 2, 3, 4, 5, 6];
        let cid = cid_for_core(CoreId(2), random).unwrap();
        assert_eq!(cid[..CHECK_BYTE_INDEX], [0x1F, 0x02, 1, 2, 3, 4, 5]);
        assert_eq!(cid[CHECK_BYTE_INDEX], check_value(&cid));
        assert_eq!(core_of(&cid), Some(CoreId(2)));
        assert_eq!(
            cid_for_core(CoreId(254), [0; CID_LEN]).map(|c| core_of(&c)),
            Some(Some(CoreId(254)))
        );
        assert_eq!(cid_for_core(CoreId(255), random), None);
        assert_eq!(cid_for_core(CoreId(1000), random), None);
    }

    #[test]
    fn check_value_is_crc8_i432_1() {
        // The CRC catalogue's check value of CRC-8/I-432-1 (ITU-T I.432.1).
        assert_eq!(crc8(b"123456789") ^ CHECK_XOR_OUT, 0xA1);
        // The table agrees with the bit-by-bit definition.
        for i in 0..=255u8 {
            let mut crc = i;
            for _ in 0..8 {
                crc = if crc & 0x80 != 0 { (crc << 1) ^ CHECK_POLY } else { crc << 1 };
            }
            assert_eq!(CHECK_TABLE[usize::from(i)], crc, "table entry {i:#04x}");
        }
    }

    /// Asserts that docs/connection-ids.md shows `bytes` as space-separated hex.
    fn assert_in_doc(bytes: &[u8]) {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/connection-ids.md");
        let doc = std::fs::read_to_string(path).expect("docs/connection-ids.md");
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let hex = hex.join(" ");
        assert!(doc.contains(&hex), "docs/connection-ids.md does not show {hex}");
    }

    #[test]
    fn hex_example_from_docs() {
        // docs/connection-ids.md, "Example".
        let cid = [0x1b, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x7f];
        for shown in [&cid[..], &[0x1b, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x33]] {
            assert_in_doc(shown);
        }
        assert_in_doc(&[0xfb, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x11]);
        assert_eq!(check_value(&cid), 0x7f);
        assert_eq!(core_of(&cid), Some(CoreId(2)));
        assert_eq!(cid_for_core(CoreId(2), cid), Some(cid));
        // The same first seven bytes with another last byte: a random DCID, no core.
        let random = [0x1b, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x33];
        assert_eq!((core_of(&random), core_byte_of(&random)), (None, Some(CoreId(2))));
        // QUIC-LB's "unroutable" config bits.
        let unroutable = [0xfb, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x11];
        assert_eq!(check_value(&unroutable), 0x11);
        assert_eq!((core_of(&unroutable), core_byte_of(&unroutable)), (None, None));
        // Zeros: the check value of seven zero bytes is 0x55.
        assert_eq!(core_of(&[0; CID_LEN]), None);
        assert_eq!(core_of(&[0, 0, 0, 0, 0, 0, 0, 0x55]), Some(CoreId(0)));
        assert_eq!(core_of(&[0x00, 0x01, 0, 0, 0, 0, 0]), None, "7 bytes");
        let reserved = [0x00, 0xFF, 0, 0, 0, 0, 0, 0];
        assert_eq!(core_of(&cid_with_check(reserved)), None, "reserved core");
    }

    fn cid_with_check(mut cid: [u8; CID_LEN]) -> [u8; CID_LEN] {
        cid[CHECK_BYTE_INDEX] = check_value(&cid);
        cid
    }

    #[test]
    fn random_dcids_seldom_name_a_core() {
        // A client that does not know the layout (aioquic, Chromium: 8 random bytes) names a
        // core by accident when the config bits (1 in 8) and the check value (1 in 256) match:
        // 1 in 2,048. Without the check value it was 1 in 8.
        const N: u32 = 1 << 20;
        let mut named = 0u32;
        let mut config_bits = 0u32;
        for dcid in random_dcids(0x0f31_1c1d).take(N as usize) {
            named += u32::from(core_of(&dcid).is_some());
            config_bits += u32::from(core_byte_of(&dcid).is_some());
        }
        // Expected 510 and 130,560 (binomial, standard deviations 23 and 338); this seed
        // gives 507 and 129,510.
        assert!((400..=624).contains(&named), "{named} of {N} random DCIDs name a core");
        assert!(
            (129_000..=132_000).contains(&config_bits),
            "{config_bits} of {N} have our config bits"
        );
    }

    #[test]
    fn a_random_tail_with_our_config_bits_names_a_core_once_in_256() {
        // For every core byte, exactly one of the 256 last bytes is the check value.
        let mut dcid = [0x05, 0, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0];
        for core in 0..=254u8 {
            dcid[CORE_BYTE_INDEX] = core;
            let named: Vec<u8> = (0..=255u8)
                .filter(|&last| {
                    dcid[CHECK_BYTE_INDEX] = last;
                    core_of(&dcid).is_some()
                })
                .collect();
            assert_eq!(named, [check_value(&dcid)], "core byte {core}");
        }
    }

    proptest! {
        #[test]
        fn check_value_round_trip(core in 0u16..255, random: [u8; CID_LEN]) {
            let cid = cid_for_core(CoreId(core), random).unwrap();
            prop_assert_eq!(core_of(&cid), Some(CoreId(core)));
            prop_assert_eq!(core_byte_of(&cid), Some(CoreId(core)));
            prop_assert_eq!(cid[CHECK_BYTE_INDEX], check_value(&cid));
            prop_assert_eq!(cid[0] & FIRST_OCTET_RANDOM_MASK, random[0] & FIRST_OCTET_RANDOM_MASK);
            prop_assert_eq!(&cid[2..CHECK_BYTE_INDEX], &random[2..CHECK_BYTE_INDEX]);
            // A longer DCID that starts with the CID names the same core (the first 8 bytes).
            let mut twenty = [0u8; 20];
            twenty[..CID_LEN].copy_from_slice(&cid);
            prop_assert_eq!(core_of(&twenty), Some(CoreId(core)));
        }

        #[test]
        fn one_flipped_bit_names_no_core(core in 0u16..255, random: [u8; CID_LEN], bit in 0usize..64) {
            // A CRC detects every single-bit error: a CID damaged in one bit (a core byte read
            // as another core's included) is not taken for a CID in the layout.
            let mut cid = cid_for_core(CoreId(core), random).unwrap();
            cid[bit / 8] ^= 1 << (bit % 8);
            prop_assert_eq!(core_of(&cid), None);
        }
    }
}
