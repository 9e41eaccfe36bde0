//! Shared test helpers: a small glommio executor and record generators.
#![allow(dead_code)]

use std::future::Future;

use bytes::Bytes;
use felix_proto::Record;
use felix_storage::StorageConfig;
use glommio::{LocalExecutorBuilder, Placement};

/// Registered I/O memory of test executors (memlock is 8 MiB here).
pub const TEST_IO_MEMORY_BYTES: usize = 512 << 10;

/// Run `f` on a fresh, unpinned glommio executor and return its output.
pub fn run<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(TEST_IO_MEMORY_BYTES)
        .spawn(f)
        .expect("executor starts")
        .join()
        .expect("executor thread joins")
}

/// A config with the smallest segments allowed.
pub fn small_config(dir: &std::path::Path) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.segment_bytes_max =
        felix_storage::format::SEGMENT_HEADER_BYTES + felix_storage::WRITE_BYTES_MAX as u64;
    c
}

/// Records whose content names (shard, offset, index) so any mix-up is visible.
pub fn records(shard: u32, base: u64, n: usize, value_len: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let tag = format!("s{shard}-o{}", base + i as u64);
            let mut v = tag.clone().into_bytes();
            v.resize(value_len.max(v.len()), b'.');
            if i % 2 == 0 {
                Record::keyed(Bytes::from(tag), Bytes::from(v))
            } else {
                Record::unkeyed(Bytes::from(v))
            }
        })
        .collect()
}
