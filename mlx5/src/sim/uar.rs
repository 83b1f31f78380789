//! BlueFlame registers: how many the device has, which QP gets which (rdma-core's policy),
//! and what the NIC checks on each of them.
//!
//! Allocation mirrors rdma-core `providers/mlx5/verbs.c`:
//! - `mlx5_get_qp_uar`: a QP without a thread domain first takes a free register from the
//!   dedicated list; while fewer than `qp_max_dedicated_uuars` (4 by default,
//!   `MLX5_NUM_LOW_LAT_UUARS`) were allocated it allocates a UAR page (two registers) for the
//!   list; then, while fewer than `qp_max_shared_uuars` (`MLX5_TOTAL_UUARS` 16 minus the low
//!   latency ones: 12) were allocated, a page of shared registers; then it hands out the least
//!   used shared register. rdma-core takes `bf->lock` on every shared register.
//! - `mlx5_alloc_td` -> `mlx5_attach_dedicated_uar`: a thread domain owns a register from its
//!   own list, which no QP outside the domain ever gets; allocation fails when the device has
//!   no UAR left.
//! - No BlueFlame (`bf_size == 0`, or `MLX5_SHUT_UP_BF`): every QP rings the one
//!   non-write-combining register (`ctx->nc_uar`) with 8-byte doorbells and no lock.
//!
//! Checks (what the hardware relies on):
//! - stepped mode ([`super::NicView::process`]): per register, consecutive rings alternate between
//!   the two halves (`bf->offset ^= bf->buf_size`, kept per register, not per QP); a ring whose
//!   doorbell is not in the register when it must be is a miss.
//! - any mode, at a quiescent point ([`super::NicView::check_registers`]): a half holding a
//!   BlueFlame copy holds one whole WQE, never pieces of two (interleaved copies), and a register
//!   rung at least twice since the last check has both halves written.

use super::dma::{self, DmaBuf};
use crate::doorbell::SEND_WQE_BB;
use crate::wqe::{ds_to_bbs, MAX_WQE_BYTES};

/// How many BlueFlame registers the software NIC has and hands out (rdma-core's defaults).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UarConfig {
    /// Registers for the first QPs, one QP each (`qp_max_dedicated_uuars`,
    /// `MLX5_NUM_LOW_LAT_UUARS`, default 4).
    pub dedicated: u32,
    /// Registers shared by the later QPs, least used first (`qp_max_shared_uuars`:
    /// `MLX5_TOTAL_UUARS` 16 minus the dedicated ones, default 12).
    pub shared: u32,
    /// Registers for thread domains (`mlx5_attach_dedicated_uar`); `ibv_alloc_td` fails once
    /// they are all taken. 0 models a device or kernel without thread domains.
    pub thread_domains: u32,
}

impl Default for UarConfig {
    fn default() -> Self {
        UarConfig {
            dedicated: 4,
            shared: 12,
            thread_domains: 512,
        }
    }
}

/// Who may ring a register.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RegKind {
    /// One QP at a time (rdma-core's dedicated list: no lock).
    Dedicated,
    /// Any number of QPs, least used first (rdma-core takes `bf->lock`).
    Shared,
    /// The register of one thread domain: its QPs only.
    ThreadDomain,
    /// The non-write-combining register without BlueFlame: 8-byte doorbells only.
    NoBlueFlame,
}

/// What [`super::NicView::check_registers`] found.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RegisterCheck {
    /// Registers in use.
    pub registers: u32,
    /// Halves holding a whole BlueFlame copy of a WQE still in its ring.
    pub copies: u64,
    /// Halves holding a BlueFlame copy mixed from two writes (interleaved copies).
    pub torn: u64,
    /// Registers rung at least twice since the last check with a half left unwritten: two
    /// rings went to the same half (the offset did not alternate per register).
    pub out_of_turn: u64,
}

/// One register of the software NIC.
pub(crate) struct SimReg {
    buf: DmaBuf,
    pub(crate) bf_size: usize,
    pub(crate) kind: RegKind,
    /// QPs using it.
    pub(crate) users: u32,
    /// The thread domain owning it (ThreadDomain registers).
    pub(crate) td: Option<u32>,
    /// The half the next ring must use (stepped mode), when known.
    pub(crate) expect: Option<usize>,
    /// Rings found in this pass: (qpn, half, exactly one WQE since the last check).
    pub(crate) pass: Vec<PassRing>,
}

/// A QP whose doorbell record moved during one stepped pass.
#[derive(Copy, Clone, Debug)]
pub(crate) struct PassRing {
    pub(crate) qpn: u32,
    /// The half (byte offset 0 or `bf_size`) holding its doorbell or copy; None when not
    /// found.
    pub(crate) half: Option<usize>,
    /// Exactly one WQE since the last check: exactly one ring.
    pub(crate) single: bool,
}

