//! Connection-ID layout: every CID the broker issues names the core that owns the connection.
//!
//! The layout (`felix_proto::cid`, shared with the client, which may name the core it wants
//! in its Initial) follows the QUIC-LB draft's idea of config-rotation bits in the first
//! octet (byte-exact description with examples in `docs/connection-ids.md`):
//!
//! ```text
//! byte 0      bits 7..5  config rotation id (Felix: CONFIG_ID = 0b000; 0b111 = unroutable)
//!             bits 4..0  random
//! byte 1      owning core index (0..=254; 0xFF is reserved and never issued)
//! bytes 2..7  random
//! byte 7      check value: CRC-8 of bytes 0..7 (`felix_proto::cid::check_value`)
//! ```
//!
//! The SO_REUSEPORT programs in [`crate::sys::bpf`] read bytes 0 and 1 from a short header
//! ([`steered_core_of_datagram`] is their decision in software); [`core_of_datagram`] also
//! verifies the check value and reads the destination CID of long headers, and is what the
//! driver's safety net acts on for datagrams that reached the wrong core.
//!
//! This module performs no I/O. Random bytes come from a per-generator CSPRNG
//! ([`rand::rngs::StdRng`], ChaCha12) seeded from the operating system.

use std::time::Duration;

use felix_proto::CoreId;
use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

pub use felix_proto::cid::{
    check_value, core_of, CHECK_BYTE_INDEX, CID_LEN, CONFIG_ID, CONFIG_ID_SHIFT,
    CONFIG_ID_UNROUTABLE, CORE_BYTE_INDEX, CORE_BYTE_RESERVED, FIRST_OCTET_RANDOM_MASK,
    MAX_STEERABLE_CORES,
};

/// First-byte bit that marks a QUIC long header (RFC 9000 §17.2).
pub const LONG_HEADER_BIT: u8 = 0x80;

const _: () = assert!(CID_LEN == 8, "generate_bytes takes its random bytes from one u64");

/// Errors of the CID layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CidError {
    /// The core index does not fit the one-octet core byte (`0..MAX_STEERABLE_CORES`).
    #[error("{core} cannot be encoded in a connection ID: at most {MAX_STEERABLE_CORES} cores are steerable")]
    CoreOutOfRange {
        /// The core that was asked for.
        core: CoreId,
    },
    /// The broker was configured with more cores than CIDs can name.
    #[error(
        "{cores} cores configured: connection-ID steering supports at most {MAX_STEERABLE_CORES}"
    )]
    TooManyCores {
        /// The configured number of cores.
        cores: usize,
    },
}

/// Checks at start-up that `cores` cores can all be named by the CID core byte.
pub fn check_core_count(cores: usize) -> Result<(), CidError> {
    if cores > MAX_STEERABLE_CORES {
        return Err(CidError::TooManyCores { cores });
    }
    Ok(())
}

/// A quinn-proto [`ConnectionIdGenerator`] that writes its core's index into every CID.
///
/// One per core (per quinn-proto `Endpoint`); never shared between cores.
#[derive(Debug)]
pub struct CoreCidGenerator {
    core_byte: u8,
    lifetime: Option<Duration>,
    rng: StdRng,
}

impl CoreCidGenerator {
    /// A generator for `core`, seeded from the operating system's entropy.
    pub fn new(core: CoreId) -> Result<Self, CidError> {
        Self::with_rng(core, StdRng::from_entropy())
    }

    /// A generator for `core` with a given RNG (deterministic tests and benchmarks; production
    /// code uses [`CoreCidGenerator::new`] so that CIDs are unpredictable).
    pub fn with_rng(core: CoreId, rng: StdRng) -> Result<Self, CidError> {
        let core_byte = u8::try_from(core.0)
            .ok()
            .filter(|b| usize::from(*b) < MAX_STEERABLE_CORES)
            .ok_or(CidError::CoreOutOfRange { core })?;
        Ok(Self { core_byte, lifetime: None, rng })
    }

    /// Sets the lifetime after which quinn-proto retires issued CIDs (default: none).
    pub fn with_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }

    /// The core this generator encodes.
    pub fn core(&self) -> CoreId {
        CoreId(u16::from(self.core_byte))
    }

    /// Produces the raw bytes of a new CID.
    pub fn generate_bytes(&mut self) -> [u8; CID_LEN] {
        let random = self.rng.next_u64().to_le_bytes();
        // `with_rng` admitted only cores a CID can name, so this is always `Some`.
        felix_proto::cid::cid_for_core(self.core(), random).unwrap_or(random)
    }
}

impl ConnectionIdGenerator for CoreCidGenerator {
    fn generate_cid(&mut self) -> ConnectionId {
        ConnectionId::new(&self.generate_bytes())
    }

