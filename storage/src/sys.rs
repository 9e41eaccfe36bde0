//! The syscalls glommio does not offer, each behind a safe wrapper.
//!
//! Every file operation goes through glommio (io_uring) and directory listing uses
//! `std::fs`; the one syscall made here is `statvfs(2)`, which neither offers. It goes
//! through rustix's safe wrapper, so this crate has no `unsafe` of its own.

use std::io;
use std::path::Path;

/// Size and free space of a file system, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsSpace {
    /// Size of the file system.
    pub total_bytes: u64,
    /// Bytes an unprivileged writer may still allocate (`f_bavail`: the blocks reserved for
    /// root are not counted, as the broker should not live off them).
    pub available_bytes: u64,
}

/// The size and free space of the file system holding `path` (one `statvfs(2)`).
///
/// A blocking syscall that reads the super block's counters (no I/O on local file systems,
/// microseconds); call it from a periodic task or a control path, never per record.
pub fn fs_space(path: &Path) -> io::Result<FsSpace> {
    // A path with a NUL byte cannot be passed to the kernel: rustix answers EINVAL, which
    // reads as `InvalidInput`.
    let out = rustix::fs::statvfs(path)?;
    let unit = out.f_frsize.max(1);
    Ok(FsSpace {
        total_bytes: out.f_blocks.saturating_mul(unit),
        available_bytes: out.f_bavail.saturating_mul(unit),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn statvfs_of_a_directory_reports_a_file_system() {
        let dir = std::env::temp_dir();
        let s = fs_space(&dir).unwrap();
        assert!(s.total_bytes > 0);
        assert!(s.available_bytes <= s.total_bytes);
        let missing = dir.join("felix-no-such-directory").join("x");
        assert_eq!(fs_space(&missing).unwrap_err().kind(), io::ErrorKind::NotFound);
        let nul = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/a\0b"));
        assert_eq!(fs_space(nul).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }
}
