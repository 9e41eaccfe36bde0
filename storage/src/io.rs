//! The driver: the only module that touches glommio, files, directories and clocks.
//!
//! Segment files are glommio `DmaFile`s (O_DIRECT, reads, writes and fdatasync through the
//! core's io_uring). On a file system without O_DIRECT (tmpfs) glommio opens the file
//! without it and the same code runs buffered; alignment rules are kept either way.
//! Swapping the runtime means rewriting this module only.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use glommio::io::{Directory, DmaBuffer, DmaFile, OpenOptions};
use glommio::{GlommioError, Latency, Shares, TaskQueueHandle};

use crate::error::{Result, StorageError};
use crate::format::FORMAT_ALIGN_BYTES;

fn to_io<T>(e: GlommioError<T>) -> io::Error {
    match e {
        GlommioError::EnhancedIoError { source, .. } => source,
        GlommioError::IoError(e) => e,
        other => other.into(),
    }
}

/// An aligned buffer for one write.
pub(crate) struct WriteBuf(DmaBuffer);

impl WriteBuf {
    pub(crate) fn as_mut(&mut self) -> &mut [u8] {
        self.0.as_bytes_mut()
    }
}

/// Bytes read from a file, in the buffer the read went into (the runtime's own: it lives on
/// this core's thread and is not `Send`). A clone shares the buffer.
#[derive(Clone)]
pub(crate) struct ReadBuf(glommio::io::ReadResult);

impl std::ops::Deref for ReadBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// One segment file.
pub(crate) struct LogFile {
    file: DmaFile,
    path: PathBuf,
    /// Unique within the process (the read cache's key; a reopened file gets a new one).
    id: u64,
    /// Opened with O_DSYNC: a completed write is durable.
    sync_writes: bool,
}

/// Ids of opened segment files.
static LOG_FILE_IDS: AtomicU64 = AtomicU64::new(0);

impl LogFile {
    /// Create a new file (it must not exist) holding `first_block`, fdatasync it, and open
    /// it for direct I/O.
    ///
    /// The first block is written through a buffered handle because glommio probes
    /// io_uring polled-I/O support by reading the start of the file when it opens a DMA
    /// file: on an empty file that read succeeds trivially and the file is wrongly marked
    /// pollable, after which reads fail with EOPNOTSUPP on devices without polling.
    pub(crate) async fn create(path: &Path, first_block: Vec<u8>) -> Result<LogFile> {
        Self::create_with(path, first_block, false).await
    }

    /// [`LogFile::create`], the file then opened with O_DSYNC when `sync_writes`.
    pub(crate) async fn create_with(
        path: &Path,
        first_block: Vec<u8>,
        sync_writes: bool,
    ) -> Result<LogFile> {
        let err = |context, e| StorageError::io(context, path.to_owned(), to_io(e));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .buffered_open(path)
            .await
            .map_err(|e| err("creating segment", e))?;
        let len = first_block.len();
        let written = async {
            let n = file.write_at(first_block, 0).await.map_err(|e| err("writing", e))?;
            if n != len {
                return Err(StorageError::io(
                    "short write",
                    path.to_owned(),
                    io::Error::from_raw_os_error(libc::ENOSPC),
                ));
            }
            file.fdatasync().await.map_err(|e| err("fdatasync", e))
        }
        .await;
        if let Err(e) = written {
            // Do not leave a half-created file behind: the next attempt uses the same name.
            let _ = file.remove().await;
            let _ = file.close().await;
            return Err(e);
        }
        file.close().await.map_err(|e| err("closing", e))?;
        Self::open_with(path, sync_writes).await
    }

    /// Open an existing file for reading and writing.
    pub(crate) async fn open(path: &Path) -> Result<LogFile> {
        Self::open_with(path, false).await
    }

    /// Open an existing file for reading and writing, with O_DSYNC when `sync_writes` (every
    /// completed write is then durable: [`LogFile::sync_writes`]).
    pub(crate) async fn open_with(path: &Path, sync_writes: bool) -> Result<LogFile> {
        probe_device_once(path).await?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(if sync_writes { libc::O_DSYNC } else { 0 })
            .dma_open(path)
            .await
            .map_err(|e| StorageError::io("opening segment", path.to_owned(), to_io(e)))?;
        Self::checked(file, path, sync_writes)
    }

