//! Encode and decode a 64-record keyed batch at 256 B, 4 KiB and 64 KiB per record.
//!
//! Zero-copy decode must not grow with payload size: compare the per-record decode time across
//! the three sizes (the decode rate in GB/s of payload grows with size instead).

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use felix_proto::*;

const RECORDS: usize = 64;
const SIZES: [usize; 3] = [256, 4096, 65536];

fn publish(size: usize) -> Frame {
    Frame::Publish(Publish {
        oldest_pending: false,
        ack: Some(AckRequest { request_id: RequestId(1), mode: AckMode::Durable }),
        key: Some(Bytes::from_static(b"customer-0042")),
        producer: None,
        stream: "acme/orders/eu".into(),
        records: (0..RECORDS).map(|i| vec![i as u8; size].into()).collect(),
    })
}

fn event_batch(size: usize) -> Frame {
    Frame::EventBatch(EventBatch {
        shard: ShardId(3),
        base_offset: Offset(1000),
        timestamp_ms: 1_700_000_000_000,
        records: (0..RECORDS)
            .map(|i| Record::keyed(format!("key-{i}"), Bytes::from(vec![i as u8; size])))
            .collect(),
    })
}

fn bench(c: &mut Criterion) {
    let limits = Limits::default();
    for (name, make) in [("publish", publish as fn(usize) -> Frame), ("event_batch", event_batch)] {
        let mut group = c.benchmark_group(name);
        for size in SIZES {
            let frame = make(size);
            let wire = frame.to_bytes();
            group.throughput(Throughput::Bytes((RECORDS * size) as u64));
            group.bench_with_input(BenchmarkId::new("encode", size), &frame, |b, f| {
                let mut buf = BytesMut::with_capacity(wire.len());
                b.iter(|| {
                    buf.clear();
                    f.encode(&mut buf);
                    black_box(buf.len())
                })
            });
            group.bench_with_input(BenchmarkId::new("decode", size), &wire, |b, w| {
                b.iter(|| {
                    let f = decode_frame(black_box(w.clone()), &limits, Capabilities::ALL);
                    black_box(f.is_ok())
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