    /// Rejects CIDs that cannot be ours (wrong length, config bits, reserved core byte or check
    /// value), so quinn-proto drops them without answering with a stateless reset.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        if cid.len() == CID_LEN && core_of(cid).is_some() {
            Ok(())
        } else {
            Err(InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        self.lifetime
    }
}

/// Byte of a long header that holds the destination CID's length (after the first byte and
/// the 4-byte version, RFC 9000 §17.2); the DCID follows it.
pub const LONG_HEADER_DCID_LEN_INDEX: usize = 5;

/// Whether a UDP payload starts with a QUIC long header (an Initial, 0-RTT, Handshake, Retry
/// or Version Negotiation packet); `false` for an empty one.
pub fn is_long_header(datagram: &[u8]) -> bool {
    datagram.first().is_some_and(|b| b & LONG_HEADER_BIT != 0)
}

/// The core named by a received UDP payload. A short-header packet (first byte & 0x80 == 0)
/// carries a DCID of `cid_len` bytes from byte 1. A long-header packet is read only when its
/// DCID is exactly `cid_len` bytes: that is a CID this broker issued, or the Initial of a Felix
/// client or another Felix broker, which names the core it wants (`CoreState::connect`).
/// Clients that do not know the layout pick random Initial DCIDs: 20 bytes (quinn) are never
/// read; 8 random bytes (aioquic, Chromium) fail the check value but once in about 2,000, and
/// then name a core by accident: one that exists takes the connection, one that does not is
/// never a reason to drop an Initial (`CoreState::handle_datagram`). `None` too for truncated
/// datagrams and foreign CIDs (the receiving core keeps or drops them).
pub fn core_of_datagram(datagram: &[u8], cid_len: usize) -> Option<CoreId> {
    let (&first, rest) = datagram.split_first()?;
    if first & LONG_HEADER_BIT != 0 {
        let len = *datagram.get(LONG_HEADER_DCID_LEN_INDEX)?;
        if usize::from(len) != cid_len {
            return None;
        }
        let start = LONG_HEADER_DCID_LEN_INDEX + 1;
        return core_of(datagram.get(start..start + cid_len)?);
    }
    core_of(rest.get(..cid_len)?)
}

