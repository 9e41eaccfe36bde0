//! Shared test helpers: a small glommio executor and record generators.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use felix_proto::{Offset, Record, ShardId};
use felix_storage::{StorageConfig, StoredBatch, StreamLog};
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

/// Unmounts (lazily) and removes the mount point when dropped.
pub struct MountGuard(pub PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn sh(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A ~24 MiB ext4 on a loop device, or else a 24 MiB tmpfs; None if neither can be made.
pub fn small_fs(work: &Path) -> Option<(MountGuard, &'static str)> {
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).ok()?;
    let img = work.join("fs.img");
    let img_s = img.to_str()?;
    let mnt_s = mnt.to_str()?;
    if std::fs::File::create(&img).and_then(|f| f.set_len(24 << 20)).is_ok()
        && sh("mkfs.ext4", &["-q", "-F", img_s])
        && sh("mount", &["-o", "loop", img_s, mnt_s])
    {
        return Some((MountGuard(mnt), "ext4 on a loop device"));
    }
    if sh("mount", &["-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt_s]) {
        return Some((MountGuard(mnt), "tmpfs (buffered, no O_DIRECT)"));
    }
    None
}

/// Every batch of `shard` from its start offset to its next one, read in 1 MiB steps; a gap
/// (nothing at an offset below the next one) fails the test.
pub async fn read_all(log: &StreamLog, shard: ShardId) -> Vec<StoredBatch> {
    let mut out = Vec::new();
    let next = log.next_offset(shard).unwrap().0;
    let mut at = log.start_offset(shard).unwrap().0;
    while at < next {
        let batches = log.read(shard, Offset(at), 1 << 20).await.expect("read");
        assert!(!batches.is_empty(), "{shard} has nothing at {at}");
        for b in batches {
            at = b.base_offset.0 + b.records.len() as u64;
            out.push(b);
        }
    }
    out
}