impl SimReg {
    pub(crate) fn new(kind: RegKind, bf_size: usize) -> SimReg {
        SimReg::on(DmaBuf::new(2 * bf_size + 64), kind, bf_size)
    }

    fn on(buf: DmaBuf, kind: RegKind, bf_size: usize) -> SimReg {
        SimReg {
            buf,
            bf_size,
            kind,
            users: 0,
            td: None,
            expect: Some(0),
            pass: Vec::new(),
        }
    }

    /// The driver's register at `ptr` (a bfreg in a UAR page rdma-core's provider mapped).
    fn host(ptr: *mut u8, bf_size: usize) -> SimReg {
        SimReg::on(DmaBuf::host(ptr), RegKind::Shared, bf_size)
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.buf.ptr()
    }

    /// Bytes the two halves span (8 for the doorbell-only register).
    pub(crate) fn span(&self) -> usize {
        if self.bf_size == 0 {
            8
        } else {
            2 * self.bf_size
        }
    }

    /// Reads `out.len()` bytes of the register from byte `at`.
    pub(crate) fn read(&self, at: usize, out: &mut [u8]) {
        assert!(at + out.len() <= 2 * self.bf_size + 64);
        // SAFETY: the buffer holds 2 * bf_size + 64 bytes; the range was checked.
        unsafe { dma::read(self.buf.ptr().add(at), out) };
    }

    /// Zeroes both halves.
    pub(crate) fn clear(&self) {
        let zeros = [0u8; MAX_WQE_BYTES];
        let span = self.span();
        for at in (0..span).step_by(MAX_WQE_BYTES) {
            let n = (span - at).min(MAX_WQE_BYTES);
            // SAFETY: at + n <= span <= the buffer's length.
            unsafe { dma::write(self.buf.ptr().add(at), &zeros[..n]) };
        }
    }

    /// Closes a stepped pass: checks the alternation of the rings it saw and returns, per QP,
    /// (qpn, missed, out of turn).
    pub(crate) fn end_pass(&mut self) -> Vec<(u32, bool, bool)> {
        let rings = std::mem::take(&mut self.pass);
        let mut out = Vec::with_capacity(rings.len());
        if rings.is_empty() {
            return out;
        }
        let known = rings.iter().all(|r| r.single);
        let bf = self.bf_size;
        if bf == 0 {
            // One 8-byte slot that every QP of the register writes (rdma-core's `nc_uar`):
            // with several rings in a pass only the last store shows, yet each was a
            // doorbell of its own to a ConnectX. A miss only when no ring shows.
            let missed = rings.iter().all(|r| r.half.is_none());
            for r in &rings {
                out.push((r.qpn, missed, false));
            }
        } else if known && rings.len() == 1 {
            // One ring: it must be in the half the previous ring left for it.
            let r = rings[0];
            let turn = match (r.half, self.expect) {
                (Some(h), Some(e)) => h != e,
                _ => false,
            };
            out.push((r.qpn, r.half.is_none(), turn));
            self.expect = r.half.map(|h| h ^ bf);
        } else if known && rings.len() == 2 {
            // Two rings: one in each half, whichever came first.
            let same = matches!((rings[0].half, rings[1].half), (Some(a), Some(b)) if a == b);
            for r in &rings {
                out.push((r.qpn, r.half.is_none(), same));
            }
            if same || rings.iter().any(|r| r.half.is_none()) {
                self.expect = None;
            }
        } else {
            // More rings than the register can show: earlier ones were overwritten by design.
            for r in &rings {
                out.push((r.qpn, false, false));
            }
            self.expect = None;
        }
        self.clear();
        out
    }
}

/// The register allocator of one device (rdma-core's context).
#[derive(Default)]
pub(crate) struct Uars {
    pub(crate) cfg: UarConfig,
    pub(crate) regs: Vec<SimReg>,
    dedicated_alloc: u32,
    shared_alloc: u32,
    td_alloc: u32,
    /// Thread domains: their register.
    pub(crate) tds: std::collections::HashMap<u32, usize>,
    next_td: u32,
}

/// Registers in one UAR page (`MLX5_NUM_NON_FP_BFREGS_PER_UAR`).
const REGS_PER_PAGE: u32 = 2;

impl Uars {
    pub(crate) fn new(cfg: UarConfig) -> Uars {
        Uars {
            cfg,
            ..Uars::default()
        }
    }

    fn add_page(&mut self, kind: RegKind, bf_size: usize) -> usize {
        let first = self.regs.len();
        for _ in 0..REGS_PER_PAGE {
            self.regs.push(SimReg::new(kind, bf_size));
        }
        first
    }

