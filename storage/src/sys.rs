//! What the crate needs from below safe Rust: the syscalls glommio does not offer, each
//! behind a safe wrapper, and the one call into CPU-specific code.
//!
//! Every file operation goes through glommio (io_uring) and directory listing uses
//! `std::fs`; the one syscall made here is `statvfs(2)`, which neither offers. It goes
//! through rustix's safe wrapper. The crate's one `unsafe` block is [`copy_crc32c`]'s call of
//! the SSE4.2 copy-and-CRC kernel (`crate::crc`), after checking that the CPU has SSE4.2.

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

/// `raw` (the CRC32C register, not inverted) extended over `src` while `src` is copied to
/// `dst` (equal lengths), in one pass, by the SSE4.2 kernel; `None` (nothing copied) on a CPU
/// without SSE4.2 or another architecture, where the caller copies and uses the `crc32c` crate.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub(crate) fn copy_crc32c(dst: &mut [u8], src: &[u8], raw: u32) -> Option<u32> {
    // std caches the CPUID answer: after the first call, this is one relaxed load.
    if !std::arch::is_x86_feature_detected!("sse4.2") {
        return None;
    }
    let shifts = crate::crc::shifts();
    // SAFETY: the kernel's only requirement is the `sse4.2` target feature it is compiled
    // with, and the CPU has it (checked just above); it touches memory only through the two
    // slices it is given.
    Some(unsafe { crate::crc::copy_raw_sse42(dst, src, raw, shifts) })
}

/// Not x86-64: no kernel, the caller copies and uses the `crc32c` crate.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn copy_crc32c(_dst: &mut [u8], _src: &[u8], _raw: u32) -> Option<u32> {
    None
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
