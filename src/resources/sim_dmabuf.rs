//! A dma-buf exporter beside the software NIC (feature `sim`): what a GPU or accelerator
//! driver is to a ConnectX, for testing [`Pd::register_dmabuf`](crate::Pd::register_dmabuf)
//! and what happens when the exporter moves its buffer.

use super::Device;
use crate::error::{Capability, Error, Result};
use mlx5::sim::Nic;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// `len` bytes of another device's memory, exported as a file descriptor that
/// [`Pd::register_dmabuf`](crate::Pd::register_dmabuf) of a software-NIC device accepts
/// (feature `sim`).
///
/// The exporter owns the bytes and may move them ([`SimDmaBuf::move_buffer`]), as a GPU
/// driver migrates memory: the NIC's regions on it are unmapped, and its next receive into
/// an SRQ WQE over them meets a page fault, which a ConnectX reports in a CQE that the
/// driver must swallow and answer by posting the WQE again ([`Srq::post_recv`](crate::Srq::post_recv),
/// and the guide's "Shared receive queues"); any other access maps the buffer again
/// silently. The bytes are
/// read and written through the exporter ([`SimDmaBuf::read`], [`SimDmaBuf::write`]): a
/// dma-buf region has no CPU view. Dropping the exporter closes its file; regions
/// registered on it keep the buffer alive, as the kernel's attachment does.
///
/// ```
/// use blueflame::{Access, Device, SimDmaBuf};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd().unwrap();
/// let gpu = SimDmaBuf::new(&dev, 4096).unwrap();
/// gpu.write(0, b"on the device").unwrap();
/// let mr = pd.register_dmabuf(gpu.fd(), 0, 4096, 0x7000_0000, Access::LOCAL_WRITE).unwrap();
/// assert_eq!(mr.addr(), 0x7000_0000);
/// gpu.move_buffer().unwrap();
/// let mut got = [0u8; 13];
/// gpu.read(0, &mut got).unwrap();
/// assert_eq!(&got, b"on the device");
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub struct SimDmaBuf {
    nic: Nic,
    fd: OwnedFd,
    handle: u64,
    len: usize,
}

impl core::fmt::Debug for SimDmaBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SimDmaBuf")
            .field("handle", &self.handle)
            .field("len", &self.len)
            .finish()
    }
}

impl SimDmaBuf {
    /// `len` zeroed bytes exported beside `dev`'s software NIC.
    ///
    /// # Errors
    /// [`Error::Capability`] (`DmaBuf`) when `dev` is not a software NIC;
    /// [`Error::InvalidParameter`] for `len == 0`; [`Error::Io`] when no memory file can be
    /// made; `Error::Sim` when the bytes cannot be allocated.
    pub fn new(dev: &Device, len: usize) -> Result<SimDmaBuf> {
        let nic = dev
            .sim_nic()
            .ok_or(Error::Capability(Capability::DmaBuf))?
            .clone();
        if len == 0 {
            return Err(Error::InvalidParameter {
                what: "dma-buf length",
                value: 0,
            });
        }
        let fd = crate::verbs::fd::memfd(c"blueflame-sim-dmabuf").map_err(Error::Io)?;
        let handle = crate::verbs::fd::identity(fd.as_fd()).map_err(Error::Io)?;
        nic.dmabuf_export(handle, len)?;
        Ok(SimDmaBuf {
            nic,
            fd,
            handle,
            len,
        })
    }

    /// The dma-buf's file descriptor, for [`Pd::register_dmabuf`](crate::Pd::register_dmabuf).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: [`SimDmaBuf::new`] refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `data` at `offset` (the exporter's own access).
    ///
    /// # Errors
    /// `Error::Sim` for a range outside the buffer.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        Ok(self.nic.dmabuf_write(self.handle, offset, data)?)
    }

    /// Reads `out.len()` bytes at `offset`.
    ///
    /// # Errors
    /// As [`SimDmaBuf::write`].
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        Ok(self.nic.dmabuf_read(self.handle, offset, out)?)
    }

    /// Moves the buffer: its bytes go to a new place, the old one is freed, and every
    /// region on it is unmapped until the NIC's next access faults it in (the exporter's
    /// `move_notify`, the kernel's `mlx5_ib_dmabuf_invalidate_cb`).
    ///
    /// # Errors
    /// `Error::Sim` when the new place cannot be allocated.
    pub fn move_buffer(&self) -> Result<()> {
        Ok(self.nic.dmabuf_move(self.handle)?)
    }

    /// Moves made so far.
    pub fn moves(&self) -> u64 {
        self.nic.dmabuf_moves(self.handle).unwrap_or(0)
    }
}

impl Drop for SimDmaBuf {
    fn drop(&mut self) {
        self.nic.dmabuf_close(self.handle);
    }
}
