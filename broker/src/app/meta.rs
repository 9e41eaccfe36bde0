//! Stream metadata and the data directory's layout file.
//!
//! Each stream has `<data>/streams/<hex of name>.meta`, a few `key = value` lines (shards,
//! retention; in a cluster also `incarnation`, the etcd create revision of the definition it
//! copies, so that a copy of a deleted stream is told from a new stream of the same name). Creation is atomic create-if-absent (write a temporary file, fsync, hard-link it
//! to the final name, fsync the directory), so two cores auto-creating the same stream agree on
//! one definition. These are rare control-path operations done with blocking std::fs calls on
//! small files; the hot path never touches them.
//!
//! [`TenantQuota`] counts streams per tenant (from the definitions on disk, once, then in
//! memory) and refuses a create past `--max-streams-per-tenant`; one per process, shared by
//! every core.
//!
//! `<data>/layout` records the core count the shards were laid out for: shard `s` of every
//! stream lives on core `s % cores`, so a restart with another core count would lose track of
//! shards and is refused.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use felix_proto::{Retention, StreamName};

/// A stream's definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamMeta {
    /// `tenant/namespace/stream`.
    pub name: StreamName,
    /// Shard count.
    pub shards: u32,
    /// Retention.
    pub retention: Retention,
}

/// Errors of the metadata files.
#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// An I/O error on a metadata file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A metadata file does not parse.
    #[error("{path}: corrupt metadata: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The data directory was laid out for another core count.
    #[error(
        "{path}: data directory was laid out for {found} cores but the broker runs {wanted}; \
         start with --cores {found}"
    )]
    CoreCount {
        /// The layout file.
        path: PathBuf,
        /// Cores recorded.
        found: usize,
        /// Cores configured.
        wanted: usize,
    },
    /// A stream of that name is being deleted: it can be created again once that is done.
    #[error("stream {name} is being deleted; create it again once that is done")]
    BeingDeleted {
        /// The stream.
        name: String,
    },
    /// The tenant has as many streams as `--max-streams-per-tenant` allows.
    #[error("tenant {tenant} has {limit} streams, the most allowed (--max-streams-per-tenant)")]
    TooManyStreams {
        /// The tenant.
        tenant: String,
        /// The quota.
        limit: u32,
    },
}

/// The per-tenant stream quota of one data directory.
///
/// The counts are read from the definitions on disk at the first create, then kept up to date
/// here; a create holds the lock across its file operations (a few small writes and fsyncs), so
/// two cores never both take a tenant's last slot. Creating is a rare control-path operation.
#[derive(Debug)]
pub struct TenantQuota {
    max_streams: u32,
    counts: Mutex<Option<HashMap<String, u32>>>,
    /// Streams being deleted ([`TenantQuota::begin_delete`]): not created again until done, so
    /// that no core of this broker starts a new stream of the name while another still serves
    /// the old one.
    deleting: Mutex<std::collections::HashSet<String>>,
}

impl TenantQuota {
    /// A quota of `max_streams` streams per tenant.
    pub fn new(max_streams: u32) -> Self {
        Self { max_streams, counts: Mutex::new(None), deleting: Mutex::default() }
    }

    /// Creates `meta` unless the stream exists (as [`create`] does), refusing with
    /// [`MetaError::TooManyStreams`] when its tenant has its quota of streams already.
    pub fn create(
        &self,
        data_dir: &Path,
        meta: &StreamMeta,
        incarnation: Option<i64>,
    ) -> Result<(StreamMeta, bool), MetaError> {
        // A panic elsewhere while holding the lock leaves the counts as they were: still valid.
        let mut guard = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if self.being_deleted(&meta.name) {
            return Err(MetaError::BeingDeleted { name: meta.name.as_str().to_owned() });
        }
        if let Some(found) = load(data_dir, &meta.name)? {
            return Ok((found, false));
        }
        let counts = match &mut *guard {
            Some(counts) => counts,
            empty => empty.insert(count_by_tenant(data_dir)?),
        };
        let tenant = meta.name.tenant();
        let have = counts.get(tenant).copied().unwrap_or(0);
        if have >= self.max_streams {
            return Err(MetaError::TooManyStreams {
                tenant: tenant.to_owned(),
                limit: self.max_streams,
            });
        }
        let (found, created) = create(data_dir, meta, incarnation)?;
        if created {
            *counts.entry(tenant.to_owned()).or_default() += 1;
        }
        Ok((found, created))
    }

    /// Starts deleting `name` (as [`begin_delete`] does) and gives its tenant the slot back.
    /// Returns whether it was defined.
    pub fn begin_delete(&self, data_dir: &Path, name: &StreamName) -> Result<bool, MetaError> {
        let mut guard = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        self.deleting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.as_str().to_owned());
        let removed = begin_delete(data_dir, name)?;
        if let (true, Some(counts)) = (removed, &mut *guard) {
            if let Some(n) = counts.get_mut(name.tenant()) {
                *n = n.saturating_sub(1);
            }
        }
        Ok(removed)
    }
}

