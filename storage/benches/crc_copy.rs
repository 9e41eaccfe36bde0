//! criterion bench: the copy of payload parts into the write buffer with its CRC32C, the two
//! ways side by side. "copy, then CRC" is what `format::encode_batch` did before
//! `crc::copy_append` (copy_from_slice, then the `crc32c` crate over the copy while it is in
//! cache); "copy_append" is the fused pass. Parts are QUIC-sized (1,200 bytes, a 64-record
//! batch of 4 KiB values at a time). "cold" takes each batch's parts from the next 256 KiB
//! of a 64 MiB source, so they come from memory as received packets do; "warm" reuses one;
//! "cold source and destination" also writes each batch to the next 256 KiB of a 64 MiB sink
//! (the write buffer's lines not in cache either).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use felix_storage::crc::copy_append;

const PART: usize = 1200;
const BATCH: usize = 64 * 4096;
const SOURCE: usize = 64 << 20;

fn copy_then_crc(dst: &mut [u8], src: &[u8]) -> u32 {
    let mut crc = 0;
    for (d, s) in dst.chunks_mut(PART).zip(src.chunks(PART)) {
        d.copy_from_slice(s);
    }
    // As before: the CRC over the copy in 16 KiB spans.
    for d in dst.chunks(16 * 1024) {
        crc = crc32c::crc32c_append(crc, d);
    }
    crc
}

fn fused(dst: &mut [u8], src: &[u8]) -> u32 {
    let mut crc = 0;
    for (d, s) in dst.chunks_mut(PART).zip(src.chunks(PART)) {
        crc = copy_append(d, s, crc);
    }
    crc
}

fn bench(c: &mut Criterion) {
    let source: Vec<u8> = (0..SOURCE).map(|i| (i * 7 + i / 4093) as u8).collect();
    let mut dst = vec![0u8; BATCH];
    // Where "cold source and destination" writes: as large as the source, never in cache.
    let mut sink = vec![0u8; SOURCE + BATCH];
    let mut g = c.benchmark_group("crc_copy");
    g.throughput(Throughput::Bytes(BATCH as u64));
    type Pass = fn(&mut [u8], &[u8]) -> u32;
    for (name, f) in [("copy, then CRC", copy_then_crc as Pass), ("copy_append", fused as Pass)] {
        let mut at = 0;
        g.bench_function(format!("{name}, cold"), |b| {
            b.iter(|| {
                at = (at + BATCH) % SOURCE;
                f(&mut dst, &source[at..at + BATCH])
            })
        });
        g.bench_function(format!("{name}, warm"), |b| b.iter(|| f(&mut dst, &source[..BATCH])));
        let mut at = 0;
        g.bench_function(format!("{name}, cold source and destination"), |b| {
            b.iter(|| {
                at = (at + BATCH) % SOURCE;
                let to = (at + SOURCE / 2) % SOURCE;
                f(&mut sink[to..to + BATCH], &source[at..at + BATCH])
            })
        });
    }
    g.finish();
    // The two agree (and the bench measured real work).
    assert_eq!(copy_then_crc(&mut dst, &source[..BATCH]), fused(&mut dst, &source[..BATCH]));
}

criterion_group!(benches, bench);
criterion_main!(benches);
