//! CID micro-benchmarks: issuing a CID and the driver's safety-net decode.
//!
//! Run: `cargo bench -p felix-broker --bench cid` (pin with `taskset -c N` for stable figures).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use felix_broker::net::cid::{core_of_datagram, CoreCidGenerator, CID_LEN};
use felix_proto::CoreId;
use quinn_proto::ConnectionIdGenerator;

/// The decode as the driver uses it, flattened to a u32 (`u32::MAX` = no core). Passing the
/// `Option<CoreId>` itself through `black_box` measured the harness instead: ~17 ns per call,
/// spent (perf annotate) on overlapping stack stores and loads around `black_box`; flattened,
/// ~3 ns.
fn decode(datagram: &[u8]) -> u32 {
    core_of_datagram(datagram, CID_LEN).map_or(u32::MAX, |core| u32::from(core.0))
}

fn bench_cid(c: &mut Criterion) {
    let mut generator = CoreCidGenerator::new(CoreId(3)).expect("core 3 is in range");
    c.bench_function("generate_cid", |b| b.iter(|| black_box(generator.generate_cid())));

    let cid = generator.generate_cid();
    let mut short = vec![0x41];
    short.extend_from_slice(&cid);
    short.resize(1200, 0xAA);
    c.bench_function("core_of_datagram/short_header", |b| {
        b.iter(|| black_box(decode(black_box(&short))))
    });

    // Harness floor under the same conditions: reading the length of the same buffer.
    c.bench_function("baseline/len", |b| b.iter(|| black_box(black_box(&short).len())));

    let mut long = short.clone();
    long[0] = 0xC3;
    c.bench_function("core_of_datagram/long_header", |b| {
        b.iter(|| black_box(decode(black_box(&long))))
    });
}

criterion_group!(benches, bench_cid);
criterion_main!(benches);
