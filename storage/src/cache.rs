//! The read cache: recently read blocks of a core's segment files, shared by every reader of
//! every log on the core (one per [`crate::CoreStore`]; a log opened on its own has its own).
//!
//! A core's log interleaves the batches of all its shards, and a subscriber catching up runs
//! one reader per shard. With small batches each reader's I/O spans the others' batches (a
//! run of nearby batches is read in one I/O; a read below the dense index scans the log), so
//! twelve shards read the same bytes twelve times: deep catch-ups were bound by that, not by
//! the disk. Small batches and scans are read through aligned blocks kept here, least recently
//! used out first, so the readers of one region share one read of each block, and two readers
//! that miss the same block at once wait for one read; the block after the one a reader is in
//! is read ahead, so a reader walking the log forward keeps two reads in flight, not one. Batches of at least
//! [`READ_CACHE_BATCH_BYTES_MAX`] are read on their own, around the cache: a block would
//! cost more reading than it saves when one shard alone is behind.
//!
//! Blocks lie below the segment's end of completed writes when they are read: written bytes
//! never change (writes only append, and a failed write's range was never published), so a
//! block is never stale. The partial block at the end of the segment being written is not
//! kept (it grows with every write; its readers read what they need); a sealed segment's is.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::error::Result;
use crate::io::{LogFile, ReadBuf};
use crate::sync::{completion, Completer};

/// Bytes per cached block (blocks start at multiples of it in their file).
pub const READ_CACHE_BLOCK_BYTES: u64 = 1 << 20;
/// Batches this long or longer are read on their own, not through the cache.
pub const READ_CACHE_BATCH_BYTES_MAX: u32 = 128 << 10;

/// How far a segment file is written, as the cache needs to know it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Written {
    /// The file position the segment's completed writes reach.
    pub(crate) end: u64,
    /// Whether the segment is sealed (a later one is being written): its end never moves.
    pub(crate) sealed: bool,
}

impl Written {
    /// The end of what the cache may keep: all of a sealed segment, the whole blocks of the
    /// one being written (its last, partial block grows with every write).
    pub(crate) fn cacheable_end(&self) -> u64 {
        if self.sealed {
            self.end
        } else {
            self.end - self.end % READ_CACHE_BLOCK_BYTES
        }
    }

    /// The length of the block at `start`, if the cache may keep it.
    fn block_len(&self, start: u64) -> Option<usize> {
        let end = self.cacheable_end();
        (start < end).then(|| READ_CACHE_BLOCK_BYTES.min(end - start) as usize)
    }
}

/// Counters of a read cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCacheStats {
    /// Reads served from a cached block.
    pub hits: u64,
    /// Blocks read from disk.
    pub misses: u64,
    /// Reads that waited for another reader's read of the same block.
    pub waits: u64,
    /// Blocks read ahead of their readers (counted in `misses` once read).
    pub read_aheads: u64,
    /// Blocks dropped to stay within the capacity.
    pub evictions: u64,
    /// Bytes held now.
    pub bytes: u64,
}

enum Slot {
    Ready {
        buf: ReadBuf,
        used: u64,
    },
    /// Being read; the readers waiting for it.
    Loading(Vec<Completer<ReadBuf>>),
}

/// The cache itself; see the module docs.
pub(crate) struct ReadCache {
    /// (file id, block start) -> block.
    slots: HashMap<(u64, u64), Slot>,
    blocks_max: usize,
    ready: usize,
    tick: u64,
    stats: ReadCacheStats,
}

/// A read cache shared by the logs of one core.
pub(crate) type SharedCache = Rc<RefCell<ReadCache>>;

impl ReadCache {
    /// A cache of at most `bytes_max` bytes of blocks (0: no cache).
    pub(crate) fn shared(bytes_max: u64) -> SharedCache {
        Rc::new(RefCell::new(ReadCache {
            slots: HashMap::new(),
            blocks_max: (bytes_max / READ_CACHE_BLOCK_BYTES) as usize,
            ready: 0,
            tick: 0,
            stats: ReadCacheStats::default(),
        }))
    }

