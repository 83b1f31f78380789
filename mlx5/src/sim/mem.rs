//! Protection domains, memory regions and memory windows: the key tables of the NIC, and
//! every check made before a byte is moved (gather and scatter lists included).

use super::dma::{self, Dma, DmaBuf};
use super::dmabuf::{Exported, Exports};
use super::ids::Ids;
use crate::request::{Access, MwType, Payload, Sge};
use crate::syndrome::Syndrome;
use std::collections::HashMap;

/// What the NIC's memory registration does, as `ibv_query_device_ex` reports it
/// (`odp_caps`).
///
/// The default is what the software NIC models of a ConnectX: explicit on-demand paging
/// for RC (send, receive, SRQ receive, write, read, atomic) and DC. The NIC works on the process's own memory
/// with plain loads and stores and cannot fault pages in: an explicit on-demand region is
/// memory its owner keeps mapped (the region owns the buffer, or its `unsafe` registration
/// promised it), so it behaves as a pinned one, and a prefetch is checked (key, domain,
/// on-demand, rights, range) and then has nothing to do. Its page faults are modelled where
/// software sees them: an on-demand region unmapped by [`NicView::invalidate_odp`], or a
/// dma-buf region whose exporter moved the buffer (`super::dmabuf`), faults on the next
/// receive into an SRQ WQE. It does not model implicit on-demand paging (a
/// whole-address-space key would let a peer reach any address, which a model without page
/// tables cannot refuse): that is reported absent.
///
/// [`NicView::invalidate_odp`]: super::NicView::invalidate_odp
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MemoryCaps {
    /// Explicit on-demand paging for RC (`IBV_ODP_SUPPORT` and the RC bits).
    pub odp: bool,
    /// On-demand paging for DC too (`mlx5dv_context.dc_odp_caps`: send, write, read,
    /// atomic, SRQ receive), as a ConnectX-6 reports it; with `odp` only.
    pub dc_odp: bool,
    /// SRQ receives into on-demand memory for RC (`IBV_ODP_SUPPORT_SRQ_RECV` in the RC
    /// bits, a ConnectX-5's and later); with `odp` only.
    pub srq_odp: bool,
}

impl Default for MemoryCaps {
    fn default() -> Self {
        MemoryCaps {
            odp: true,
            dc_odp: true,
            srq_odp: true,
        }
    }
}

/// Why an access was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No region or bound window with this key.
    Key,
    /// The key belongs to another protection domain.
    Pd,
    /// The range is outside the region or window.
    Bounds,
    /// The region or window lacks the right.
    Rights,
    /// A type-2 window used through a QP other than the one it is bound to.
    Qp,
}

pub(crate) struct Mr {
    pub(crate) pd: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) key: u32,
    /// The buffer, when the NIC allocated it (None for user memory).
    pub(crate) _owned: Option<DmaBuf>,
    /// The export a dma-buf region lies in (its addresses are device addresses, `iova`).
    pub(crate) dmabuf: Option<Exported>,
    /// An on-demand or dma-buf region whose pages moved: the next receive into an SRQ WQE
    /// over it faults (`super::dmabuf`).
    pub(crate) unmapped: bool,
}

impl Mr {
    /// A region of `len` bytes at `addr` (the process's own memory until told otherwise).
    pub(crate) fn new(pd: u32, addr: u64, len: u64, access: Access, key: u32) -> Mr {
        Mr {
            pd,
            addr,
            len,
            access,
            key,
            _owned: None,
            dmabuf: None,
            unmapped: false,
        }
    }
}

pub(crate) struct Binding {
    pub(crate) mr_key: u32,
    /// Start virtual address in the region.
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) zero_based: bool,
    /// The QP a type-2 window is bound to.
    pub(crate) qpn: u32,
}

pub(crate) struct Mw {
    pub(crate) pd: u32,
    pub(crate) mw_type: MwType,
    pub(crate) rkey: u32,
    pub(crate) bound: Option<Binding>,
}

