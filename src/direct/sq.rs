//! The send queue of the direct path: WQEs written straight into the ring, cookies into the
//! shadow table, one doorbell per post or per batch.

use super::doorbell::Doorbell;
use super::shadow::{SendEntry, Shadow};
use crate::completion::WcOpcode;
use crate::error::{Error, Result};
use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::doorbell::SEND_WQE_BB;
use mlx5::request::Request;
use mlx5::wqe::{ds_to_bbs, encode, wqe_ds, Limits, Span};
use mlx5::RawQp;
use std::sync::Arc;

/// How one request completes and orders.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PostFlags {
    /// Report success with a completion (errors are always reported).
    pub signaled: bool,
    /// Raise a solicited event at the responder (sends and writes with immediate).
    pub solicited: bool,
    /// Wait for earlier work of this QP before starting.
    pub fence: Fence,
}

impl PostFlags {
    /// A completion on success and on error.
    pub const SIGNALED: PostFlags = PostFlags {
        signaled: true,
        solicited: false,
        fence: Fence::None,
    };
    /// A completion only on error ("suppress success completions").
    pub const UNSIGNALED: PostFlags = PostFlags {
        signaled: false,
        solicited: false,
        fence: Fence::None,
    };

    /// With the solicited-event bit.
    pub const fn solicited(mut self) -> PostFlags {
        self.solicited = true;
        self
    }
    /// With a fence mode (`Fence::SmallAndFence` is verbs' `IBV_SEND_FENCE`).
    pub const fn fence(mut self, fence: Fence) -> PostFlags {
        self.fence = fence;
        self
    }
}

impl Default for PostFlags {
    fn default() -> Self {
        PostFlags::SIGNALED
    }
}

/// The send side of a QP on the direct path.
pub struct SendQueue {
    buf: *mut u8,
    cnt: u32,
    qpn: u32,
    limits: Limits,
    /// Producer index (blocks, 16 bits) of the next WQE.
    pi: u16,
    db: Doorbell,
    pub(crate) shadow: Arc<Shadow<SendEntry>>,
    /// Blocks posted unsignaled since the last signaled WQE.
    unsignaled: u32,
    /// Fence armed by a bind or invalidate for the next WQE.
    next_fence: Fence,
    /// WQEs written since the last ring, and where the last one starts.
    pending: u16,
    last: (u16, u16),
}

// SAFETY: the raw pointers are to the QP's rings and registers, which this queue alone writes
// (the constructor's contract); moving it to another thread moves that exclusive right.
unsafe impl Send for SendQueue {}

impl core::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendQueue")
            .field("qpn", &self.qpn)
            .field("blocks", &self.cnt)
            .field("pi", &self.pi)
            .finish()
    }
}

fn wc_opcode(req: &Request<'_>) -> (WcOpcode, u32) {
    match req {
        Request::Nop => (WcOpcode::Nop, 0),
        Request::Write { .. } | Request::WriteImm { .. } => (WcOpcode::RdmaWrite, 0),
        Request::Read { sgl, .. } => (WcOpcode::RdmaRead, sgl.iter().map(|s| s.len).sum()),
        Request::Send { .. } | Request::SendImm { .. } | Request::SendInv { .. } => {
            (WcOpcode::Send, 0)
        }
        Request::CompareSwap { .. } => (WcOpcode::CompSwap, 8),
        Request::FetchAdd { .. } => (WcOpcode::FetchAdd, 8),
        Request::Masked { op, .. } => (
            if op.is_cs() {
                WcOpcode::MaskedCompSwap
            } else {
                WcOpcode::MaskedFetchAdd
            },
            op.size(),
        ),
        Request::LocalInvalidate { .. } => (WcOpcode::LocalInv, 0),
        Request::BindMw(_) => (WcOpcode::BindMw, 0),
        _ => (WcOpcode::Unknown, 0),
    }
}

