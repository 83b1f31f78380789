//! The NIC side of a queue pair: its rings, its cursors, and the doorbell / BlueFlame check.

use super::clock::QpTiming;
use super::dma::{self, DmaBuf};
use super::order::{Kind, Rng};
use super::progress::{Progress, Started, Wait};
use super::qp_attr::{DcRole, DctStats, QpCaps, QpState, QpStats, UdCtx};
use super::uar::{PassRing, SimReg};
use crate::ctrl::CtrlSeg;
use crate::doorbell::{MAX_WQE_BBS, RCV_DBR, SEND_WQE_BB, SND_DBR};
use crate::raw::RawQp;
use crate::recv::decode_recv;
use crate::request::Sge;
use crate::wqe::{ds_to_bbs, MAX_WQE_BYTES};
use std::collections::VecDeque;
use zerocopy::FromBytes;

pub(crate) struct SimQp {
    pub(crate) qpn: u32,
    pub(crate) pd: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    pub(crate) caps: QpCaps,
    sq: DmaBuf,
    pub(crate) sq_cnt: u32,
    rq: DmaBuf,
    pub(crate) rq_cnt: u32,
    pub(crate) rq_stride: u32,
    dbrec: DmaBuf,
    /// The BlueFlame register (index in the NIC's registers) and its address.
    pub(crate) reg: usize,
    bf_reg: usize,
    pub(crate) state: QpState,
    pub(crate) peer: Option<u32>,
    /// The path RTR and RTS programmed (meaningful once `peer` is set).
    pub(crate) path: super::qp_attr::RcPath,
    /// Producer index (blocks) of the next WQE to run.
    pub(crate) sq_ci: u32,
    /// Producer index up to which doorbells were checked.
    db_checked: u32,
    /// Producer index at the last register check ([`super::NicView::check_registers`]).
    reg_mark: u32,
    /// Receive WQEs consumed.
    pub(crate) rq_ci: u32,
    /// The SRQ this QP takes its receives from (None: its own receive queue).
    pub(crate) srq: Option<u32>,
    /// The last-WQE-reached event was raised (a QP with an SRQ, in error).
    pub(crate) last_wqe_reached: bool,
    /// The SRQ receive WQE this QP holds for a message whose packets are still arriving.
    pub(crate) partial: Option<Box<Partial>>,
    pub(crate) rnr_tries: u32,
    /// Retransmissions spent on the WQE at `sq_ci`.
    pub(crate) ack_tries: u32,
    /// The WQE at `sq_ci` waits for this timer.
    pub(crate) wait: Option<Wait>,
    /// The transport attributes (timers and retry counts).
    pub(crate) timing: QpTiming,
    /// WQEs started, completions not written yet (empty unless one is held back).
    pub(crate) started: VecDeque<Started>,
    /// The ordering mode's choices for this QP.
    pub(crate) rng: Rng,
    pub(crate) stats: QpStats,
    /// Its role in the DC transport (None: an RC QP).
    pub(crate) dc: Option<DcRole>,
    /// What it saw as a DCT.
    pub(crate) dct_stats: DctStats,
    /// Set for an unreliable-datagram QP ([`super::Nic::make_ud`]).
    pub(crate) ud: Option<UdCtx>,
}

/// An SRQ receive WQE a responder took at the first packet of a message longer than the
/// path MTU, held across the message's packets (one per NIC pass): a ConnectX consumes the
/// WQE when the first packet arrives and writes its CQE after the last. If the QP is
/// destroyed meanwhile the WQE is gone without a CQE; if it goes to error, the WQE is
/// flushed (before `IBV_EVENT_QP_LAST_WQE_REACHED`).
pub(crate) struct Partial {
    /// The requester whose message it is.
    pub(crate) from: u32,
    /// The SRQ WQE: its index and SRQ, its scatter entries.
    pub(crate) idx: u16,
    pub(crate) srqn: u32,
    pub(crate) sges: [Sge; 64],
    pub(crate) n: usize,
    /// Packets still to come after this pass's.
    pub(crate) left: u32,
}

