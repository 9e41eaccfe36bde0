//! The stable key-to-shard hash. Clients may compute it; it never changes for protocol
//! version 1.
//!
//! `shard = fnv1a_64(key) mod shard_count`, where FNV-1a 64 starts from the offset basis
//! `0xcbf29ce484222325` and, for each byte, XORs the byte in and multiplies by the prime
//! `0x100000001b3` (wrapping). An empty key hashes to the offset basis.

use crate::ShardId;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `key`.
pub fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(FNV_OFFSET_BASIS, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME))
}

/// The shard a key belongs to. `shard_count` 0 is treated as 1.
pub fn shard_for_key(key: &[u8], shard_count: u32) -> ShardId {
    let n = u64::from(shard_count.max(1));
    ShardId((key_hash(key) % n) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // Published FNV-1a 64 test values.
        assert_eq!(key_hash(b""), 0xcbf29ce484222325);
        assert_eq!(key_hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(key_hash(b"foobar"), 0x85944171f73967e8);
        assert_eq!(shard_for_key(b"foobar", 12), ShardId((0x85944171f73967e8u64 % 12) as u32));
    }

    #[test]
    fn spreads_keys_over_shards() {
        let mut seen = [0u32; 12];
        for i in 0..1200 {
            seen[shard_for_key(format!("key-{i}").as_bytes(), 12).0 as usize] += 1;
        }
        assert!(seen.iter().all(|n| *n > 50), "{seen:?}");
    }
}