/// The NIC's key tables. Keys are `index << 8 | variant`; regions and windows share the
/// 24-bit index space, and an index names at most one live object.
pub(crate) struct Memory {
    pub(crate) pds: Vec<bool>,
    pub(crate) mrs: HashMap<u32, Mr>,
    pub(crate) mws: HashMap<u32, Mw>,
    indices: Ids,
    /// Keys handed out so far: the variant byte of the next key.
    generation: u32,
    /// Buffers of other devices that regions may be registered on.
    pub(crate) exports: Exports,
}

impl Memory {
    /// Tables whose key indices are `1 ..= max_index` (at most 0xff_ffff).
    pub(crate) fn new(max_index: u32) -> Memory {
        Memory {
            pds: Vec::new(),
            mrs: HashMap::new(),
            mws: HashMap::new(),
            indices: Ids::new(1, max_index.clamp(1, 0xff_ffff)),
            generation: 0,
            exports: Exports::default(),
        }
    }

    /// A key whose index names no live region or window, or None when all are in use.
    pub(crate) fn alloc_key(&mut self) -> Option<u32> {
        let index = self.indices.alloc()?;
        self.generation = self.generation.wrapping_add(1);
        // A variant byte that changes from key to key (as the mlx5 driver's mkey counter)
        // makes a stale key of a reused index visible.
        Some((index << 8) | (self.generation.wrapping_mul(0x9d) & 0xff))
    }

    /// Returns the index of `key` to the pool (its object was removed from the tables).
    pub(crate) fn free_key(&mut self, key: u32) {
        self.indices.free(key >> 8);
    }

    fn mr(&self, key: u32) -> Option<&Mr> {
        self.mrs.get(&(key >> 8)).filter(|m| m.key == key)
    }

    /// Where the NIC moves the bytes at `addr` of `mr` (checked to lie inside it): the
    /// address itself in the process's memory, or the same offset in the export where a
    /// dma-buf region's buffer is now (a region that moved is mapped again on the way: the
    /// fault software never sees).
    fn dma(&self, mr: &Mr, addr: u64) -> Dma {
        match mr.dmabuf {
            None => Dma {
                ptr: addr as *mut u8,
                words: crate::shared::Words::of(mr.addr, mr.len),
            },
            Some(x) => {
                let base = self
                    .exports
                    .get(x.handle)
                    .map_or(core::ptr::null_mut(), |e| e.buf.ptr())
                    .wrapping_add(x.offset as usize);
                Dma {
                    ptr: base.wrapping_add((addr - mr.addr) as usize),
                    words: crate::shared::Words::of(base as u64, mr.len),
                }
            }
        }
    }

    /// A receive into an SRQ WQE over `sgl` meets a page fault: some entry lies in a region
    /// whose pages moved (`Mr::unmapped`). The fault maps them again (the kernel's page-fault
    /// handler): true when there was one.
    pub(crate) fn fault_in(&mut self, sgl: &[Sge]) -> bool {
        let mut faulted = false;
        for s in sgl {
            if let Some(m) = self
                .mrs
                .get_mut(&(s.lkey >> 8))
                .filter(|m| m.key == s.lkey && m.unmapped)
            {
                m.unmapped = false;
                faulted = true;
            }
        }
        faulted
    }

