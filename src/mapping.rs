//! Memory the crate maps for registration: huge pages (`MAP_HUGETLB`) and files (`mmap` of
//! a whole file). Both are [`RegionBuffer`]s: [`Pd::register`](crate::Pd::register) takes
//! them and [`MemoryRegion::into_buffer`](crate::MemoryRegion::into_buffer) gives them back.
//! Every OS call of the module is here (`mmap`, `munmap`).

use crate::error::{Error, Result};
use crate::resources::{RawParts, RegionBuffer};
use core::ptr::NonNull;

/// The page size of a [`HugePages`] mapping.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PageSize {
    /// The system's base pages (4 KiB on x86-64).
    Normal,
    /// 2 MiB huge pages (`MAP_HUGE_2MB`; reserved with `vm.nr_hugepages`).
    Huge2M,
    /// 1 GiB huge pages (`MAP_HUGE_1GB`; reserved in
    /// `/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages`).
    Huge1G,
}

impl PageSize {
    /// Bytes per page.
    pub fn bytes(self) -> usize {
        match self {
            PageSize::Normal => crate::resources::buffer::os_page_size(),
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// Where to reserve pages of this size (as root).
    pub(crate) fn sysctl(self) -> &'static str {
        match self {
            PageSize::Normal => "nothing (base pages need no reservation)",
            PageSize::Huge2M => {
                "sysctl vm.nr_hugepages=N (or /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)"
            }
            PageSize::Huge1G => {
                "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages (or hugepagesz=1G hugepages=N on the kernel command line)"
            }
        }
    }

    fn code(self) -> usize {
        match self {
            PageSize::Normal => 0,
            PageSize::Huge2M => 1,
            PageSize::Huge1G => 2,
        }
    }

    fn from_code(c: usize) -> PageSize {
        match c {
            1 => PageSize::Huge2M,
            2 => PageSize::Huge1G,
            _ => PageSize::Normal,
        }
    }
}

/// An anonymous private mapping of zeroed pages, huge or normal, unmapped on drop.
///
/// ```
/// use blueflame::mapping::{HugePages, PageSize};
/// use blueflame::Error;
/// // Huge pages when the system has them reserved, else normal pages: `page_size` says which.
/// let mem = match HugePages::new(1 << 20, PageSize::Huge2M) {
///     Err(Error::NoHugePages { .. }) => HugePages::new(1 << 20, PageSize::Normal),
///     r => r,
/// }
/// .unwrap();
/// assert!(mem.len() >= 1 << 20);
/// assert!(matches!(mem.page_size(), PageSize::Huge2M | PageSize::Normal));
/// ```
#[derive(Debug)]
pub struct HugePages {
    ptr: NonNull<u8>,
    /// Mapped bytes (a multiple of the page size).
    len: usize,
    page: PageSize,
}

// SAFETY: an owned mapping; its bytes are touched only through the region's atomics and
// the device (never through references), from any thread.
unsafe impl Send for HugePages {}

impl HugePages {
    /// Maps `len` bytes (rounded up to whole pages) of `page`-sized pages
    /// (`mmap(MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB/1GB)`). The kernel
    /// reserves huge pages when mapping, so a missing reservation fails here, not at first
    /// touch.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for `len == 0` or a length that overflows when rounded;
    /// [`Error::NoHugePages`] naming the sysctl when the system has no free pages of that
    /// size reserved (`ENOMEM`) or does not know the size (`EINVAL`); [`Error::Io`] for
    /// other `mmap` failures.
    pub fn new(len: usize, page: PageSize) -> Result<HugePages> {
        let size = page.bytes();
        let map_len = len
            .checked_next_multiple_of(size)
            .filter(|&l| l > 0 && l <= isize::MAX as usize)
            .ok_or(Error::InvalidParameter {
                what: "mapping length",
                value: len as u64,
            })?;
        let huge = match page {
            PageSize::Normal => 0,
            PageSize::Huge2M => libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            PageSize::Huge1G => libc::MAP_HUGETLB | libc::MAP_HUGE_1GB,
        };
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | huge,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EINVAL) if page != PageSize::Normal => {
                    Error::NoHugePages {
                        page_size: size as u64,
                        len: map_len as u64,
                        sysctl: page.sysctl(),
                    }
                }
                _ => Error::Io(e),
            });
        }
        Ok(HugePages {
            ptr: NonNull::new(p.cast()).ok_or(Error::Unsupported("mmap returned address 0"))?,
            len: map_len,
            page,
        })
    }

    /// The page size the mapping got.
    pub fn page_size(&self) -> PageSize {
        self.page
    }
    /// Mapped bytes (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length, unmapped once (a registered mapping is
        // not dropped before its registration is gone: `RegionBuffer`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping stays until `from_raw` rebuilds the value (its drop unmaps); `extra`