/// The core the SO_REUSEPORT programs send a UDP payload to, before the group's size is
/// compared: a short header's config bits and core byte, no check value; `None` for long headers (the kernel's hash places them), datagrams
/// shorter than the two bytes, and CIDs with other config bits or the reserved core byte.
/// Every short header [`core_of_datagram`] decodes is steered to the same core; one the
/// programs steer but `core_of_datagram` does not decode (a wrong check value) reaches a core
/// that owns no connection for it, and its endpoint drops it.
pub fn steered_core_of_datagram(datagram: &[u8]) -> Option<CoreId> {
    if is_long_header(datagram) {
        return None;
    }
    let config = *datagram.get(1)?;
    let core_byte = *datagram.get(1 + CORE_BYTE_INDEX)?;
    if config >> CONFIG_ID_SHIFT != CONFIG_ID || core_byte == CORE_BYTE_RESERVED {
        return None;
    }
    Some(CoreId(u16::from(core_byte)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn short_header(cid: &[u8]) -> Vec<u8> {
        let mut d = vec![0x40];
        d.extend_from_slice(cid);
        d.extend_from_slice(&[0xAA; 20]);
        d
    }

    #[test]
    fn layout_bytes() {
        let mut g = CoreCidGenerator::with_rng(CoreId(3), StdRng::seed_from_u64(7)).unwrap();
        for _ in 0..1000 {
            let b = g.generate_bytes();
            assert_eq!(b[0] >> 5, CONFIG_ID);
            assert_eq!(b[1], 3);
            assert_eq!(b[CHECK_BYTE_INDEX], check_value(&b));
        }
        assert_eq!(g.cid_len(), CID_LEN);
        assert_eq!(g.cid_lifetime(), None);
        let g = g.with_lifetime(Duration::from_secs(60));
        assert_eq!(g.cid_lifetime(), Some(Duration::from_secs(60)));
    }

    #[test]
    fn cids_are_not_repeated() {
        let mut g = CoreCidGenerator::new(CoreId(0)).unwrap();
        let set: std::collections::HashSet<_> = (0..10_000).map(|_| g.generate_cid()).collect();
        assert_eq!(set.len(), 10_000);
    }

    #[test]
    fn random_bits_vary() {
        // Every random bit position takes both values over many CIDs: no counters, no zeros.
        let mut g = CoreCidGenerator::new(CoreId(9)).unwrap();
        let (mut ones, mut zeros) = ([0u8; CID_LEN], [0u8; CID_LEN]);
        for _ in 0..512 {
            let b = g.generate_bytes();
            for i in 0..CID_LEN {
                ones[i] |= b[i];
                zeros[i] |= !b[i];
            }
        }
        assert_eq!(ones[0] & FIRST_OCTET_RANDOM_MASK, FIRST_OCTET_RANDOM_MASK);
        assert_eq!(zeros[0] & FIRST_OCTET_RANDOM_MASK, FIRST_OCTET_RANDOM_MASK);
        // Bytes 2..7 random; byte 7, their check value, takes every bit value too.
        for i in 2..CID_LEN {
            assert_eq!((ones[i], zeros[i]), (0xFF, 0xFF), "byte {i}");
        }
    }

    #[test]
    fn core_range() {
        assert!(CoreCidGenerator::new(CoreId(254)).is_ok());
        assert_eq!(
            CoreCidGenerator::new(CoreId(255)).unwrap_err(),
            CidError::CoreOutOfRange { core: CoreId(255) }
        );
        assert!(CoreCidGenerator::new(CoreId(1000)).is_err());
        assert!(check_core_count(255).is_ok());
        assert_eq!(check_core_count(256), Err(CidError::TooManyCores { cores: 256 }));
    }

    #[test]
    fn hex_example_from_docs() {
        // docs/connection-ids.md, "Example": the vectors, and the doc shows each of them.
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/connection-ids.md"
        ))
        .expect("docs/connection-ids.md");
        let assert_shown = |bytes: &[u8]| {
            let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let hex = hex.join(" ");
            assert!(doc.contains(&hex), "docs/connection-ids.md does not show {hex}");
        };
        let cid = [0x1b, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x7f];
        assert_eq!(core_of(&cid), Some(CoreId(2)));
        let datagram = [0x41, 0x1b, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x7f, 0x8e, 0x01];
        assert_shown(&datagram);
        assert_eq!(core_of_datagram(&datagram, CID_LEN), Some(CoreId(2)));
        assert_eq!(steered_core_of_datagram(&datagram), Some(CoreId(2)));
        // The same CID with QUIC-LB's "unroutable" config bits (and their check value).
        let unroutable = [0xfb, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x11];
        assert_shown(&unroutable);
        assert_eq!(check_value(&unroutable), 0x11);
        assert_eq!(core_of(&unroutable), None);
        // Another last byte: a random DCID, which BPF steers to core 2 and nothing decodes.
        let datagram = [0x41, 0x1b, 0x02, 0x9f, 0x4c, 0x07, 0xe1, 0x5a, 0x33, 0x8e, 0x01];
        assert_shown(&datagram[1..1 + CID_LEN]);
        assert_eq!(core_of_datagram(&datagram, CID_LEN), None);
        assert_eq!(steered_core_of_datagram(&datagram), Some(CoreId(2)));
        // The Initial of a client that names core 2 with that CID ("Clients that ask for a
        // core"), and of one whose 8 random bytes are the previous vector.
        let mut initial = vec![0xc3, 0x00, 0x00, 0x00, 0x01, 0x08];
        initial.extend_from_slice(&cid);
        initial.extend_from_slice(&[0x00, 0x00, 0x44, 0xd0]);
        assert_shown(&initial);
        assert_eq!(core_of_datagram(&initial, CID_LEN), Some(CoreId(2)));
        assert_eq!(steered_core_of_datagram(&initial), None, "BPF leaves long headers to the hash");
        initial[6 + CHECK_BYTE_INDEX] = 0x33;
        assert_eq!(core_of_datagram(&initial, CID_LEN), None);
    }

    fn long_header(dcid: &[u8]) -> Vec<u8> {
        // Initial: first byte, version 1, DCID length and DCID, SCID length and SCID, rest.
        let mut d = vec![0xC0, 0, 0, 0, 1, dcid.len() as u8];
        d.extend_from_slice(dcid);
        d.push(8);
        d.extend_from_slice(&[0x5A; 8]);
        d.extend_from_slice(&[0xAA; 20]);
        d
    }

    #[test]
    fn long_headers_are_read_at_their_dcid() {
        let mut g = CoreCidGenerator::new(CoreId(3)).unwrap();
        let cid = g.generate_bytes();
        // An Initial from another broker names core 3.
        assert_eq!(core_of_datagram(&long_header(&cid), CID_LEN), Some(CoreId(3)));
        // A client's 20-byte random DCID is not read, whatever its bytes.
        let mut twenty = [0u8; 20];
        twenty[..CID_LEN].copy_from_slice(&cid);
        assert_eq!(core_of_datagram(&long_header(&twenty), CID_LEN), None);
        // Foreign config bits, the reserved core, a wrong check value, truncation.
        let with_check = |mut c: [u8; CID_LEN]| {
            c[CHECK_BYTE_INDEX] = check_value(&c);
            c
        };
        let foreign = with_check([0xE0, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(core_of_datagram(&long_header(&foreign), CID_LEN), None);
        let reserved = with_check([0x00, 0xFF, 0, 0, 0, 0, 0, 0]);
        assert_eq!(core_of_datagram(&long_header(&reserved), CID_LEN), None);
        let mut unchecked = cid;
        unchecked[CHECK_BYTE_INDEX] ^= 1;
        assert_eq!(core_of_datagram(&long_header(&unchecked), CID_LEN), None);
        assert_eq!(core_of_datagram(&long_header(&cid)[..10], CID_LEN), None);
        assert_eq!(core_of_datagram(&[0xC0, 0, 0, 0, 1], CID_LEN), None);
    }

    #[test]
    fn decode_rejects() {
        assert_eq!(core_of(&[]), None);
        assert_eq!(core_of(&[0x00, 0x01, 0, 0, 0, 0, 0]), None); // 7 bytes
        assert_eq!(core_of(&[0x00, 0xFF, 0, 0, 0, 0, 0, 0]), None); // reserved core
        assert_eq!(core_of_datagram(&[], CID_LEN), None);
        assert_eq!(core_of_datagram(&[0x40, 0x00, 0x01], CID_LEN), None);
        // A long header is read at its own DCID, not at byte 1.
        let cid = felix_proto::cid::cid_for_core(CoreId(1), [0; CID_LEN]).unwrap();
        let mut long = short_header(&cid);
        assert_eq!(core_of_datagram(&long, CID_LEN), Some(CoreId(1)));
        long[0] = 0xC0;
        assert_eq!(core_of_datagram(&long, CID_LEN), None);
        // Without its check value the CID names no core.
        let mut short = short_header(&cid);
        short[1 + CHECK_BYTE_INDEX] ^= 0x80;
        assert_eq!(core_of_datagram(&short, CID_LEN), None);
        assert_eq!(steered_core_of_datagram(&short), Some(CoreId(1)));
        assert_eq!(steered_core_of_datagram(&[0x40, 0x00]), None, "runt");
        assert_eq!(steered_core_of_datagram(&[0x40, 0x00, 0x01]), Some(CoreId(1)));
    }

    #[test]
    fn validate_matches_core_of() {
        let mut g = CoreCidGenerator::new(CoreId(5)).unwrap();
        let cid = g.generate_cid();
        assert!(g.validate(&cid).is_ok());
        assert!(g.validate(&ConnectionId::new(&[0xE0; CID_LEN])).is_err());
        let mut unchecked = g.generate_bytes();
        unchecked[CHECK_BYTE_INDEX] ^= 0x01;
        assert!(g.validate(&ConnectionId::new(&unchecked)).is_err(), "wrong check value");
        assert!(g.validate(&ConnectionId::new(&[0x00; 4])).is_err());
    }

    proptest! {
        #[test]
        fn generated_cids_decode_to_their_core(core in 0u16..255, seed: u64) {
            let mut g = CoreCidGenerator::with_rng(CoreId(core), StdRng::seed_from_u64(seed))
                .unwrap();
            let cid = g.generate_cid();
            prop_assert_eq!(cid.len(), CID_LEN);
            prop_assert_eq!(core_of(&cid), Some(CoreId(core)));
            prop_assert_eq!(core_of_datagram(&short_header(&cid), CID_LEN), Some(CoreId(core)));
            prop_assert!(g.validate(&cid).is_ok());
        }

        #[test]
        fn other_config_bits_decode_to_none(
            config in 1u8..8,
            mut cid in proptest::array::uniform8(any::<u8>()),
        ) {
            cid[0] = (config << CONFIG_ID_SHIFT) | (cid[0] & FIRST_OCTET_RANDOM_MASK);
            prop_assert_eq!(core_of(&cid), None);
            prop_assert_eq!(core_of_datagram(&short_header(&cid), CID_LEN), None);
        }

        #[test]
        fn bpf_steers_every_short_header_core_of_datagram_decodes(
            bytes in proptest::collection::vec(any::<u8>(), 0..32),
            core in 0u16..255,
            seed: u64,
        ) {
            // Any bytes, and a real CID in a short header: the software never names a core
            // the programs would not steer the datagram to.
            let mut g = CoreCidGenerator::with_rng(CoreId(core), StdRng::seed_from_u64(seed))
                .unwrap();
            for d in [bytes.clone(), short_header(&g.generate_bytes())] {
                if d.first().is_some_and(|b| b & LONG_HEADER_BIT == 0) {
                    if let Some(c) = core_of_datagram(&d, CID_LEN) {
                        prop_assert_eq!(steered_core_of_datagram(&d), Some(c));
                    }
                }
            }
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), len in 0usize..40) {
            let _ = core_of(&bytes);
            let _ = core_of_datagram(&bytes, len);
            let _ = steered_core_of_datagram(&bytes);
        }
    }
}