impl SendQueue {
    /// A send queue over the rings of `raw`.
    ///
    /// # Safety
    /// `raw` must describe a live QP (send ring of `sq_wqe_cnt` 64-byte blocks, doorbell record,
    /// BlueFlame register of `2 * bf_size` bytes) that stays alive while the queue exists and
    /// that nothing else posts to.
    pub unsafe fn new(raw: &RawQp) -> Result<SendQueue> {
        let cnt = raw.sq_wqe_cnt;
        let stride_ok = raw.sq_stride as usize == SEND_WQE_BB;
        if !cnt.is_power_of_two() || !(16..=1 << 15).contains(&cnt) || !stride_ok {
            return Err(Error::InvalidParameter {
                what: "send ring size",
                value: cnt as u64,
            });
        }
        if raw.bf_size as usize % SEND_WQE_BB != 0 {
            return Err(Error::InvalidParameter {
                what: "BlueFlame size",
                value: raw.bf_size as u64,
            });
        }
        Ok(SendQueue {
            buf: raw.sq_buf,
            cnt,
            qpn: raw.qpn,
            limits: Limits {
                max_sge: raw.max_send_sge as usize,
                max_inline: raw.max_inline as usize,
            },
            pi: 0,
            // SAFETY: the caller guarantees a live record and register for our lifetime.
            db: unsafe { Doorbell::new(raw.dbrec, raw.bf_reg, raw.bf_size as usize) },
            shadow: Arc::new(Shadow::new(cnt)),
            unsignaled: 0,
            next_fence: Fence::None,
            pending: 0,
            last: (0, 0),
        })
    }

    /// The QP number.
    #[inline]
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Blocks free for new WQEs.
    #[inline(always)]
    pub fn free_blocks(&self) -> u32 {
        self.cnt - (self.pi.wrapping_sub(self.shadow.retired()) as u32)
    }

    /// The limits the QP was created with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Bytes of one BlueFlame write (0: doorbell only).
    pub fn bf_size(&self) -> usize {
        self.db.bf_size()
    }

    #[inline(always)]
    fn block(&self, pos: u16) -> *mut u8 {
        self.buf
            .wrapping_add(((pos as u32) & (self.cnt - 1)) as usize * SEND_WQE_BB)
    }

