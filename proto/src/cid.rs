//! The connection-ID layout every Felix CID follows: the broker issues CIDs that name the core
//! owning the connection, and a client (or another broker) may open a connection with an
//! Initial whose destination CID names the core it wants. Byte-exact description with
//! examples: `docs/connection-ids.md`.
//!
//! ```text
//! byte 0      bits 7..5  config rotation id (Felix: CONFIG_ID = 0b000; 0b111 = unroutable)
//!             bits 4..0  random
//! byte 1      core index (0..=254; 0xFF is reserved and never issued)
//! bytes 2..8  random
//! ```
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

/// The most cores a CID can name: the core byte is one octet and 0xFF is reserved, so cores
/// `0..=254`.
pub const MAX_STEERABLE_CORES: usize = 255;

const _: () = assert!(CID_LEN <= 20, "QUIC limits connection IDs to 20 bytes");
const _: () = assert!(CID_LEN >= 8, "a client's Initial DCID has at least 8 bytes (RFC 9000)");
const _: () = assert!(CORE_BYTE_INDEX < CID_LEN);
const _: () = assert!(CONFIG_ID != CONFIG_ID_UNROUTABLE);
const _: () = assert!(CONFIG_ID >> 3 == 0, "the config id has three bits");
const _: () = assert!(MAX_STEERABLE_CORES == CORE_BYTE_RESERVED as usize);

/// A CID naming `core`, its other bits from `random`; `None` when `core` cannot be named
/// (`>= MAX_STEERABLE_CORES`).
pub fn cid_for_core(core: CoreId, random: [u8; CID_LEN]) -> Option<[u8; CID_LEN]> {
    let core_byte = u8::try_from(core.0).ok().filter(|&b| b != CORE_BYTE_RESERVED)?;
    let mut cid = random;
    cid[0] = (CONFIG_ID << CONFIG_ID_SHIFT) | (random[0] & FIRST_OCTET_RANDOM_MASK);
    cid[CORE_BYTE_INDEX] = core_byte;
    Some(cid)
}

/// The core named by a destination CID, or `None` when the CID is shorter than [`CID_LEN`],
/// carries other config bits than [`CONFIG_ID`], or has the reserved core byte.
pub fn core_of(dcid: &[u8]) -> Option<CoreId> {
    if dcid.len() < CID_LEN {
        return None;
    }
    if dcid[0] >> CONFIG_ID_SHIFT != CONFIG_ID {
        return None;
    }
    let core_byte = dcid[CORE_BYTE_INDEX];
    if core_byte == CORE_BYTE_RESERVED {
        return None;
    }
    Some(CoreId(u16::from(core_byte)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cid_for_a_core_names_that_core_and_keeps_the_random_bits() {
        let random = [0xFF, 0xAA, 1, 2, 3, 4, 5, 6];
        let cid = cid_for_core(CoreId(2), random).unwrap();
        assert_eq!(cid, [0x1F, 0x02, 1, 2, 3, 4, 5, 6]);
        assert_eq!(core_of(&cid), Some(CoreId(2)));
        assert_eq!(
            cid_for_core(CoreId(254), [0; CID_LEN]).map(|c| core_of(&c)),
            Some(Some(CoreId(254)))
        );
        assert_eq!(cid_for_core(CoreId(255), random), None);
        assert_eq!(cid_for_core(CoreId(1000), random), None);
    }

    #[test]
    fn hex_example_from_docs() {
        // docs/connection-ids.md, "Example".
        assert_eq!(core_of(&[0x1b, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x33]), Some(CoreId(2)));
        assert_eq!(core_of(&[0xfb, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x33]), None);
        assert_eq!(core_of(&[0x00, 0x01, 0, 0, 0, 0, 0]), None, "7 bytes");
        assert_eq!(core_of(&[0x00, 0xFF, 0, 0, 0, 0, 0, 0]), None, "reserved core");
    }
}
