//! `--use_dmabuf`: each side's buffer is a dma-buf, registered with `Pd::register_dmabuf`
//! (`ibv_reg_dmabuf_mr`), as perftest's `--use_cuda_dmabuf`, `--use_rocm_dmabuf`,
//! `--use_neuron_dmabuf` and `--use_ib_dm_dmabuf` register theirs. bfperf links no GPU
//! runtime: the dma-buf comes from an exporter every machine has.
//!
//! - On the software NIC: a `SimDmaBuf` beside the device (the crate's exporter; its bytes
//!   are read and written through it, the region has no CPU view).
//! - On an RDMA device: the kernel's udmabuf driver (`/dev/udmabuf`, `UDMABUF_CREATE` over
//!   a sealed memfd): host pages exported as a dma-buf. The registration is the device's
//!   dma-buf path all the same; a device or provider without it (rdma-core's rxe and siw
//!   providers have no `reg_dmabuf_mr`: `EOPNOTSUPP`) refuses it, typed
//!   (`Error::Capability(Capability::DmaBuf)`).
//!
//! The ioctl FFI of this crate lives here, in [`Udmabuf::create`], and nowhere else.
//!
//! Without `/dev/udmabuf` the device is asked whether it registers dma-bufs at all
//! ([`device_lacks_dmabuf`]): a device that does not (rxe, siw) is refused for that, the
//! missing thing a udmabuf would not supply; one that does, for the missing udmabuf.

use blueflame::{Access, Device, Error, MemoryRegion, Pd, Result, SimDmaBuf};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The kernel's udmabuf device.
pub const UDMABUF_DEV: &str = "/dev/udmabuf";

/// What the dma-buf came from.
#[derive(Debug)]
pub enum DmaBuf {
    /// The software NIC's exporter.
    Sim(SimDmaBuf),
    /// The kernel's udmabuf over a memfd.
    Udmabuf(Udmabuf),
}

impl DmaBuf {
    /// The dma-buf's file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match self {
            DmaBuf::Sim(s) => s.fd(),
            DmaBuf::Udmabuf(u) => u.dmabuf.as_fd(),
        }
    }

    /// Reads bytes at `offset` through the exporter (the region itself has no CPU view):
    /// how the tests see that messages landed in the dma-buf.
    #[cfg_attr(not(test), allow(dead_code))]
    ///
    /// # Errors
    /// A range outside the buffer; the memfd's read error.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        match self {
            DmaBuf::Sim(s) => s.read(offset, out),
            DmaBuf::Udmabuf(u) => u.memfd.read_exact_at(out, offset as u64).map_err(Error::Io),
        }
    }

    /// Writes bytes at `offset` through the exporter.
    ///
    /// # Errors
    /// As [`DmaBuf::read`].
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        match self {
            DmaBuf::Sim(s) => s.write(offset, data),
            DmaBuf::Udmabuf(u) => u.memfd.write_all_at(data, offset as u64).map_err(Error::Io),
        }
    }
}

/// A udmabuf: the memfd whose pages it exports (kept to read and write them) and the
/// dma-buf's descriptor.
#[derive(Debug)]
pub struct Udmabuf {
    memfd: File,
    dmabuf: OwnedFd,
}

/// `struct udmabuf_create` of `<linux/udmabuf.h>`.
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// `UDMABUF_FLAGS_CLOEXEC`.
const UDMABUF_FLAGS_CLOEXEC: u32 = 0x01;

/// `UDMABUF_CREATE`: `_IOW('u', 0x42, struct udmabuf_create)`.
const UDMABUF_CREATE: u64 =
    (1 << 30) | ((std::mem::size_of::<UdmabufCreate>() as u64) << 16) | ((b'u' as u64) << 8) | 0x42;

impl Udmabuf {
    /// `len` bytes (rounded up to whole pages, as udmabuf wants) of a new memfd, sealed
    /// against shrinking (udmabuf requires `F_SEAL_SHRINK`), exported by the udmabuf
    /// device at `dev`.
    ///
    /// # Errors
    /// `Error::Unsupported` when `dev` does not exist (no udmabuf driver: the message names
    /// it); `Error::Io` naming the step for any other failure (memfd, seal, open,
    /// `UDMABUF_CREATE`).
    pub fn create(dev: &Path, len: usize) -> Result<Udmabuf> {
        let step = |what: &str, e: std::io::Error| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("--use_dmabuf: {what}: {e}"),
            ))
        };
        let page = crate::mmap_file::page_size() as usize;
        let size = len.max(1).next_multiple_of(page);
        let udmabuf = match std::fs::OpenOptions::new().read(true).write(true).open(dev) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Unsupported(
                    "--use_dmabuf on an RDMA device: /dev/udmabuf is missing (the kernel's \
                     udmabuf driver, CONFIG_UDMABUF; try `modprobe udmabuf`), bfperf's \
                     exporter of dma-bufs there",
                ))
            }
            Err(e) => return Err(step(&format!("open {}", dev.display()), e)),
        };
        let memfd = memfd(c"bfperf-udmabuf", libc::MFD_ALLOW_SEALING)
            .map_err(|e| step("memfd_create", e))?;
        memfd
            .set_len(size as u64)
            .map_err(|e| step("ftruncate of the memfd", e))?;
        // SAFETY: F_ADD_SEALS on a descriptor this function owns; the argument is a flag
        // word, no pointer.
        let sealed = unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&memfd),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK,
            )
        };
        if sealed < 0 {
            return Err(step(
                "F_SEAL_SHRINK on the memfd",
                std::io::Error::last_os_error(),
            ));
        }
        let mut arg = UdmabufCreate {
            memfd: std::os::fd::AsRawFd::as_raw_fd(&memfd) as u32,
            flags: UDMABUF_FLAGS_CLOEXEC,
            offset: 0,
            size: size as u64,
        };
        // SAFETY: UDMABUF_CREATE on an open udmabuf device reads one `struct
        // udmabuf_create` (this `#[repr(C)]` copy of it, alive for the call) and returns a
        // new descriptor or -1; it keeps no pointer.
        let fd = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&udmabuf),
                UDMABUF_CREATE as _,
                &mut arg as *mut UdmabufCreate,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(step(
                &format!(
                    "UDMABUF_CREATE of {size} bytes (the driver's size_limit_mb parameter caps \
                     a buffer, 64 MiB by default; a buffer is 2 x the message + 64 bytes per QP)"
                ),
                e,
            ));
        }
        // SAFETY: `fd` is the dma-buf descriptor the ioctl just returned, owned by nobody
        // else.
        let dmabuf = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Udmabuf { memfd, dmabuf })
    }
}