    /// Writes one WQE without ringing (see [`SendQueue::ring`]). Checks everything first: on
    /// an error nothing is written.
    ///
    /// # Errors
    /// [`Error::QueueFull`], [`Error::TooManySge`], [`Error::InlineTooLong`],
    /// [`Error::WqeTooLarge`], [`Error::Misaligned`], [`Error::BindTooLong`].
    #[inline(always)]
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        match req {
            Request::CompareSwap { remote, .. } | Request::FetchAdd { remote, .. }
                if remote.addr % 8 != 0 =>
            {
                return Err(Error::Misaligned {
                    addr: remote.addr,
                    align: 8,
                });
            }
            Request::Masked { remote, op, .. } if remote.addr % op.size() as u64 != 0 => {
                return Err(Error::Misaligned {
                    addr: remote.addr,
                    align: op.size(),
                });
            }
            _ => {}
        }
        let ds = wqe_ds(req, &self.limits)?;
        let bbs = ds_to_bbs(ds);
        let free = self.free_blocks();
        if bbs as u32 > free {
            return Err(Error::QueueFull {
                needed: bbs as u32,
                free,
            });
        }
        // Completion moderation: an unsignaled run longer than half the ring gets one WQE
        // signaled, so the ring can be reclaimed; its success is not reported.
        let mut report = flags.signaled;
        let signal = flags.signaled || self.unsignaled + bbs as u32 > self.cnt / 2;
        if signal {
            self.unsignaled = 0;
        } else {
            self.unsignaled += bbs as u32;
            report = false;
        }
        let fence = if flags.fence != Fence::None {
            flags.fence
        } else {
            self.next_fence
        };
        self.next_fence = match req {
            Request::BindMw(_) | Request::LocalInvalidate { .. } => Fence::InitiatorSmall,
            _ => Fence::None,
        };
        let fm = FmCeSe {
            fence,
            completion: if signal {
                CompletionMode::Always
            } else {
                CompletionMode::OnError
            },
            solicited: flags.solicited,
        };
        let pi = self.pi;
        let first = ((self.cnt - (pi as u32 & (self.cnt - 1))) as usize).min(bbs);
        // SAFETY: blocks pi .. pi + bbs are free (retired by the poller, or never used) and not
        // yet announced to the device, so nobody reads or writes them; `a` runs from block pi
        // to at most the ring end, `b` from the ring start: disjoint, inside the ring.
        let mut span = unsafe {
            Span {
                a: core::slice::from_raw_parts_mut(self.block(pi), first * SEND_WQE_BB),
                b: core::slice::from_raw_parts_mut(self.buf, (bbs - first) * SEND_WQE_BB),
            }
        };
        encode(req, ds, pi, self.qpn, fm, &mut span);
        let (opcode, byte_len) = wc_opcode(req);
        let end = pi.wrapping_add(bbs as u16);
        self.shadow.set(
            pi,
            SendEntry {
                cookie,
                end,
                opcode,
                byte_len,
                report,
            },
        );
        self.shadow.mark_posted(end);
        self.pi = end;
        self.pending += 1;
        self.last = (pi, bbs as u16);
        Ok(())
    }

    /// Rings the doorbell for every WQE pushed since the last ring: BlueFlame copy when it is
    /// exactly one WQE that fits, else the 8-byte doorbell.
    #[inline(always)]
    pub fn ring(&mut self) {
        if self.pending == 0 {
            return;
        }
        let (start, bbs) = self.last;
        let single = self.pending == 1;
        self.pending = 0;
        let (buf, mask) = (self.buf, self.cnt - 1);
        let block = |i: usize| {
            let pos = start.wrapping_add(i as u16) as u32 & mask;
            buf.wrapping_add(pos as usize * SEND_WQE_BB) as *const u8
        };
        // SAFETY: blocks start .. start + bbs hold the WQE just written, inside the ring.
        unsafe { self.db.ring(self.pi, single, bbs as usize, block) };
    }

    /// Posts one request and rings at once.
    ///
    /// # Errors
    /// As [`SendQueue::push`].
    #[inline(always)]
    pub fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.push(req, cookie, flags)?;
        self.ring();
        Ok(())
    }

    /// Starts a batch: requests are written as they are pushed and rung once by
    /// [`Batch::ring`]. A batch dropped without ringing is rewound: nothing is posted.
    pub fn batch(&mut self) -> Batch<'_> {
        self.ring();
        let start = (self.pi, self.unsignaled, self.next_fence);
        Batch { sq: self, start }
    }
}

/// Requests written to the ring and rung together (doorbell batching).
#[must_use = "a batch posts nothing until rung"]
pub struct Batch<'a> {
    sq: &'a mut SendQueue,
    start: (u16, u32, Fence),
}