impl SimQp {
    pub(crate) fn new(
        qpn: u32,
        pd: u32,
        (send_cq, recv_cq): (u32, u32),
        caps: QpCaps,
        (reg, bf_reg): (usize, *mut u8),
        seed: u64,
        host: Option<super::host::HostQp>,
    ) -> SimQp {
        let sq_cnt = caps.sq_blocks.max(1).next_power_of_two();
        let rq_stride = 16 * caps.max_recv_sge.max(1).next_power_of_two();
        // rdma-core's `mlx5_calc_rq_size`: a power of two of WQEs, at least one 64-byte
        // block of ring; its receives may use every entry of the stride (`rq.max_gs`).
        let rq_cnt = if caps.rq_entries == 0 {
            0
        } else {
            (caps.rq_entries.next_power_of_two() * rq_stride).max(64) / rq_stride
        };
        let caps = QpCaps {
            max_recv_sge: if rq_cnt == 0 {
                caps.max_recv_sge
            } else {
                rq_stride / 16
            },
            ..caps
        };
        // The driver's rings (sized by the caller from the same caps), or the NIC's own.
        let (sq, rq, dbrec) = match host {
            Some(h) => (
                DmaBuf::host(h.sq),
                DmaBuf::host(h.rq),
                DmaBuf::host(h.dbrec.cast()),
            ),
            None => (
                DmaBuf::new(sq_cnt as usize * SEND_WQE_BB),
                DmaBuf::new((rq_cnt * rq_stride) as usize),
                DmaBuf::new(64),
            ),
        };
        SimQp {
            qpn,
            pd,
            send_cq,
            recv_cq,
            caps,
            sq,
            sq_cnt,
            rq,
            rq_cnt,
            rq_stride,
            dbrec,
            reg,
            bf_reg: bf_reg as usize,
            state: QpState::Reset,
            peer: None,
            path: Default::default(),
            sq_ci: 0,
            db_checked: 0,
            reg_mark: 0,
            rq_ci: 0,
            srq: None,
            last_wqe_reached: false,
            partial: None,
            rnr_tries: 0,
            ack_tries: 0,
            wait: None,
            timing: QpTiming {
                rnr_retry: caps.rnr_retry,
                ..QpTiming::default()
            },
            started: VecDeque::new(),
            rng: Rng::new(seed, qpn),
            stats: QpStats::default(),
            dc: None,
            dct_stats: DctStats::default(),
            ud: None,
        }
    }

    pub(crate) fn raw(&self) -> RawQp {
        RawQp {
            qpn: self.qpn,
            sq_buf: self.sq.ptr(),
            sq_wqe_cnt: self.sq_cnt,
            sq_stride: SEND_WQE_BB as u32,
            rq_buf: self.rq.ptr(),
            rq_wqe_cnt: self.rq_cnt,
            rq_stride: self.rq_stride,
            dbrec: self.dbrec.ptr() as *mut u32,
            bf_reg: self.bf_reg as *mut u8,
            bf_size: self.caps.bf_size,
            max_inline: self.caps.max_inline,
            max_send_sge: self.caps.max_send_sge,
            max_recv_sge: self.caps.max_recv_sge,
        }
    }

    fn dbrec_word(&self, slot: usize) -> u32 {
        // SAFETY: the doorbell record is a live 64-byte DmaBuf; slots 0 and 1 are aligned words.
        unsafe { dma::load_be32((self.dbrec.ptr() as *const u32).add(slot)) }
    }

    /// The send producer index the driver published (16 bits).
    pub(crate) fn sq_db(&self) -> u32 {
        self.dbrec_word(SND_DBR) & 0xffff
    }

