//! The data directory's lock: an exclusive `flock(2)` on `<data-dir>/felix.lock`, held for the
//! broker's life, so that two brokers never share one data directory (each would recover,
//! append to and truncate the other's logs).
//!
//! `flock` locks belong to the open file description, so a second broker in the same process
//! (tests start several) conflicts with the first as a second process does, and the kernel
//! drops the lock when the holder exits, however it exits (kill -9 included): a stale lock
//! file never blocks a restart.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "felix.lock";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process (or another broker in this process) holds the lock.
    #[error(
        "data directory {} is in use by another broker (pid {holder}, lock file {}); \
         stop it or give this broker its own --data-dir",
        dir.display(),
        file.display()
    )]
    Held {
        /// The data directory.
        dir: PathBuf,
        /// The lock file.
        file: PathBuf,
        /// What the holder wrote in the lock file: its pid, or `unknown`.
        holder: String,
    },
    /// The lock file cannot be opened or locked.
    #[error("cannot lock data directory {} ({}): {source}", dir.display(), file.display())]
    Io {
        /// The data directory.
        dir: PathBuf,
        /// The lock file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// An exclusive lock on a data directory, released when dropped (or when the process exits).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock on `dir` (which must exist) without waiting, and writes this process's
    /// pid into the lock file.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io { dir: dir.to_owned(), file: path.clone(), source };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: `flock` takes a file descriptor and flags; the descriptor is open (owned by
        // `file`, alive for this call) and no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() { "unknown" } else { holder };
                return Err(LockError::Held {
                    dir: dir.to_owned(),
                    file: path.clone(),
                    holder: holder.to_owned(),
                });
            }
            return Err(io(err));
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataDirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_directory_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let pid = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        match DataDirLock::acquire(dir.path()) {
            Err(LockError::Held { holder, dir: d, .. }) => {
                assert_eq!(holder, std::process::id().to_string());
                assert_eq!(d, dir.path());
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        let again = DataDirLock::acquire(dir.path());
        assert!(again.is_ok(), "{again:?}");
    }
}