fn count_by_tenant(data_dir: &Path) -> Result<HashMap<String, u32>, MetaError> {
    let mut counts: HashMap<String, u32> = HashMap::new();
    for m in load_all(data_dir)? {
        *counts.entry(m.name.tenant().to_owned()).or_default() += 1;
    }
    Ok(counts)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> MetaError + '_ {
    move |source| MetaError::Io { path: path.to_owned(), source }
}

/// Checks (or writes, on first start) the layout file.
pub fn check_layout(data_dir: &Path, cores: usize) -> Result<(), MetaError> {
    std::fs::create_dir_all(data_dir.join("streams")).map_err(io_err(data_dir))?;
    let path = data_dir.join("layout");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let found = text
                .lines()
                .find_map(|l| l.strip_prefix("cores = "))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| MetaError::Corrupt {
                    path: path.clone(),
                    why: "no cores line".into(),
                })?;
            if found != cores {
                return Err(MetaError::CoreCount { path, found, wanted: cores });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            write_durably(&path, format!("cores = {cores}\n").as_bytes())
        }
        Err(e) => Err(MetaError::Io { path, source: e }),
    }
}

/// Every stream defined in the data directory.
pub fn load_all(data_dir: &Path) -> Result<Vec<StreamMeta>, MetaError> {
    let dir = data_dir.join("streams");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
        let path = entry.map_err(io_err(&dir))?.path();
        if path.extension().and_then(|e| e.to_str()) == Some("meta") {
            out.push(read(&path)?);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Loads one stream's definition, if it exists.
pub fn load(data_dir: &Path, name: &StreamName) -> Result<Option<StreamMeta>, MetaError> {
    let path = meta_path(data_dir, name)?;
    match std::fs::metadata(&path) {
        Ok(_) => read(&path).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(MetaError::Io { path, source: e }),
    }
}

/// The incarnation recorded in `name`'s definition (a cluster's copy), if any.
pub fn incarnation(data_dir: &Path, name: &StreamName) -> Result<Option<i64>, MetaError> {
    let path = meta_path(data_dir, name)?;
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text
            .lines()
            .find_map(|l| l.strip_prefix("incarnation = "))
            .and_then(|v| v.trim().parse().ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(MetaError::Io { path, source: e }),
    }
}

impl TenantQuota {
    /// Ends a delete [`TenantQuota::begin_delete`] began (as [`finish_delete`] does): the name
    /// may be created again.
    pub fn finish_delete(&self, data_dir: &Path, name: &StreamName) -> Result<(), MetaError> {
        let done = finish_delete(data_dir, name);
        self.deleting.lock().unwrap_or_else(PoisonError::into_inner).remove(name.as_str());
        done
    }

    fn being_deleted(&self, name: &StreamName) -> bool {
        self.deleting.lock().unwrap_or_else(PoisonError::into_inner).contains(name.as_str())
    }
}

/// Suffix of a definition whose stream is being deleted.
const DELETING_SUFFIX: &str = ".deleting";

/// The first step of deleting `name`: its definition is renamed `<definition>.deleting`
/// (durably), so that nothing opens the stream again, while its logs are deleted; then
/// [`finish_delete`]. A start-up that finds such a file finishes the delete
/// ([`interrupted_deletes`]): a crash in between leaves no log directory without a
/// definition, which a new stream of that name would otherwise open. `false` when `name` was
/// not defined.
pub fn begin_delete(data_dir: &Path, name: &StreamName) -> Result<bool, MetaError> {
    let path = meta_path(data_dir, name)?;
    let deleting = deleting_path(&path);
    match std::fs::rename(&path, &deleting) {
        Ok(()) => {
            sync_dir(path.parent().unwrap_or(data_dir))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(MetaError::Io { path, source: e }),
    }
}

/// The last step of deleting `name`, once its logs are gone: its `.deleting` definition
/// goes.
pub fn finish_delete(data_dir: &Path, name: &StreamName) -> Result<(), MetaError> {
    let deleting = deleting_path(&meta_path(data_dir, name)?);
    match std::fs::remove_file(&deleting) {
        Ok(()) => sync_dir(deleting.parent().unwrap_or(data_dir)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(MetaError::Io { path: deleting, source: e }),
    }
}

/// The streams whose delete was interrupted (a `.deleting` definition is left).
pub fn interrupted_deletes(data_dir: &Path) -> Result<Vec<StreamMeta>, MetaError> {
    let dir = data_dir.join("streams");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(io_err(&dir))? {
        let path = entry.map_err(io_err(&dir))?.path();
        if path.to_string_lossy().ends_with(DELETING_SUFFIX) {
            out.push(read(&path)?);
        }
    }
    Ok(out)
}

fn deleting_path(meta: &Path) -> PathBuf {
    let mut s = meta.as_os_str().to_owned();
    s.push(DELETING_SUFFIX);
    PathBuf::from(s)
}

/// Replaces an existing definition by `meta` (an altered retention), keeping its
/// incarnation: a temporary file, fsynced, renamed over it, the directory fsynced.
pub fn replace(data_dir: &Path, meta: &StreamMeta) -> Result<(), MetaError> {
    let incarnation = incarnation(data_dir, &meta.name)?;
    let path = meta_path(data_dir, &meta.name)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id() ^ rand::random::<u32>()));
    if let Err(e) = write_file(&tmp, meta_text(meta, incarnation).as_bytes()) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
    sync_dir(path.parent().unwrap_or(data_dir))
}

fn meta_text(meta: &StreamMeta, incarnation: Option<i64>) -> String {
    let mut text = format!(
        "name = {}\nshards = {}\nretention_bytes = {}\nretention_ms = {}\n",
        meta.name,
        meta.shards,
        meta.retention.bytes_max.unwrap_or(0),
        meta.retention.age_max_ms.unwrap_or(0)
    );
    if let Some(i) = incarnation {
        text.push_str(&format!("incarnation = {i}\n"));
    }
    text
}

/// Creates `meta` unless the stream exists; returns the definition in force.
pub fn create(
    data_dir: &Path,
    meta: &StreamMeta,
    incarnation: Option<i64>,
) -> Result<(StreamMeta, bool), MetaError> {
    let path = meta_path(data_dir, &meta.name)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id() ^ rand::random::<u32>()));
    let text = meta_text(meta, incarnation);
    if let Err(e) = write_file(&tmp, text.as_bytes()) {
        // A full disk fails here: leave no temporary file behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(path.parent().unwrap_or(data_dir))?;
            Ok((meta.clone(), true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok((read(&path)?, false)),
        Err(e) => Err(MetaError::Io { path, source: e }),
    }
}

/// Where `name`'s definition lives: `streams/<storage directory name>.meta`, bounded for every
/// valid name. A definition written by an older broker under the hex of the name is used
/// where it exists, so a data directory keeps its streams across the upgrade.
fn meta_path(data_dir: &Path, name: &StreamName) -> Result<PathBuf, MetaError> {
    let streams = data_dir.join("streams");
    let hex: String = name.as_str().bytes().map(|b| format!("{b:02x}")).collect();
    if hex.len() + META_SUFFIX.len() <= FILE_NAME_BYTES_MAX {
        let legacy = streams.join(format!("{hex}{META_SUFFIX}"));
        if legacy.exists() {
            return Ok(legacy);
        }
    }
    let stem = felix_storage::stream_dir_name(name.as_str())
        .map_err(|e| MetaError::Corrupt { path: streams.clone(), why: e.to_string() })?;
    Ok(streams.join(format!("{stem}{META_SUFFIX}")))
}

/// Suffix of stream definition files.
const META_SUFFIX: &str = ".meta";
/// The longest file name the file systems we run on take.
const FILE_NAME_BYTES_MAX: usize = 255;

fn read(path: &Path) -> Result<StreamMeta, MetaError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    let corrupt = |why: &str| MetaError::Corrupt { path: path.to_owned(), why: why.to_owned() };
    let get = |key: &str| {
        text.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(" = ")))
    };
    let num = |key: &str| -> Result<u64, MetaError> {
        get(key).and_then(|v| v.trim().parse().ok()).ok_or_else(|| corrupt(key))
    };
    let name = StreamName::parse(get("name").ok_or_else(|| corrupt("name"))?.trim())
        .map_err(|e| corrupt(&e.to_string()))?;
    let shards = u32::try_from(num("shards")?).map_err(|_| corrupt("shards"))?;
    if shards == 0 || shards > felix_proto::limits::MAX_SHARDS_PER_STREAM {
        return Err(corrupt("shards out of range"));
    }
    let (b, a) = (num("retention_bytes")?, num("retention_ms")?);
    Ok(StreamMeta {
        name,
        shards,
        retention: Retention {
            bytes_max: (b != 0).then_some(b),
            age_max_ms: (a != 0).then_some(a),
        },
    })
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), MetaError> {
    let mut f = std::fs::File::create(path).map_err(io_err(path))?;
    f.write_all(data).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

fn write_durably(path: &Path, data: &[u8]) -> Result<(), MetaError> {
    let tmp = path.with_extension("tmp");
    write_file(&tmp, data)?;
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

fn sync_dir(dir: &Path) -> Result<(), MetaError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(shards: u32) -> StreamMeta {
        StreamMeta {
            name: StreamName::parse("t/n/s").unwrap(),
            shards,
            retention: Retention { bytes_max: Some(10), age_max_ms: None },
        }
    }

    #[test]
    fn create_is_create_if_absent() {
        let dir = tempfile::tempdir().unwrap();
        check_layout(dir.path(), 2).unwrap();
        assert_eq!(create(dir.path(), &meta(4), None).unwrap(), (meta(4), true));
        // A second create with other settings gets the first definition back.
        assert_eq!(create(dir.path(), &meta(8), None).unwrap(), (meta(4), false));
        assert_eq!(load_all(dir.path()).unwrap(), vec![meta(4)]);
        assert_eq!(load(dir.path(), &meta(4).name).unwrap(), Some(meta(4)));
    }

    #[test]
    fn the_tenant_quota_counts_streams_on_disk_and_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        check_layout(dir.path(), 1).unwrap();
        let named = |n: &str| StreamMeta { name: StreamName::parse(n).unwrap(), ..meta(1) };
        // One stream of tenant t exists before the quota is first used.
        create(dir.path(), &named("t/n/a"), None).unwrap();
        let quota = TenantQuota::new(2);
        assert!(quota.create(dir.path(), &named("t/n/b"), None).unwrap().1);
        match quota.create(dir.path(), &named("t/n/c"), None) {
            Err(MetaError::TooManyStreams { tenant, limit: 2 }) => assert_eq!(tenant, "t"),
            other => panic!("expected TooManyStreams, got {other:?}"),
        }
        // An existing stream is found, not counted; other tenants have their own quota.
        assert_eq!(
            quota.create(dir.path(), &named("t/n/a"), None).unwrap(),
            (named("t/n/a"), false)
        );
        assert!(quota.create(dir.path(), &named("u/n/a"), None).unwrap().1);
        assert!(quota.create(dir.path(), &named("u/n/b"), None).unwrap().1);
        assert!(quota.create(dir.path(), &named("u/n/c"), None).is_err());
        // A fresh quota (a restart) counts the streams on disk.
        assert!(TenantQuota::new(2).create(dir.path(), &named("t/x/y"), None).is_err());
        assert!(TenantQuota::new(3).create(dir.path(), &named("t/x/y"), None).unwrap().1);
    }

    #[test]
    fn remove_replace_and_incarnation() {
        let dir = tempfile::tempdir().unwrap();
        check_layout(dir.path(), 1).unwrap();
        let quota = TenantQuota::new(1);
        assert!(quota.create(dir.path(), &meta(4), Some(17)).unwrap().1);
        assert_eq!(incarnation(dir.path(), &meta(4).name).unwrap(), Some(17));
        // An altered retention keeps the incarnation.
        let altered = StreamMeta { retention: Retention::default(), ..meta(4) };
        replace(dir.path(), &altered).unwrap();
        assert_eq!(load(dir.path(), &altered.name).unwrap(), Some(altered.clone()));
        assert_eq!(incarnation(dir.path(), &altered.name).unwrap(), Some(17));
        // Removing gives the tenant its slot back; a second remove finds nothing.
        assert!(quota
            .create(
                dir.path(),
                &StreamMeta { name: StreamName::parse("t/n/x").unwrap(), ..meta(1) },
                None
            )
            .is_err());
        assert!(quota.begin_delete(dir.path(), &altered.name).unwrap());
        assert!(!quota.begin_delete(dir.path(), &altered.name).unwrap());
        assert_eq!(load(dir.path(), &altered.name).unwrap(), None);
        assert_eq!(
            load_all(dir.path()).unwrap(),
            Vec::new(),
            "a stream being deleted is not listed"
        );
        assert_eq!(incarnation(dir.path(), &altered.name).unwrap(), None);
        // Until its logs are gone, a start-up finds the delete to finish, and the name is not
        // created again.
        assert_eq!(interrupted_deletes(dir.path()).unwrap(), vec![altered.clone()]);
        assert!(matches!(
            quota.create(dir.path(), &altered, None),
            Err(MetaError::BeingDeleted { .. })
        ));
        quota.finish_delete(dir.path(), &altered.name).unwrap();
        assert_eq!(interrupted_deletes(dir.path()).unwrap(), Vec::new());
        assert!(
            quota
                .create(
                    dir.path(),
                    &StreamMeta { name: StreamName::parse("t/n/x").unwrap(), ..meta(1) },
                    None
                )
                .unwrap()
                .1
        );
    }

    #[test]
    fn layout_refuses_another_core_count() {
        let dir = tempfile::tempdir().unwrap();
        check_layout(dir.path(), 2).unwrap();
        check_layout(dir.path(), 2).unwrap();
        let err = check_layout(dir.path(), 4).unwrap_err().to_string();
        assert!(err.contains("laid out for 2 cores"), "{err}");
    }
}