    /// Receive WQEs posted and not consumed.
    pub(crate) fn rq_pending(&self) -> u32 {
        if self.rq_cnt == 0 {
            return 0;
        }
        (self.dbrec_word(RCV_DBR).wrapping_sub(self.rq_ci)) & 0xffff
    }

    /// Copies `n` bytes of block `pi` onwards (wrapping) into `out`.
    pub(crate) fn read_blocks(&self, pi: u32, bbs: usize, out: &mut [u8]) {
        let mask = self.sq_cnt - 1;
        for i in 0..bbs {
            let blk = (pi.wrapping_add(i as u32) & mask) as usize;
            // SAFETY: block `blk` < sq_cnt lies inside the send ring the NIC owns; `out` holds
            // at least `bbs` blocks (callers pass MAX_WQE_BYTES buffers and bbs <= 16).
            unsafe {
                dma::read(
                    self.sq.ptr().add(blk * SEND_WQE_BB),
                    &mut out[i * SEND_WQE_BB..(i + 1) * SEND_WQE_BB],
                )
            };
        }
    }

    /// The control segment and size (blocks) of the WQE at `pi`, if it is well formed and
    /// lies before the doorbell `db`.
    pub(crate) fn peek(&self, pi: u32, db: u32) -> Result<(CtrlSeg, usize), CtrlSeg> {
        let mut blk = [0u8; SEND_WQE_BB];
        self.read_blocks(pi, 1, &mut blk);
        let ctrl = CtrlSeg::read_from_prefix(&blk)
            .map(|(c, _)| c)
            .unwrap_or_default();
        let bbs = ds_to_bbs(ctrl.ds() as usize);
        let avail = (db.wrapping_sub(pi) & 0xffff) as usize;
        if bbs == 0 || bbs > MAX_WQE_BBS || bbs > avail || ctrl.pi() as u32 != pi & 0xffff {
            return Err(ctrl);
        }
        Ok((ctrl, bbs))
    }

    /// The receive WQE at the head of the receive ring.
    pub(crate) fn peek_recv(&self, out: &mut [Sge; 64]) -> usize {
        let stride = self.rq_stride as usize;
        let idx = (self.rq_ci & (self.rq_cnt - 1)) as usize;
        let mut entry = [0u8; 1024];
        let n = stride.min(1024);
        // SAFETY: entry `idx` < rq_cnt of `stride` bytes lies inside the receive ring.
        unsafe { dma::read(self.rq.ptr().add(idx * stride), &mut entry[..n]) };
        decode_recv(&entry[..n], out)
    }

    /// Checks the doorbell of the ring that published `db` (synchronous mode only: the
    /// driver's writes are complete). Walks the WQEs since the last check to find the last
    /// one, looks for its control segment in the register's halves and compares the copy.
    /// Whether it was found, and in which half, goes to the register's pass record
    /// ([`SimReg::end_pass`] judges misses and alternation once every QP was seen).
    pub(crate) fn check_doorbell(&mut self, db: u32, reg: &mut SimReg) {
        if self.db_checked & 0xffff == db {
            return;
        }
        let mut pi = self.db_checked;
        let mut last = None;
        let mut wqes = 0;
        while pi & 0xffff != db {
            match self.peek(pi, db) {
                Ok((ctrl, bbs)) => {
                    last = Some((pi, bbs, ctrl.ds()));
                    pi = pi.wrapping_add(bbs as u32);
                    wqes += 1;
                }
                Err(_) => break,
            }
        }
        self.db_checked = pi;
        if pi & 0xffff != db {
            return; // a malformed ring: running the WQEs reports it
        }
        let Some((start, bbs, ds)) = last else { return };
        let mut wqe = [0u8; MAX_WQE_BYTES];
        self.read_blocks(start, bbs, &mut wqe);
        let bf_size = reg.bf_size;
        let bytes = bbs * SEND_WQE_BB;
        let slots: &[usize] = if bf_size == 0 { &[0] } else { &[0, bf_size] };
        let mut found = None;
        for &slot in slots {
            let mut bytes_in = [0u8; MAX_WQE_BYTES];
            let span = if bf_size == 0 {
                8
            } else {
                bf_size.min(MAX_WQE_BYTES)
            };
            reg.read(slot, &mut bytes_in[..span]);
            if bytes_in[..8] != wqe[..8] {
                continue;
            }
            self.stats.doorbells += 1;
            // rdma-core `post_send_db` copies only one WQE of 1 < ds <= bf_size / 16; any
            // other ring is the 8-byte doorbell, which leaves the rest of the half as it was
            // (zero, or an older copy when several rings came between two passes).
            let copyable = bf_size != 0 && bytes <= bf_size && ds > 1;
            let cmp = bytes.min(span);
            let copied = cmp > 8
                && bytes_in[8..cmp].iter().any(|&b| b != 0)
                && bytes_in[..cmp] == wqe[..cmp];
            let rest_zero = bytes_in[8..span].iter().all(|&b| b == 0);
            if copied {
                if copyable {
                    self.stats.bf_copies += 1;
                } else {
                    self.stats.bf_violations += 1;
                }
            } else if rest_zero || !copyable {
                self.stats.db_writes += 1;
            } else {
                self.stats.bf_mismatches += 1;
            }
            found = Some(slot);
            break;
        }
        reg.pass.push(PassRing {
            qpn: self.qpn,
            half: found,
            single: wqes == 1,
        });
    }