    /// A local buffer of `len` bytes at `addr` under `lkey` in `pd`; `write` when the NIC will
    /// write it (needs local write).
    pub(crate) fn local(
        &self,
        pd: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<Dma, Denied> {
        let mr = self.mr(lkey).ok_or(Denied::Key)?;
        if mr.pd != pd {
            return Err(Denied::Pd);
        }
        within(addr, len, mr.addr, mr.len)?;
        if write && !mr.access.contains(Access::LOCAL_WRITE) {
            return Err(Denied::Rights);
        }
        Ok(self.dma(mr, addr))
    }

    /// A remote buffer under `rkey` seen by responder QP `qpn` in `pd`, with `right`.
    pub(crate) fn remote(
        &self,
        pd: u32,
        qpn: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        right: Access,
    ) -> Result<Dma, Denied> {
        if let Some(mr) = self.mr(rkey) {
            if mr.pd != pd {
                return Err(Denied::Pd);
            }
            if !mr.access.contains(right) {
                return Err(Denied::Rights);
            }
            let base = if mr.access.contains(Access::ZERO_BASED) {
                0
            } else {
                mr.addr
            };
            within(addr, len, base, mr.len)?;
            return Ok(self.dma(mr, mr.addr + (addr - base)));
        }
        let mw = self
            .mws
            .get(&(rkey >> 8))
            .filter(|w| w.rkey == rkey)
            .ok_or(Denied::Key)?;
        let b = mw.bound.as_ref().ok_or(Denied::Key)?;
        if mw.pd != pd {
            return Err(Denied::Pd);
        }
        if mw.mw_type == MwType::Two && b.qpn != qpn {
            return Err(Denied::Qp);
        }
        if !b.access.contains(right) {
            return Err(Denied::Rights);
        }
        let base = if b.zero_based { 0 } else { b.addr };
        within(addr, len, base, b.len)?;
        let mr = self.mr(b.mr_key).ok_or(Denied::Key)?;
        let va = b.addr + (addr - base);
        within(va, len, mr.addr, mr.len)?;
        Ok(self.dma(mr, va))
    }

    /// Gathers the bytes of a payload from local memory.
    pub(crate) fn gather(&self, pd: u32, p: &Payload<'_>) -> Result<Vec<u8>, Syndrome> {
        match p {
            Payload::Inline(b) => Ok(b.to_vec()),
            Payload::Sgl(sgl) => {
                let mut out = Vec::new();
                for s in sgl.iter() {
                    let src = self
                        .local(pd, s.lkey, s.addr, s.len as u64, false)
                        .map_err(|_| Syndrome::LocalProt)?;
                    let at = out.len();
                    out.resize(at + s.len as usize, 0);
                    // SAFETY: `src .. src + len` was checked to lie inside a registered region.
                    unsafe { dma::read_region(src, &mut out[at..]) };
                }
                Ok(out)
            }
        }
    }

    /// Checks a scatter list for local writes; returns host pointers.
    pub(crate) fn scatter_ptrs(&self, pd: u32, sgl: &[Sge]) -> Result<Vec<(Dma, usize)>, Denied> {
        sgl.iter()
            .map(|s| {
                self.local(pd, s.lkey, s.addr, s.len as u64, true)
                    .map(|p| (p, s.len as usize))
            })
            .collect()
    }
}

fn within(addr: u64, len: u64, base: u64, size: u64) -> Result<(), Denied> {
    let end = addr.checked_add(len).ok_or(Denied::Bounds)?;
    if addr < base || end > base + size {
        return Err(Denied::Bounds);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem_with_mr(access: Access) -> (Memory, u32) {
        let mut m = Memory::new(0xff_ffff);
        m.pds.push(true);
        let key = m.alloc_key().unwrap();
        m.mrs
            .insert(key >> 8, Mr::new(0, 0x1000, 0x100, access, key));
        (m, key)
    }

    #[test]
    fn local_checks() {
        let (m, k) = mem_with_mr(Access::LOCAL_WRITE);
        assert!(m.local(0, k, 0x1000, 0x100, true).is_ok());
        assert_eq!(m.local(0, k, 0x1000, 0x101, false), Err(Denied::Bounds));
        assert_eq!(m.local(0, k, 0xfff, 1, false), Err(Denied::Bounds));
        assert_eq!(m.local(1, k, 0x1000, 1, false), Err(Denied::Pd));
        assert_eq!(m.local(0, k ^ 1, 0x1000, 1, false), Err(Denied::Key));
        let (m, k) = mem_with_mr(Access::NONE);
        assert_eq!(m.local(0, k, 0x1000, 1, true), Err(Denied::Rights));
    }

    #[test]
    fn remote_checks() {
        let (m, k) = mem_with_mr(Access::REMOTE_WRITE);
        assert!(m
            .remote(0, 1, k, 0x10f0, 0x10, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            m.remote(0, 1, k, 0x10f0, 0x11, Access::REMOTE_WRITE),
            Err(Denied::Bounds)
        );
        assert_eq!(
            m.remote(0, 1, k, 0x1000, 8, Access::REMOTE_READ),
            Err(Denied::Rights)
        );
        assert_eq!(
            m.remote(0, 1, k, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(Denied::Bounds)
        );
    }
}
