//! perftest's `--mmap=FILE` / `--mmap-offset=N`: a side's buffer is `len` bytes of a file,
//! mapped shared and writable at an offset (perftest's `mmap_memory.c`: the file opened
//! read-write, `mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset)`), then
//! registered as a user-memory region (`blueflame::RegionBuffer`).

use blueflame::{Error, RawParts, RegionBuffer, Result};
use std::path::Path;
use std::ptr::NonNull;

/// `len` bytes of a file at an offset, mapped shared and writable.
#[derive(Debug)]
pub struct FileWindow {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is an address and a length, usable from any thread; while registered
// its bytes are touched only through the region (atomics) and by the device.
unsafe impl Send for FileWindow {}

/// The system's page size (an `--mmap-offset` must be a multiple of it, as `mmap` wants).
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a system constant; it takes no pointer.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096).max(1)
}

impl FileWindow {
    /// Maps `len` bytes of `path` from `offset` and zeroes them (perftest overwrites its
    /// buffers too; bfperf's tests start from zeros).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for an offset that is not a multiple of the page size
    /// or a file shorter than `offset + len` (touching a page past its end would raise
    /// `SIGBUS`); [`Error::Io`], naming the file, where it cannot be opened read-write or
    /// mapped.
    pub fn map(path: &Path, offset: u64, len: usize) -> Result<FileWindow> {
        use std::os::fd::AsRawFd;
        let named = |e: std::io::Error| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("--mmap {}: {e}", path.display()),
            ))
        };
        if !offset.is_multiple_of(page_size()) {
            return Err(Error::InvalidParameter {
                what: "--mmap-offset: not a multiple of the page size",
                value: offset,
            });
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(named)?;
        let flen = file.metadata().map_err(named)?.len();
        let end = offset.saturating_add(len as u64);
        if len == 0 || flen < end || len > isize::MAX as usize {
            eprintln!(
                "bfperf: --mmap {}: {flen} bytes, the buffer needs {end} (--mmap-offset {offset} + {len})",
                path.display()
            );
            return Err(Error::InvalidParameter {
                what: "--mmap: the file is shorter than --mmap-offset plus the buffer (said above)",
                value: end,
            });
        }
        let off = libc::off_t::try_from(offset).map_err(|_| Error::InvalidParameter {
            what: "--mmap-offset",
            value: offset,
        })?;
        // SAFETY: a fresh shared mapping of an open file at an address the kernel chooses;
        // the file covers every mapped byte (checked above).
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(named(std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::Unsupported("mmap returned 0"))?;
        // SAFETY: the `len` bytes at `ptr` were just mapped writable, and nothing else
        // refers to them yet.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(FileWindow { ptr, len })
    }
}

impl Drop for FileWindow {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length, unmapped once (a registered window is
        // rebuilt by `from_raw` only after its registration is gone).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping stays at `ptr` until `from_raw` rebuilds the value (only its drop
// unmaps it); it is writable; nothing but the region touches it meanwhile (the value is
// given up whole).
unsafe impl RegionBuffer for FileWindow {
    fn into_raw(self) -> RawParts {
        let me = std::mem::ManuallyDrop::new(self);
        RawParts {
            ptr: me.ptr,
            len: me.len,
            extra: 0,
            writable: true,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        FileWindow {
            ptr: p.ptr,
            len: p.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_the_files_bytes_zeroed_and_refused_where_it_cannot_be() {
        let dir = std::env::temp_dir().join(format!("bfperf-mmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("buf");
        let page = page_size() as usize;
        std::fs::write(&f, vec![0xeeu8; 3 * page]).unwrap();
        let w = FileWindow::map(&f, page as u64, 100).expect("map");
        drop(w);
        let bytes = std::fs::read(&f).unwrap();
        assert!(bytes[..page].iter().all(|&b| b == 0xee));
        assert!(bytes[page..page + 100].iter().all(|&b| b == 0));
        assert!(bytes[page + 100..].iter().all(|&b| b == 0xee));
        let e = FileWindow::map(&f, 1, 100).unwrap_err();
        assert!(format!("{e}").contains("page size"), "{e}");
        let e = FileWindow::map(&f, 2 * page as u64, page + 1).unwrap_err();
        assert!(format!("{e}").contains("shorter"), "{e}");
        let e = FileWindow::map(&dir.join("none"), 0, 100).unwrap_err();
        assert!(format!("{e}").contains("none"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
