//! Gather writes from an I/O vector of registered segments into one remote buffer, checked
//! as uDAPL's `dat_ep_post_rdma_write` and librdmacm's `rdma_post_writev` promise: every
//! problem is reported before anything is posted.

use super::{MemoryRegion, PostSend, Qp, QueuePair};
use crate::connect::RemoteBuf;
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use mlx5::request::Payload;
use mlx5::request::Remote;
use mlx5::request::Request;
use mlx5::request::Sge;
use std::sync::Arc;

/// One local segment: `len` bytes at offset `off` of a registered region.
#[derive(Copy, Clone, Debug)]
pub struct LocalSeg<'a> {
    /// The region.
    pub mr: &'a MemoryRegion,
    /// Offset in the region.
    pub off: usize,
    /// Length in bytes.
    pub len: usize,
}

/// The most segments one gather write takes (the hardware's limit for one WQE).
pub const MAX_IOV: usize = 60;

impl Qp {
    /// Checks the segments and turns them into a gather list in `sges`; returns the total.
    fn gather(&self, iov: &[LocalSeg<'_>], sges: &mut [Sge; MAX_IOV]) -> Result<(usize, u64)> {
        if iov.len() > MAX_IOV {
            return Err(Error::TooManySge {
                n: iov.len(),
                max: self.max_send_sge().min(MAX_IOV),
            });
        }
        let mut total = 0u64;
        for (s, out) in iov.iter().zip(sges.iter_mut()) {
            if !Arc::ptr_eq(&s.mr.pd().inner, &self.pd().inner) {
                return Err(Error::Protection { lkey: s.mr.lkey() });
            }
            let end = s.off.checked_add(s.len).filter(|&e| e <= s.mr.len());
            if end.is_none() || s.len > u32::MAX as usize {
                let value = (s.off as u64).saturating_add(s.len as u64);
                return Err(Error::InvalidParameter {
                    what: "segment outside its region (offset + length)",
                    value,
                });
            }
            *out = Sge {
                addr: s.mr.addr() + s.off as u64,
                len: s.len as u32,
                lkey: s.mr.lkey(),
            };
            total += s.len as u64;
        }
        Ok((iov.len(), total))
    }

    fn remote_for(remote: &RemoteBuf, off: u64, total: u64) -> Result<Remote> {
        let available = remote.len.saturating_sub(off);
        if off > remote.len || total > available {
            return Err(Error::LengthError {
                needed: total,
                available,
            });
        }
        // The buffer may come from a peer: an address range past 2^64 is refused.
        match remote.addr.checked_add(off) {
            Some(addr) if addr.checked_add(total).is_some() => Ok(Remote {
                addr,
                rkey: remote.rkey,
            }),
            _ => Err(Error::InvalidParameter {
                what: "remote buffer address + offset + length (past 2^64)",
                value: remote.addr,
            }),
        }
    }

    /// Writes the concatenation of `iov` to `remote` at offset `off`, with `cookie` coming back
    /// in the completion.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::InvalidParameter`] for a segment outside its
    /// region, [`Error::Protection`] for a region of another protection domain,
    /// [`Error::LengthError`] when the remote buffer is shorter than the data,
    /// [`Error::InvalidParameter`] for a remote range that runs past 2^64,
    /// [`Error::InvalidState`] before the QP is connected, [`Error::TooManySge`],
    /// [`Error::QueueFull`]. A QP in error does not refuse: the request is flushed.
    pub fn write_iov(
        &mut self,
        iov: &[LocalSeg<'_>],
        remote: &RemoteBuf,
        off: u64,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post_iov(iov, remote, off, None, cookie, flags)
    }

    /// As [`Qp::write_iov`], with a 32-bit immediate (zero segments: a zero-byte write with
    /// immediate, legal as librpma's `rpma_write_with_imm` promises).
    ///
    /// # Errors
    /// As [`Qp::write_iov`].
    #[allow(clippy::too_many_arguments)]
    pub fn write_iov_imm(
        &mut self,
        iov: &[LocalSeg<'_>],
        remote: &RemoteBuf,
        off: u64,
        imm: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post_iov(iov, remote, off, Some(imm), cookie, flags)
    }

    /// Checks, then posts a write (with immediate when `imm` is set).
    fn post_iov(
        &mut self,
        iov: &[LocalSeg<'_>],
        remote: &RemoteBuf,
        off: u64,
        imm: Option<u32>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let mut sges = [Sge::default(); MAX_IOV];
        let (n, total) = self.gather(iov, &mut sges)?;
        let remote = Self::remote_for(remote, off, total)?;
        let data = Payload::Sgl(&sges[..n]);
        let req = match imm {
            Some(imm) => Request::WriteImm { remote, data, imm },
            None => Request::Write { remote, data },
        };
        self.post(&req, cookie, flags)
    }
}