    /// The register of a new QP without a thread domain (`mlx5_get_qp_uar`).
    pub(crate) fn for_qp(&mut self, bf_size: usize) -> usize {
        if bf_size == 0 {
            let i = match self
                .regs
                .iter()
                .position(|r| r.kind == RegKind::NoBlueFlame)
            {
                Some(i) => i,
                None => {
                    self.regs.push(SimReg::new(RegKind::NoBlueFlame, 0));
                    self.regs.len() - 1
                }
            };
            self.regs[i].users += 1;
            return i;
        }
        let free =
            |r: &SimReg| r.kind == RegKind::Dedicated && r.users == 0 && r.bf_size == bf_size;
        let i = if let Some(i) = self.regs.iter().position(free) {
            i
        } else if self.dedicated_alloc < self.cfg.dedicated {
            self.dedicated_alloc += REGS_PER_PAGE;
            self.add_page(RegKind::Dedicated, bf_size)
        } else {
            if self.shared_alloc < self.cfg.shared {
                self.shared_alloc += REGS_PER_PAGE;
                self.add_page(RegKind::Shared, bf_size);
            }
            let least = self
                .regs
                .iter()
                .enumerate()
                .filter(|(_, r)| r.kind == RegKind::Shared && r.bf_size == bf_size)
                .min_by_key(|(_, r)| r.users)
                .map(|(i, _)| i);
            match least {
                Some(i) => i,
                // No shared register of this size (the pages went to another size).
                None => self.add_page(RegKind::Shared, bf_size),
            }
        };
        self.regs[i].users += 1;
        i
    }

    /// The register at `ptr` the driver chose for a QP (rdma-core's provider assigns bfregs
    /// itself: `mlx5_get_qp_uar`, `mlx5_attach_dedicated_uar`), counted as shared.
    pub(crate) fn host(&mut self, ptr: *mut u8, bf_size: usize) -> usize {
        let i = match self.regs.iter().position(|r| r.ptr() == ptr) {
            Some(i) => i,
            None => {
                self.regs.push(SimReg::host(ptr, bf_size));
                self.regs.len() - 1
            }
        };
        self.regs[i].users += 1;
        i
    }

    /// A new thread domain and its register (`mlx5_alloc_td`), or None when the device has
    /// no register left for it.
    pub(crate) fn alloc_td(&mut self, bf_size: usize) -> Option<u32> {
        let free = |r: &SimReg| r.kind == RegKind::ThreadDomain && r.td.is_none();
        let i = match self.regs.iter().position(free) {
            Some(i) => i,
            None if self.td_alloc < self.cfg.thread_domains => {
                self.td_alloc += REGS_PER_PAGE;
                self.add_page(RegKind::ThreadDomain, bf_size)
            }
            None => return None,
        };
        let td = self.next_td;
        self.next_td += 1;
        self.regs[i].td = Some(td);
        self.tds.insert(td, i);
        Some(td)
    }

    /// Frees a thread domain (its register goes back to the thread-domain list).
    pub(crate) fn dealloc_td(&mut self, td: u32) -> Result<(), bool> {
        let i = *self.tds.get(&td).ok_or(false)?;
        if self.regs[i].users != 0 {
            return Err(true);
        }
        self.tds.remove(&td);
        self.regs[i].td = None;
        self.regs[i].expect = Some(0);
        Ok(())
    }

    /// A QP leaves register `i`.
    pub(crate) fn release(&mut self, i: usize) {
        let r = &mut self.regs[i];
        r.users = r.users.saturating_sub(1);
        if r.users == 0 {
            // The next QP may start in either half: rdma-core goes on from `bf->offset`
            // (its `mlx5_bf` lives with the context), UCX (`uct_ib_mlx5_mmio_init`) and
            // blueflame start at the first half of a register they take anew.
            r.expect = None;
        }
    }
}

/// The WQE a register half shows, checked against the ring it came from.
pub(crate) enum HalfContent {
    /// Nothing written since the last check.
    Empty,
    /// An 8-byte doorbell, or a copy of a WQE no longer in its ring.
    Doorbell,
    /// A whole BlueFlame copy.
    Copy,
    /// A BlueFlame copy that is not one WQE: pieces of two writes.
    Torn,
}

/// Classifies `reg` (the bytes of one half) against `wqe`, the ring's bytes of the WQE
/// whose control segment starts the half (None when no live WQE of the register has it).
pub(crate) fn classify(reg: &[u8], wqe: Option<&[u8]>) -> HalfContent {
    if reg.iter().all(|&b| b == 0) {
        return HalfContent::Empty;
    }
    let Some(wqe) = wqe else {
        return HalfContent::Doorbell;
    };
    let block = SEND_WQE_BB.min(reg.len());
    if reg.len() < SEND_WQE_BB || reg[8..block] != wqe[8..block] {
        // Only the first 8 bytes: a doorbell (the rest is whatever was there).
        return HalfContent::Doorbell;
    }
    let ds = wqe[7] & 0x3f;
    let bytes = (ds_to_bbs(ds as usize) * SEND_WQE_BB).min(reg.len());
    if reg[..bytes] == wqe[..bytes] {
        HalfContent::Copy
    } else {
        HalfContent::Torn
    }
}