impl Batch<'_> {
    /// Writes one more request.
    ///
    /// # Errors
    /// As [`SendQueue::push`]; the requests pushed before stay in the batch.
    #[inline(always)]
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.sq.push(req, cookie, flags)
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.sq.pending as usize
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.sq.pending == 0
    }

    /// Rings once for the whole batch.
    #[inline(always)]
    pub fn ring(self) {
        self.sq.ring();
        core::mem::forget(self);
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        // Never announced to the device: give the blocks back.
        (self.sq.pi, self.sq.unsignaled, self.sq.next_fence) = self.start;
        self.sq.pending = 0;
        self.sq.shadow.mark_posted(self.sq.pi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx5::request::{Access, BindMw, MwType};
    use mlx5::wqe::{decode, linearize};

    /// A send queue over plain memory (no NIC): the ring's bytes can be read back.
    #[repr(C, align(64))]
    struct Bf([u8; 512]);

    struct Mem {
        ring: Vec<u8>,
        dbrec: [u32; 2],
        bf: Box<Bf>,
    }

    fn queue(m: &mut Mem) -> SendQueue {
        let raw = RawQp {
            qpn: 0x42,
            sq_buf: m.ring.as_mut_ptr(),
            sq_wqe_cnt: (m.ring.len() / 64) as u32,
            sq_stride: 64,
            rq_buf: core::ptr::null_mut(),
            rq_wqe_cnt: 0,
            rq_stride: 0,
            dbrec: m.dbrec.as_mut_ptr(),
            bf_reg: m.bf.0.as_mut_ptr(),
            bf_size: 256,
            max_inline: 64,
            max_send_sge: 4,
            max_recv_sge: 0,
        };
        // SAFETY: the ring, record and register live in `m`, longer than the queue.
        unsafe { SendQueue::new(&raw) }.unwrap()
    }

    fn mem() -> Mem {
        Mem {
            ring: vec![0; 16 * 64],
            dbrec: [0; 2],
            bf: Box::new(Bf([0; 512])),
        }
    }

    #[test]
    fn a_bind_fences_the_next_request() {
        let mut m = mem();
        let mut sq = queue(&mut m);
        let bind = BindMw {
            mw_rkey: 0x100,
            new_rkey: 0x101,
            mw_type: MwType::Two,
            mr_lkey: 7,
            addr: 0x1000,
            len: 64,
            access: Access::REMOTE_READ,
        };
        sq.post(&Request::BindMw(bind), 1, PostFlags::SIGNALED)
            .unwrap();
        sq.post(&Request::Nop, 2, PostFlags::SIGNALED).unwrap();
        sq.post(&Request::Nop, 3, PostFlags::SIGNALED).unwrap();
        drop(sq);
        let mut sges = [mlx5::Sge::default(); 64];
        let mut lin = [0u8; 1024];
        linearize(&m.ring, 0, 3, &mut lin);
        assert_eq!(decode(&lin, &mut sges).unwrap().flags.fence, Fence::None);
        linearize(&m.ring, 3, 1, &mut lin);
        let nop = decode(&lin[..64], &mut sges).unwrap();
        assert_eq!(
            (nop.request, nop.flags.fence),
            (Request::Nop, Fence::InitiatorSmall)
        );
        linearize(&m.ring, 4, 1, &mut lin);
        assert_eq!(
            decode(&lin[..64], &mut sges).unwrap().flags.fence,
            Fence::None,
            "only the next one"
        );
        // The doorbell record holds the producer index of the last ring.
        assert_eq!(u32::from_be(m.dbrec[1]), 5);
    }

    #[test]
    fn an_explicit_fence_wins_and_errors_write_nothing() {
        let mut m = mem();
        let mut sq = queue(&mut m);
        let flags = PostFlags::SIGNALED.fence(Fence::SmallAndFence);
        sq.post(
            &Request::LocalInvalidate { rkey: 0x200 },
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        sq.post(&Request::Nop, 2, flags).unwrap();
        let before = sq.free_blocks();
        let big = [0u8; 65];
        let remote = mlx5::Remote { addr: 0, rkey: 1 };
        let e = sq.post(
            &Request::Write {
                remote,
                data: mlx5::Payload::Inline(&big),
            },
            3,
            PostFlags::SIGNALED,
        );
        assert!(matches!(e, Err(Error::InlineTooLong { len: 65, max: 64 })));
        assert_eq!(sq.free_blocks(), before);
        drop(sq);
        let mut sges = [mlx5::Sge::default(); 64];
        let mut lin = [0u8; 64];
        linearize(&m.ring, 2, 1, &mut lin);
        assert_eq!(
            decode(&lin, &mut sges).unwrap().flags.fence,
            Fence::SmallAndFence
        );
        assert!(
            m.ring[3 * 64..].iter().all(|&b| b == 0),
            "nothing written after the error"
        );
    }
}
