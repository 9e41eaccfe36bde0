//! Raw syscalls and `unsafe` of this crate live here, each with a `// SAFETY:` comment.
//!
//! Every file operation goes through glommio (io_uring) and directory listing uses
//! `std::fs`; the one syscall made here is `statvfs(2)`, which neither offers.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
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
// The field types of `statvfs` differ between platforms (u32 or u64): the casts are needed
// on some.
#[allow(clippy::unnecessary_cast)]
pub fn fs_space(path: &Path) -> io::Result<FsSpace> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: `statvfs` is plain old data (integers only): the all-zero bit pattern is a
    // valid value, and the kernel overwrites it.
    let mut out: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string that lives across the call, and `out` is a
    // valid, exclusively borrowed `statvfs` the kernel writes into; nothing is retained.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut out) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let unit = (out.f_frsize as u64).max(1);
    Ok(FsSpace {
        total_bytes: (out.f_blocks as u64).saturating_mul(unit),
        available_bytes: (out.f_bavail as u64).saturating_mul(unit),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_of_a_directory_reports_a_file_system() {
        let dir = std::env::temp_dir();
        let s = fs_space(&dir).unwrap();
        assert!(s.total_bytes > 0);
        assert!(s.available_bytes <= s.total_bytes);
        let missing = dir.join("felix-no-such-directory").join("x");
        assert_eq!(fs_space(&missing).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