    /// The bytes of the WQE whose first 8 bytes are `head`, if it is still in the ring
    /// (for [`super::uar::classify`]).
    pub(crate) fn wqe_matching(&self, head: &[u8], out: &mut [u8; MAX_WQE_BYTES]) -> bool {
        let pi = (u32::from_be_bytes([head[0], head[1], head[2], head[3]]) >> 8) & 0xffff;
        let qpn = u32::from_be_bytes([head[4], head[5], head[6], head[7]]) >> 8;
        if qpn != self.qpn {
            return false;
        }
        let ds = (head[7] & 0x3f) as usize;
        let bbs = ds_to_bbs(ds);
        if bbs == 0 || bbs > MAX_WQE_BBS {
            return false;
        }
        self.read_blocks(pi, bbs, out);
        out[..8] == head[..8]
    }

    /// WQEs posted since the last register check, counted up to 2 (a ring walked over a
    /// reused slot counts as 2), and a new mark at `db`.
    pub(crate) fn rings_since_mark(&mut self, db: u32) -> u64 {
        let mut pi = self.reg_mark;
        let mut n = 0;
        while pi & 0xffff != db && n < 2 {
            match self.peek(pi, db) {
                Ok((_, bbs)) => {
                    pi = pi.wrapping_add(bbs as u32);
                    n += 1;
                }
                Err(_) => n = 2,
            }
        }
        self.reg_mark = db;
        n
    }

    /// Whether a held-back WQE this QP started is one that a WQE of `kind` with `fence`
    /// must wait for.
    pub(crate) fn must_settle(&self, kind: Kind, fence: crate::ctrl::Fence) -> bool {
        self.started.iter().any(|s| match &s.progress {
            Progress::Held { kind: k, .. } => kind.waits_for(fence, *k),
            _ => false,
        })
    }

    /// The earliest virtual time something of this QP is due (a timer, a held-back WQE).
    pub(crate) fn next_due(&self) -> Option<u64> {
        let held = self.started.iter().filter_map(|s| match &s.progress {
            Progress::Held { due, .. } => Some(*due),
            _ => None,
        });
        let wait = self.wait.map(|w| w.until).filter(|&t| t != u64::MAX);
        held.chain(wait).min()
    }

    /// Marks every doorbell up to the current one as checked (thread mode, and when the QP
    /// leaves RESET).
    pub(crate) fn skip_doorbell_check(&mut self) {
        self.db_checked = self.sq_ci;
    }
}