    fn checked(file: DmaFile, path: &Path, sync_writes: bool) -> Result<LogFile> {
        if !FORMAT_ALIGN_BYTES.is_multiple_of(file.alignment()) {
            return Err(StorageError::InvalidConfig {
                reason: "device O_DIRECT alignment does not divide FORMAT_ALIGN_BYTES",
            });
        }
        let id = LOG_FILE_IDS.fetch_add(1, Ordering::Relaxed);
        Ok(LogFile { file, path: path.to_owned(), id, sync_writes })
    }

    /// Whether a completed write is durable (the file was opened with O_DSYNC).
    pub(crate) fn sync_writes(&self) -> bool {
        self.sync_writes
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// This open file's process-unique id.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// An aligned buffer of `len` bytes (a multiple of the format alignment).
    pub(crate) fn alloc(&self, len: usize) -> WriteBuf {
        debug_assert!((len as u64).is_multiple_of(FORMAT_ALIGN_BYTES));
        WriteBuf(self.file.alloc_dma_buffer(len))
    }

    /// Write all of `buf` at `pos` (aligned); a short write is an error.
    pub(crate) async fn write_at(&self, buf: WriteBuf, pos: u64) -> Result<()> {
        let len = buf.0.len();
        let n = self
            .file
            .write_at(buf.0, pos)
            .await
            .map_err(|e| StorageError::io("writing", self.path.clone(), to_io(e)))?;
        if n != len {
            // A short O_DIRECT write: the kernel ran out of space (or the device failed)
            // after part of the buffer. Report it as ENOSPC-like so the caller truncates.
            return Err(StorageError::io(
                "short write",
                self.path.clone(),
                io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        Ok(())
    }

    /// Read up to `len` bytes at `pos` (any alignment); fewer at the end of the file.
    pub(crate) async fn read_at(&self, pos: u64, len: usize) -> Result<Vec<u8>> {
        Ok(self.read_buf(pos, len).await?.to_vec())
    }

    /// [`LogFile::read_at`] without the copy: the bytes stay in the buffer the kernel read
    /// them into, for as long as the caller holds it.
    pub(crate) async fn read_buf(&self, pos: u64, len: usize) -> Result<ReadBuf> {
        let r = self
            .file
            .read_at(pos, len)
            .await
            .map_err(|e| StorageError::io("reading", self.path.clone(), to_io(e)))?;
        Ok(ReadBuf(r))
    }

    pub(crate) async fn fdatasync(&self) -> Result<()> {
        self.file
            .fdatasync()
            .await
            .map_err(|e| StorageError::io("fdatasync", self.path.clone(), to_io(e)))
    }

    pub(crate) async fn truncate(&self, size: u64) -> Result<()> {
        self.file
            .truncate(size)
            .await
            .map_err(|e| StorageError::io("truncating", self.path.clone(), to_io(e)))
    }

    /// Reserve blocks of `[0, len)` without changing the file size (FALLOC_FL_KEEP_SIZE), so
    /// that appending writes do not allocate blocks one write at a time. Blocks already
    /// allocated are kept; a truncate releases those past the new size.
    pub(crate) async fn reserve(&self, len: u64) -> Result<()> {
        self.file
            .pre_allocate(len, true)
            .await
            .map_err(|e| StorageError::io("fallocate", self.path.clone(), to_io(e)))
    }

    pub(crate) async fn size(&self) -> Result<u64> {
        self.file
            .file_size()
            .await
            .map_err(|e| StorageError::io("stat", self.path.clone(), to_io(e)))
    }

    /// Unlink the file (open handles stay readable).
    pub(crate) async fn remove(&self) -> Result<()> {
        self.file
            .remove()
            .await
            .map_err(|e| StorageError::io("removing", self.path.clone(), to_io(e)))
    }
}

/// Name prefix of the file [`probe_device_once`] opens first (`.io-probe.<pid>.<n>`).
const PROBE_FILE_PREFIX: &str = ".io-probe.";
/// Names of probe files, unique within the process.
static PROBE_FILES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Devices (`st_dev`) on which this thread has opened a probe file with data.
    static PROBED_DEVICES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Make this thread's first direct-I/O open on the device of `path` one of a file with data.
///
/// glommio decides, once per device and thread, whether io_uring polled I/O works there by
/// reading the start of the first file it opens for direct I/O. On a file shorter than that
/// read (a crash between creating a file and writing its first block leaves one empty) the
/// read succeeds without reaching the device, the device is taken as pollable, and on a device
/// without polling (most virtual disks) every later read and write of the thread fails with
/// EOPNOTSUPP. So before the first open on a device this thread writes a block to a probe file
/// next to `path`, opens it (glommio's probe reads real data and gets the device's true
/// answer) and removes it. Probe files of processes that are gone (a crash) are removed on the
/// way.
async fn probe_device_once(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let err = |context, e| StorageError::io(context, dir.to_owned(), e);
    let dev = std::fs::metadata(dir).map_err(|e| err("stat", e))?.dev();
    if PROBED_DEVICES.with(|d| d.borrow().contains(&dev)) {
        return Ok(());
    }
    let pid = std::process::id();
    for name in list_dir(dir)? {
        // Left by a process that is gone (a live one, ours or another on this directory,
        // may be about to open its probe file).
        let stale = name
            .strip_prefix(PROBE_FILE_PREFIX)
            .and_then(|rest| rest.split('.').next())
            .is_some_and(|p| p != pid.to_string() && !Path::new("/proc").join(p).exists());
        if stale {
            let _ = std::fs::remove_file(dir.join(&name));
        }
    }
    let n = PROBE_FILES.fetch_add(1, Ordering::Relaxed);
    let probe = dir.join(format!("{PROBE_FILE_PREFIX}{pid}.{n}"));
    let written = std::fs::write(&probe, vec![0u8; FORMAT_ALIGN_BYTES as usize])
        .and_then(|()| std::fs::File::open(&probe)?.sync_data());
    let opened = match written {
        Ok(()) => OpenOptions::new()
            .read(true)
            .dma_open(&probe)
            .await
            .map_err(|e| StorageError::io("opening probe file", probe.clone(), to_io(e))),
        Err(e) => Err(StorageError::io("writing probe file", probe.clone(), e)),
    };
    let closed = match opened {
        Ok(file) => file
            .close()
            .await
            .map_err(|e| StorageError::io("closing probe file", probe.clone(), to_io(e))),
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(&probe);
    closed?;
    PROBED_DEVICES.with(|d| d.borrow_mut().push(dev));
    Ok(())
}

/// Create `path` and its parents if missing; fsync the parent of each created directory.
pub(crate) async fn create_dir_all(path: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = path;
    while !p.exists() {
        missing.push(p.to_owned());
        match p.parent() {
            Some(parent) => p = parent,
            None => break,
        }
    }
    for dir in missing.iter().rev() {
        Directory::create(dir)
            .await
            .map_err(|e| StorageError::io("creating directory", dir.clone(), to_io(e)))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent).await?;
        }
    }
    Ok(())
}

/// fsync a directory (after a file in it was created, renamed or deleted).
pub(crate) async fn sync_dir(path: &Path) -> Result<()> {
    let err = |e| StorageError::io("syncing directory", path.to_owned(), to_io(e));
    let dir = Directory::open(path).await.map_err(err)?;
    dir.sync().await.map_err(err)?;
    dir.close().await.map_err(err)
}

/// Rename `from` to `to`, replacing `to` (a blocking rename: only used when opening a log);
/// the caller fsyncs the directory.
/// Removes `path` and everything under it; `false` when it was not there.
pub(crate) fn remove_dir_all(path: &Path) -> Result<bool> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StorageError::io("removing directory", path.to_owned(), e)),
    }
}