// keeps the page size (the length is a multiple of 4096, its low bits are free).
unsafe impl RegionBuffer for HugePages {
    fn into_raw(self) -> RawParts {
        let me = core::mem::ManuallyDrop::new(self);
        RawParts {
            ptr: me.ptr,
            len: me.len,
            extra: me.page.code(),
            writable: true,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        HugePages {
            ptr: p.ptr,
            len: p.len,
            page: PageSize::from_code(p.extra),
        }
    }
}

/// A whole file mapped, writable (`mmap(MAP_SHARED)`: writes reach the file) or read-only
/// (`MAP_PRIVATE`, never written), unmapped on drop. Registered read-only, it takes no
/// write rights ([`Error::ReadOnlyBuffer`]).
///
/// Other processes may write the file while it is mapped: their writes reach the region's
/// bytes as the device's do (the region's copies are atomic, so this is no data race for
/// this process). If the file is truncated below the mapping, touching the lost pages
/// raises `SIGBUS`, which kills the process: so [`MappedFile::map`] is `unsafe` (as
/// memmap2's `Mmap::map`), its caller promising that the file keeps its length.
/// Writable shared file mappings cannot be pinned by newer kernels (Linux 6.5 refuses
/// long-term write pins of file pages outside shmem/hugetlbfs): register them with
/// [`Access::ON_DEMAND`](crate::Access::ON_DEMAND) where the device has on-demand paging,
/// or map a file of tmpfs / hugetlbfs.
#[derive(Debug)]
pub struct MappedFile {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: as for HugePages.
unsafe impl Send for MappedFile {}

impl MappedFile {
    /// Maps the whole of `file` (its current length), writable when `writable` (the file
    /// must then be open for writing).
    ///
    /// # Safety
    /// The file must not be truncated below its length now, by this process or any other,
    /// while the mapping (or a region registered over it) lives: a read or write of the
    /// lost pages, by [`MemoryRegion::read`](crate::MemoryRegion::read) or the software
    /// NIC, raises `SIGBUS` (a safe `File::set_len` sufficed, a review found). A file of
    /// your own on tmpfs or hugetlbfs, or a memfd sealed with `F_SEAL_SHRINK`, keeps it.
    ///
    /// Not callable from safe code:
    ///
    /// ```compile_fail
    /// let f = std::fs::File::open("Cargo.toml").unwrap();
    /// let _ = blueflame::mapping::MappedFile::map(&f, false);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for an empty file; [`Error::Io`] from `metadata` or
    /// `mmap` (`EACCES` for a writable map of a file opened read-only).
    pub unsafe fn map(file: &std::fs::File, writable: bool) -> Result<MappedFile> {
        use std::os::fd::AsRawFd;
        let len = file.metadata().map_err(Error::Io)?.len();
        if len == 0 || len > isize::MAX as u64 {
            return Err(Error::InvalidParameter {
                what: "file length",
                value: len,
            });
        }
        // Read-only: a private map (never written, so it shows the file's pages; Linux 6.1
        // refuses to pin a read-only shared file map, EFAULT from ibv_reg_mr on rxe).
        let (prot, flags) = if writable {
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED)
        } else {
            (libc::PROT_READ, libc::MAP_PRIVATE)
        };
        // SAFETY: a fresh mapping of an open file at an address the kernel chooses.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len as usize,
                prot,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        Ok(MappedFile {
            ptr: NonNull::new(p.cast()).ok_or(Error::Unsupported("mmap returned address 0"))?,
            len: len as usize,
            writable,
        })
    }

    /// Mapped bytes (the file's length when mapped).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never: empty files are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length, unmapped once (after deregistration).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping stays until `from_raw` rebuilds the value; read-only maps say so.
unsafe impl RegionBuffer for MappedFile {
    fn into_raw(self) -> RawParts {
        let me = core::mem::ManuallyDrop::new(self);
        RawParts {
            ptr: me.ptr,
            len: me.len,
            extra: 0,
            writable: me.writable,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        MappedFile {
            ptr: p.ptr,
            len: p.len,
            writable: p.writable,
        }
    }
}
