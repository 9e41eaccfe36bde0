//! One core's AES-128-GCM rate with ring (the AEAD QUIC uses here): seal then open of one
//! packet-sized buffer, repeated for a fixed time. A physical limit for the benchmark reports.

use std::time::{Duration, Instant};

use anyhow::Context;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};

/// The result of [`measure`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct AeadRate {
    /// Plaintext bytes per operation.
    pub bytes: usize,
    /// Seal+open pairs done.
    pub pairs: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Plaintext MB (1e6 bytes) sealed and opened per second (each byte counted once).
    pub seal_open_mb_s: f64,
    /// Seal+open pairs per second.
    pub pairs_per_s: f64,
}

/// Seals and opens `bytes` of plaintext for `seconds` on the calling thread.
pub fn measure(bytes: usize, seconds: f64) -> anyhow::Result<AeadRate> {
    anyhow::ensure!(bytes > 0 && bytes <= 65536, "--bytes must be 1..=65536");
    let key_bytes = [7u8; 16];
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key_bytes).ok().context("key")?);
    let mut buf = vec![0x5au8; bytes];
    let limit = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < limit {
        for _ in 0..64 {
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&pairs.to_be_bytes());
            let tag = key
                .seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(&[1u8; 16]),
                    &mut buf,
                )
                .ok()
                .context("seal")?;
            buf.extend_from_slice(tag.as_ref());
            let plain_len = key
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&[1u8; 16]), &mut buf)
                .ok()
                .context("open")?
                .len();
            buf.truncate(plain_len);
            pairs += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(&buf);
    Ok(AeadRate {
        bytes,
        pairs,
        seconds: secs,
        seal_open_mb_s: pairs as f64 * bytes as f64 / 1e6 / secs,
        pairs_per_s: pairs as f64 / secs,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_and_counts() {
        let r = super::measure(1200, 0.05).expect("measure");
        assert!(r.pairs >= 64, "at least one round of 64 pairs");
        assert!(r.seal_open_mb_s > 0.0);
        assert!(super::measure(0, 0.01).is_err());
    }
}