    /// Whether the cache holds anything at all (its capacity is at least one block).
    pub(crate) fn enabled(&self) -> bool {
        self.blocks_max > 0
    }

    pub(crate) fn stats(&self) -> ReadCacheStats {
        self.stats
    }

    /// Drop the blocks of a file (deleted by retention), also those being read: such a read
    /// still reaches its reader, but the block is not kept, and the readers waiting for it
    /// read on their own.
    pub(crate) fn forget_file(&mut self, file_id: u64) {
        let mut dropped = 0u64;
        self.slots.retain(|(id, _), slot| match slot {
            _ if *id != file_id => true,
            Slot::Ready { buf, .. } => {
                dropped += buf.len() as u64;
                false
            }
            Slot::Loading(_) => false,
        });
        self.recount();
        self.stats.bytes -= dropped;
    }

    fn recount(&mut self) {
        self.ready = self.slots.values().filter(|s| matches!(s, Slot::Ready { .. })).count();
    }

    /// Make room: drop least recently used blocks until at most `blocks_max` are held.
    fn evict(&mut self) {
        while self.ready > self.blocks_max {
            let oldest = self
                .slots
                .iter()
                .filter_map(|(k, s)| match s {
                    Slot::Ready { used, .. } => Some((*used, *k)),
                    Slot::Loading(_) => None,
                })
                .min();
            let Some((_, key)) = oldest else { return };
            if let Some(Slot::Ready { buf, .. }) = self.slots.remove(&key) {
                self.stats.bytes -= buf.len() as u64;
                self.stats.evictions += 1;
            }
            self.ready -= 1;
        }
    }
}

/// Removes a `Loading` slot whose read did not finish (failed, or its reader went away):
/// its waiters then see no block and read on their own.
struct LoadGuard {
    cache: SharedCache,
    key: (u64, u64),
    done: bool,
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut c = self.cache.borrow_mut();
        if matches!(c.slots.get(&self.key), Some(Slot::Loading(_))) {
            c.slots.remove(&self.key);
        }
    }
}

/// The cached block of `file` holding `[pos, pos + len)`, read if it is not held. Returns the
/// block and its start, or `None` when the range is not within one block, lies past what
/// the cache may keep of the segment ([`Written::cacheable_end`]), or the cache is off: the
/// caller then reads the range itself.
///
/// The next block is read ahead in the background when it is not held (readers of a log
/// walk it forward), so a reader finds it read, or being read, when it gets there.
pub(crate) async fn block(
    cache: &SharedCache,
    file: &Rc<LogFile>,
    pos: u64,
    len: usize,
    written: Written,
) -> Result<Option<(ReadBuf, u64)>> {
    let start = pos - pos % READ_CACHE_BLOCK_BYTES;
    let need = pos - start + len as u64;
    if !cache.borrow().enabled()
        || need > READ_CACHE_BLOCK_BYTES
        || pos + len as u64 > written.cacheable_end()
    {
        return Ok(None);
    }
    let key = (file.id(), start);
    let wait = {
        let mut c = cache.borrow_mut();
        let c = &mut *c;
        c.tick += 1;
        match c.slots.get_mut(&key) {
            Some(Slot::Ready { buf, used }) if buf.len() as u64 >= need => {
                *used = c.tick;
                c.stats.hits += 1;
                let buf = buf.clone();
                read_ahead(c, cache, file, start + READ_CACHE_BLOCK_BYTES, written);
                return Ok(Some((buf, start)));
            }
            Some(Slot::Loading(waiters)) => {
                let (tx, rx) = completion();
                waiters.push(tx);
                c.stats.waits += 1;
                Some(rx)
            }
            // Absent (or, defensively, held short of what is needed): read it.
            _ => {
                c.start_loading(key);
                read_ahead(c, cache, file, start + READ_CACHE_BLOCK_BYTES, written);
                None
            }
        }
    };
    if let Some(rx) = wait {
        // Another reader's read; a block too short for us, or none, and we read on our own.
        return Ok(rx.await.filter(|b| b.len() as u64 >= need).map(|b| (b, start)));
    }
    let block_len = written.block_len(start).expect("the range is below the cacheable end");
    let buf = load(cache.clone(), file, key, block_len).await?;
    Ok((buf.len() as u64 >= need).then_some((buf, start)))
}