pub(crate) fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| StorageError::io("renaming", from.to_owned(), e))
}

/// Replace `dir/name` by a file holding `bytes`: write `dir/name.tmp`, fdatasync it, rename
/// it over `name`, fsync the directory. A crash leaves the old file or the new one.
pub(crate) async fn replace_file(dir: &Path, name: &str, bytes: Vec<u8>) -> Result<()> {
    let (path, tmp) = (dir.join(name), dir.join(format!("{name}.tmp")));
    let err = |context, e| StorageError::io(context, tmp.clone(), to_io(e));
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .buffered_open(&tmp)
        .await
        .map_err(|e| err("creating", e))?;
    let len = bytes.len();
    let written = async {
        let n = file.write_at(bytes, 0).await.map_err(|e| err("writing", e))?;
        if n != len {
            let enospc = io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(StorageError::io("short write", tmp.clone(), enospc));
        }
        file.fdatasync().await.map_err(|e| err("fdatasync", e))
    }
    .await;
    let closed = file.close().await.map_err(|e| err("closing", e));
    written?;
    closed?;
    std::fs::rename(&tmp, &path).map_err(|e| StorageError::io("renaming", tmp.clone(), e))?;
    sync_dir(dir).await
}

/// The bytes of the file at `path`, at most `limit` of them (more is an error); `None` if
/// there is no such file.
pub(crate) async fn read_file(path: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
    let err = |context, e| StorageError::io(context, path.to_owned(), to_io(e));
    if !path.exists() {
        return Ok(None);
    }
    let file =
        OpenOptions::new().read(true).buffered_open(path).await.map_err(|e| err("opening", e))?;
    let read = async {
        let size = file.file_size().await.map_err(|e| err("reading the size of", e))?;
        if size > limit {
            let efbig = io::Error::from_raw_os_error(libc::EFBIG);
            return Err(StorageError::io("a sidecar file too large", path.to_owned(), efbig));
        }
        let bytes = file.read_at(0, size as usize).await.map_err(|e| err("reading", e))?;
        Ok(bytes.to_vec())
    }
    .await;
    let _ = file.close().await;
    read.map(Some)
}

