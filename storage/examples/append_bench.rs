//! Durable-append benchmark of one stream log on one pinned core.
//!
//! `append_bench --dir D --cpu 0 --appenders 64 --shards 1 --total-mib 256`: each appender
//! sends durable batches of `--records` x `--record-bytes` until `--total-mib` of batch
//! payload is stored, then one JSON line with the log's own counters is printed (rates are
//! computed from what the log stored, not what was offered).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use felix_proto::{AckMode, Record, ShardId};
use felix_storage::{RetentionConfig, StorageConfig, StreamLog};
use glommio::{LocalExecutorBuilder, Placement};

/// Registered I/O memory of the bench executor (memlock is 8 MiB on the dev machine).
const IO_MEMORY_BYTES: usize = 1 << 20;

struct Args {
    dir: std::path::PathBuf,
    cpu: usize,
    appenders: usize,
    shards: u32,
    total_mib: u64,
    records: usize,
    record_bytes: usize,
}

fn parse() -> Args {
    let mut a = Args {
        dir: std::env::temp_dir().join("felix-append-bench"),
        cpu: 0,
        appenders: 64,
        shards: 1,
        total_mib: 256,
        records: 64,
        record_bytes: 4096,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let v = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--dir" => a.dir = v.into(),
            "--cpu" => a.cpu = v.parse().expect("--cpu N"),
            "--appenders" => a.appenders = v.parse().expect("--appenders N"),
            "--shards" => a.shards = v.parse().expect("--shards N"),
            "--total-mib" => a.total_mib = v.parse().expect("--total-mib N"),
            "--records" => a.records = v.parse().expect("--records N"),
            "--record-bytes" => a.record_bytes = v.parse().expect("--record-bytes N"),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    let a = parse();
    eprintln!(
        "append_bench: dir={} cpu={} appenders={} shards={} total_mib={} batch={}x{}B",
        a.dir.display(),
        a.cpu,
        a.appenders,
        a.shards,
        a.total_mib,
        a.records,
        a.record_bytes
    );
    let _ = std::fs::remove_dir_all(&a.dir);
    let line = LocalExecutorBuilder::new(Placement::Fixed(a.cpu))
        .io_memory(IO_MEMORY_BYTES)
        .spawn(move || async move { run(a).await })
        .expect("executor")
        .join()
        .expect("join");
    println!("{line}");
}

async fn run(a: Args) -> String {
    let config = StorageConfig::new(&a.dir);
    let shards: Vec<ShardId> = (0..a.shards).map(ShardId).collect();
    let (log, _) = StreamLog::open(
        "bench/append/s",
        &a.dir.join("log"),
        &shards,
        &config,
        RetentionConfig::default(),
    )
    .await
    .expect("open");
    let payload = Bytes::from(vec![0x5a; a.record_bytes]);
    let batch: Rc<Vec<Record>> =
        Rc::new((0..a.records).map(|_| Record::unkeyed(payload.clone())).collect());
    let batch_payload = (a.records * a.record_bytes) as u64;
    let batches_total = (a.total_mib << 20) / batch_payload;
    let issued = Rc::new(Cell::new(0u64));
    let start = Instant::now();
    let tasks: Vec<_> = (0..a.appenders)
        .map(|i| {
            let (log, batch, issued) = (log.clone(), batch.clone(), issued.clone());
            let shard = ShardId(i as u32 % a.shards);
            glommio::spawn_local(async move {
                while issued.get() < batches_total {
                    issued.set(issued.get() + 1);
                    log.append(shard, &batch, 0, AckMode::Durable).await.expect("append");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await;
    }
    let secs = start.elapsed().as_secs_f64();
    let s = log.stats();
    let mb = s.batch_bytes as f64 / 1e6;
    format!(
        concat!(
            "{{\"appenders\":{},\"shards\":{},\"batch_bytes\":{},\"bytes_written\":{},\"seconds\":{:.3},",
            "\"mb_per_s\":{:.1},\"appends\":{},\"flushes\":{},\"writes\":{},\"fan_in_mean\":{:.2},",
            "\"fan_in_p50\":{},\"flush_p50_us\":{},\"flush_p99_us\":{},\"flushes_per_gib\":{:.1}}}"
        ),
        a.appenders,
        a.shards,
        s.batch_bytes,
        s.bytes_written,
        secs,
        mb / secs,
        s.appends,
        s.flushes,
        s.writes,
        s.fan_in.mean(),
        s.fan_in.value_at_quantile(0.5),
        s.flush_latency_us.value_at_quantile(0.5),
        s.flush_latency_us.value_at_quantile(0.99),
        s.flushes_per_gib()
    )
}
