//! `CoreStore`: the stream logs of one core under `<data>/core-<n>/`, and the background
//! retention task.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::time::Duration;

use felix_proto::{CoreId, ShardId};

use crate::cache::{ReadCache, ReadCacheStats, SharedCache};
use crate::config::{stream_dir_name, RetentionConfig, StorageConfig};
use crate::error::{Result, StorageError};
use crate::io::{self, BackgroundQueue};
use crate::log::StreamLog;
use crate::recovery::RecoveryReport;

/// Shares of the background (retention) task queue; the foreground default is 1000.
pub const BACKGROUND_SHARES: usize = 50;

struct StoreInner {
    dir: PathBuf,
    config: StorageConfig,
    logs: RefCell<BTreeMap<String, StreamLog>>,
    /// The read cache every log of the core shares.
    cache: SharedCache,
}

/// The storage of one core. Not `Send`: it lives and dies on its executor.
///
/// Call order: [`CoreStore::open`] -> [`CoreStore::open_stream`] per stream ->
/// optionally [`CoreStore::start_retention`].
#[derive(Clone)]
pub struct CoreStore {
    inner: Rc<StoreInner>,
}

impl CoreStore {
    /// Open (create) `<config.dir>/core-<core>/`.
    pub async fn open(config: StorageConfig, core: CoreId) -> Result<CoreStore> {
        config.validate()?;
        let dir = std::path::absolute(&config.dir)
            .map_err(|e| StorageError::io("resolving path", config.dir.clone(), e))?
            .join(format!("core-{}", core.0));
        io::create_dir_all(&dir).await?;
        Ok(CoreStore {
            inner: Rc::new(StoreInner {
                dir,
                cache: ReadCache::shared(config.read_cache_bytes),
                config,
                logs: RefCell::new(BTreeMap::new()),
            }),
        })
    }

    /// This core's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.inner.dir
    }

    /// Open (recovering) the log of stream `name` holding `shards`, the shards this core
    /// owns. `retention: None` uses the store's default. Opening an open stream returns it.
    pub async fn open_stream(
        &self,
        name: &str,
        shards: &[ShardId],
        retention: Option<RetentionConfig>,
    ) -> Result<(StreamLog, RecoveryReport)> {
        if let Some(log) = self.inner.logs.borrow().get(name) {
            return Ok((log.clone(), RecoveryReport::default()));
        }
        let dir = self.inner.dir.join(stream_dir_name(name)?);
        let retention = retention.unwrap_or(self.inner.config.retention);
        let cache = self.inner.cache.clone();
        let (log, report) =
            StreamLog::open_with_cache(name, &dir, shards, &self.inner.config, retention, cache)
                .await?;
        self.inner.logs.borrow_mut().insert(name.to_owned(), log.clone());
        Ok((log, report))
    }

    /// Deletes stream `name` from this core: its log is closed for this store (handles still
    /// held elsewhere keep working on files that are gone) and its directory removed. A
    /// stream never opened here is removed from disk too. Returns whether a directory was there.
    pub async fn delete_stream(&self, name: &str) -> Result<bool> {
        let log = self.inner.logs.borrow_mut().remove(name);
        drop(log);
        let dir = self.inner.dir.join(stream_dir_name(name)?);
        let removed = io::remove_dir_all(&dir)?;
        io::sync_dir(&self.inner.dir).await?;
        Ok(removed)
    }

    /// The counters of the core's read cache.
    pub fn read_cache_stats(&self) -> ReadCacheStats {
        self.inner.cache.borrow().stats()
    }

    /// The open log of stream `name`.
    pub fn stream(&self, name: &str) -> Option<StreamLog> {
        self.inner.logs.borrow().get(name).cloned()
    }

    /// Run retention on every open log once.
    pub async fn enforce_retention(&self, now_ms: u64) -> Result<u64> {
        let logs: Vec<StreamLog> = self.inner.logs.borrow().values().cloned().collect();
        let mut deleted = 0;
        for log in logs {
            deleted += log.enforce_retention(now_ms).await?.segments_deleted;
        }
        Ok(deleted)
    }

    /// Start the retention task in a background task queue with `BACKGROUND_SHARES`
    /// shares; it runs every `interval` until the store is dropped.
    pub fn start_retention(&self, interval: Duration) -> Result<()> {
        let queue = BackgroundQueue::create("storage-retention", BACKGROUND_SHARES);
        let weak: Weak<StoreInner> = Rc::downgrade(&self.inner);
        queue.spawn(async move {
            loop {
                io::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                let store = CoreStore { inner };
                if let Err(e) = store.enforce_retention(io::now_ms()).await {
                    tracing::warn!(error = %e, "retention pass failed");
                }
            }
        })
    }
}

impl std::fmt::Debug for CoreStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreStore").field("dir", &self.inner.dir).finish()
    }
}