/// Names of the entries of a directory (a blocking readdir: only used when opening a log).
pub(crate) fn list_dir(path: &Path) -> Result<Vec<String>> {
    let err = |e| StorageError::io("listing directory", path.to_owned(), e);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(path).map_err(err)? {
        names.push(entry.map_err(err)?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Run a task on the current executor, in the current (foreground) task queue.
pub(crate) fn spawn(fut: impl Future<Output = ()> + 'static) {
    glommio::spawn_local(fut).detach();
}

/// A background task queue with `shares` (the foreground default is 1000).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BackgroundQueue(TaskQueueHandle);

impl BackgroundQueue {
    /// Create a throughput-oriented queue with few shares on the current executor.
    pub(crate) fn create(name: &str, shares: usize) -> BackgroundQueue {
        BackgroundQueue(glommio::executor().create_task_queue(
            Shares::Static(shares),
            Latency::NotImportant,
            name,
        ))
    }

    /// Run `fut` in this queue.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + 'static) -> Result<()> {
        glommio::spawn_local_into(fut, self.0)
            .map(|t| t.detach())
            .map(|_| ())
            .map_err(|e| StorageError::io("spawning background task", PathBuf::new(), to_io(e)))
    }
}

/// Sleep on the executor's timer.
/// Run the future `make` returns to its end on a new executor thread (unit tests).
#[cfg(test)]
pub(crate) fn run_local<F, G>(make: G)
where
    F: Future<Output = ()> + 'static,
    G: FnOnce() -> F + Send + 'static,
{
    glommio::LocalExecutorBuilder::default()
        .io_memory(256 << 10)
        .spawn(make)
        .expect("executor starts")
        .join()
        .expect("test task");
}

pub(crate) async fn sleep(d: Duration) {
    glommio::timer::sleep(d).await;
}

/// Wall clock, ms since the Unix epoch (background tasks only).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A monotonic stopwatch for latency histograms.
pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Stopwatch(Instant::now())
    }

    pub(crate) fn elapsed_us(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
}