impl ReadCache {
    /// Mark `key` as being read (dropping a held, shorter copy).
    fn start_loading(&mut self, key: (u64, u64)) {
        if let Some(Slot::Ready { buf, .. }) = self.slots.insert(key, Slot::Loading(Vec::new())) {
            self.stats.bytes -= buf.len() as u64;
            self.ready -= 1;
        }
    }
}

/// Start reading the block at `start` in the background if the cache may keep it and does
/// not hold it.
fn read_ahead(
    c: &mut ReadCache,
    cache: &SharedCache,
    file: &Rc<LogFile>,
    start: u64,
    written: Written,
) {
    let key = (file.id(), start);
    let Some(block_len) = written.block_len(start) else { return };
    if c.slots.contains_key(&key) {
        return;
    }
    c.start_loading(key);
    c.stats.read_aheads += 1;
    let (cache, file) = (cache.clone(), file.clone());
    crate::io::spawn(async move {
        if let Err(e) = load(cache, &file, key, block_len).await {
            tracing::debug!(error = %e, "read-ahead failed; readers read the block themselves");
        }
    });
}

/// Read the block `key`, `block_len` bytes (marked `Loading` by the caller), hold it, and
/// hand it to the readers waiting for it.
async fn load(
    cache: SharedCache,
    file: &LogFile,
    key: (u64, u64),
    block_len: usize,
) -> Result<ReadBuf> {
    let mut guard = LoadGuard { cache, key, done: false };
    let buf = file.read_buf(key.1, block_len).await?;
    let waiters = {
        let mut c = guard.cache.borrow_mut();
        let c = &mut *c;
        c.stats.misses += 1;
        // Kept only while the slot is still ours: `forget_file` may have dropped it.
        match c.slots.get_mut(&key) {
            Some(slot @ Slot::Loading(_)) => {
                let Slot::Loading(waiters) =
                    std::mem::replace(slot, Slot::Ready { buf: buf.clone(), used: c.tick })
                else {
                    unreachable!("matched as loading")
                };
                c.ready += 1;
                c.stats.bytes += buf.len() as u64;
                c.evict();
                waiters
            }
            _ => Vec::new(),
        }
    };
    guard.done = true;
    for w in waiters {
        w.complete(buf.clone());
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io;
    use std::time::Duration;

    /// A block being read when retention forgets its file reaches its reader but is not
    /// kept, nor is the block read ahead behind it.
    #[test]
    fn a_block_read_while_its_file_is_forgotten_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        io::run_local(move || async move {
            let block = READ_CACHE_BLOCK_BYTES as usize;
            let file = Rc::new(LogFile::create(&path, vec![7u8; 2 * block]).await.unwrap());
            let cache = ReadCache::shared(4 * READ_CACHE_BLOCK_BYTES);
            let written = Written { end: 2 * READ_CACHE_BLOCK_BYTES, sealed: true };
            let mut read = Box::pin(super::block(&cache, &file, 100, 4096, written));
            assert!(
                futures_lite::future::poll_once(&mut read).await.is_none(),
                "read is under way"
            );
            assert_eq!(cache.borrow().slots.len(), 2, "the block and the one read ahead");
            cache.borrow_mut().forget_file(file.id());
            let (buf, start) = read.await.unwrap().expect("the reader gets its block");
            assert_eq!((buf.len(), start, buf[100]), (block, 0, 7));
            for _ in 0..500 {
                if cache.borrow().stats().misses == 2 {
                    break;
                }
                io::sleep(Duration::from_millis(10)).await;
            }
            let c = cache.borrow();
            assert_eq!(c.stats().misses, 2, "both reads finished");
            assert_eq!((c.slots.len(), c.ready, c.stats().bytes), (0, 0, 0));
        });
    }
}