/// Where `--use_dmabuf` takes its dma-bufs from on `dev`, for the header.
pub fn exporter(dev: &Device) -> &'static str {
    match dev.nic() {
        Some(_) => "the software NIC's exporter (SimDmaBuf)",
        None => "udmabuf (host pages of a sealed memfd, /dev/udmabuf)",
    }
}

/// A new memory file (`memfd_create`, close-on-exec, with `flags` besides).
fn memfd(name: &std::ffi::CStr, flags: libc::c_uint) -> std::io::Result<File> {
    // SAFETY: the name is a NUL-terminated string that outlives the call; the flags are
    // memfd_create's.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | flags) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor memfd_create just returned, owned by nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(raw) }))
}

/// With no dma-buf to register (no udmabuf), whether the device could register one at
/// all: `ibv_reg_dmabuf_mr` asked with a descriptor that is no dma-buf (a memfd), which a
/// device with dma-buf registration turns down for the descriptor (`EINVAL` from the
/// kernel's `dma_buf_get`) and one without it for itself (rdma-core's `EOPNOTSUPP`, as its
/// rxe and siw providers answer: `Error::Capability(Capability::DmaBuf)`). That refusal is
/// the one to report: a udmabuf would not help such a device.
fn device_lacks_dmabuf(pd: &Pd, rights: Access) -> Option<Error> {
    let memfd = memfd(c"bfperf-dmabuf-probe", 0).ok()?;
    let page = crate::mmap_file::page_size() as usize;
    memfd.set_len(page as u64).ok()?;
    match pd.register_dmabuf(memfd.as_fd(), 0, page, iova(0), rights) {
        Err(e @ Error::Capability(blueflame::Capability::DmaBuf)) => Some(e),
        _ => None,
    }
}

/// Where side `which`'s dma-buf region starts in the device's address space (its iova):
/// any address will do (requests name it with the region's key), one apart per side of a
/// process so that the two sides' addresses never look alike.
fn iova(which: u64) -> u64 {
    0x7f00_0000_0000 + (which << 36)
}

/// A dma-buf of `len` bytes beside `dev` (the software NIC's exporter, or udmabuf on an
/// RDMA device), registered in `pd` with `rights`; `which` as in `setup::side`.
///
/// # Errors
/// The exporter's (udmabuf missing, said by name); the registration's
/// (`Error::Capability(Capability::DmaBuf)` where the device has no dma-buf path).
pub fn region(
    dev: &Device,
    pd: &Pd,
    len: usize,
    which: u64,
    rights: Access,
) -> Result<(MemoryRegion, DmaBuf)> {
    let buf = match dev.nic() {
        Some(_) => DmaBuf::Sim(SimDmaBuf::new(dev, len)?),
        None => match Udmabuf::create(Path::new(UDMABUF_DEV), len) {
            Ok(u) => DmaBuf::Udmabuf(u),
            Err(e) => return Err(device_lacks_dmabuf(pd, rights).unwrap_or(e)),
        },
    };
    let mr = pd.register_dmabuf(buf.fd(), 0, len, iova(which), rights)?;
    Ok((mr, buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ioctl number is the kernel's (`_IOW('u', 0x42, struct udmabuf_create)`, a
    /// 24-byte argument).
    #[test]
    fn udmabuf_create_is_the_kernels_number() {
        assert_eq!(std::mem::size_of::<UdmabufCreate>(), 24);
        assert_eq!(UDMABUF_CREATE, 0x4018_7542);
    }

    /// No udmabuf device: refused, typed, naming what is missing.
    #[test]
    fn a_missing_udmabuf_device_is_named() {
        let e = Udmabuf::create(Path::new("/nonexistent/udmabuf"), 4096).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("/dev/udmabuf") && text.contains("modprobe udmabuf"),
            "{text}"
        );
    }

    /// On the software NIC the region is the exporter's: bytes written through the
    /// exporter are read back through it, and the region has no CPU view.
    #[test]
    fn the_software_nic_exports_its_own() {
        let dev = Device::sim();
        let pd = dev.alloc_pd().unwrap();
        let (mr, buf) = region(&dev, &pd, 8192, 1, Access::LOCAL_WRITE).unwrap();
        assert!(matches!(buf, DmaBuf::Sim(_)));
        assert_eq!((mr.addr(), mr.len()), (iova(1), 8192));
        buf.write(100, b"dma").unwrap();
        let mut got = [0u8; 3];
        buf.read(100, &mut got).unwrap();
        assert_eq!(&got, b"dma");
        assert!(mr.read(100, &mut got).is_err());
    }
}
