//! The fast path of the most common post: a small RDMA write with inline data, signaled or
//! not, rung at once with BlueFlame.
//!
//! It writes the same bytes as the general encoder ([`mlx5::wqe::encode`]; a test compares
//! them for every length) but with the request's shape known in advance: one 64-byte block
//! (control, remote address, inline header, up to
//! [`FAST_INLINE_MAX`](super::FAST_INLINE_MAX) bytes), fields stored
//! as whole words, the control segment's QP-number word ready-made per DS count, one shadow
//! entry, one BlueFlame block.
//! Anything else (a longer payload, an armed fence, a full ring, a QP without BlueFlame, an
//! unsignaled run that needs a signal) goes to the general path, which checks and encodes
//! everything.

use super::sq::SendQueue;
use crate::completion::WcOpcode;
use crate::error::Result;
use crate::queue::flags::PostFlags;
use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::opcode::Opcode;
use mlx5::request::{Payload, Remote, Request};
use mlx5::seg::INLINE_SEG;

/// What a one-block WQE of [`SendQueue::push_block`] is: its device opcode, what its
/// completion reports (the opcode, and a read's byte count) and its immediate (host order;
/// 0 for an opcode without one).
#[derive(Clone, Copy)]
pub(super) struct BlockKind {
    pub(super) opcode: Opcode,
    pub(super) wc: WcOpcode,
    pub(super) byte_len: u32,
    pub(super) imm: u32,
}

impl SendQueue {
    /// Whether a push's inline-write encoder (which rings nothing: a batch's, or the
    /// general path's) takes an inline write of `len` bytes with `flags`.
    #[inline(always)]
    pub(super) fn fast_inline_applies(&self, len: usize, flags: PostFlags) -> bool {
        self.inline_applies(self.push_limit, len, flags)
    }

    /// Whether a fast path of payload limit `limit` (0: off) takes an inline write of `len`
    /// bytes with `flags`: room in the ring, no fence, and a signal or credit for it. An
    /// empty one carries no inline data, so on a queue that copies only inline WQEs with
    /// BlueFlame (`MLX5_POST_SEND_PREFER_BF=0`) it takes the general path, which rings it
    /// with the 8-byte doorbell as rdma-core's `post_send_db` does (`inl` is 0 for it).
    /// A length known at the call site folds that test away.
    #[inline(always)]
    pub(super) fn inline_applies(&self, limit: usize, len: usize, flags: PostFlags) -> bool {
        len < limit
            && (len != 0 || !self.bf_inline_only)
            && self.pi != self.limit
            && flags.fence == Fence::None
            && (flags.signaled || self.credit != 0)
    }

    /// The fast path on a shared BlueFlame register: the same WQE as
    /// [`SendQueue::try_write_inline`], rung under the register's lock (rdma-core takes
    /// `bf->lock` for every post on a shared register, nothing more). Posts and returns true
    /// when it applies, else does nothing and returns false.
    #[inline(always)]
    pub(crate) fn try_write_inline_shared(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> bool {
        let limit = self.shared_fast_limit;
        // SAFETY: a nonzero `shared_fast_limit` says the register is shared with BlueFlame
        // halves of at least 64 bytes.
        unsafe {
            self.fast_inline(
                limit,
                (data, remote, cookie, flags),
                Self::ring_bf_block_shared,
            )
        }
    }

    /// A fast path of payload limit `limit`: when it applies, writes the inline write's WQE,
    /// rings it with `ring` (one of the fast paths' rings) and returns true; else does
    /// nothing and returns false.
    ///
    /// # Safety
    /// A nonzero `limit` means `ring`'s contract holds for the register:
    /// [`SendQueue::ring_bf_block`] on a register of the queue's own,
    /// [`SendQueue::ring_bf_block_shared`] on a shared one.
    #[inline(always)]
    unsafe fn fast_inline(
        &mut self,
        limit: usize,
        (data, remote, cookie, flags): (&[u8], Remote, u64, PostFlags),
        ring: unsafe fn(&mut Self, *const u8),
    ) -> bool {
        if !self.inline_applies(limit, data.len(), flags) {
            return false;
        }
        debug_assert_eq!(self.pending, 0, "post while a batch is open");
        let block = self.push_inline_write(data, remote, None, cookie, flags);
        // SAFETY: `block` holds the WQE just written; the caller's contract for `ring`.
        unsafe { ring(self, block) };
        true
    }

    /// Writes the WQE of an inline write (with the immediate `imm`, when Some) into the
    /// block at the producer index, records it and advances the producer index; rings
    /// nothing. Returns the block.
    ///
    /// The caller has checked [`SendQueue::fast_inline_applies`] (or, on a shared
    /// register, `inline_applies` with `shared_fast_limit`).
    #[inline(always)]
    pub(super) fn push_inline_write(
        &mut self,
        data: &[u8],
        remote: Remote,
        imm: Option<u32>,
        cookie: u64,
        flags: PostFlags,
    ) -> *const u8 {
        let len = data.len();
        debug_assert!(
            self.fast_inline_applies(len, flags)
                || self.inline_applies(self.shared_fast_limit, len, flags)
        );
        self.moderate(flags);
        // The statements follow the order in which the arguments can be let go (the shadow
        // entry, the remote address, the data, then the control segment): the path then fits
        // in the caller-saved registers (the compiler schedules in source order).
        let pi = self.pi;
        self.record(pi, cookie, 1, WcOpcode::RdmaWrite, 0, flags.signaled);
        let block = self.block(pi) as *mut u64;
        // SAFETY: the block at `pi` is free (pi != limit: retired by the poller, or never used)
        // and not yet announced to the device; it is 64 bytes, 64-byte aligned, inside the
        // ring; the stores below stay within it (36 + len <= 64).
        unsafe {
            // Remote address: address, rkey, reserved.
            block.add(2).write(remote.addr.to_be());
            block.add(3).write(remote.rkey.to_be() as u64);
            // Inline segment: byte count with the inline flag, then the data.
            inline_segment(block.add(4) as *mut u8, data);
        }
        // DS: control and remote address, plus the inline segment when there is data (as
        // rdma-core, which adds no segment for 0 bytes); its header is written regardless,
        // beyond DS when unused.
        let ds = 2 + (len != 0) as usize + (len > 12) as usize;
        let opcode = match imm {
            Some(_) => Opcode::RdmaWriteImm,
            None => Opcode::RdmaWrite,
        };
        // SAFETY: as above.
        unsafe { self.write_control(block, pi, (opcode, imm.unwrap_or(0)), ds, flags) };
        self.pi = pi.wrapping_add(1);
        block as *const u8
    }

    /// Writes a one-block WQE at the producer index: the completion moderation, the shadow
    /// entry (`kind`: the device opcode, what the completion reports and its byte count),
    /// the segments after the control segment (`fill`, given the block, which returns the
    /// WQE's size in DS), the control segment (with `kind`'s immediate); advances the
    /// producer index and rings nothing. Returns the block. The send and read fast paths write their WQEs here (the
    /// inline write's, tuned for the batch loop, writes the same parts in its own order).
    ///
    /// The caller has checked that a fast path applies (`inline_applies`, or
    /// `block_applies`): a free block, no fence, a signal asked for or credit left.
    ///
    /// `fill` may write the block's bytes 16..64 and nothing else: the block is 64 bytes,
    /// 64-byte aligned, inside the ring and not yet announced to the device.
    #[inline(always)]
    pub(super) fn push_block(
        &mut self,
        (cookie, flags): (u64, PostFlags),
        kind: BlockKind,
        fill: impl FnOnce(*mut u64) -> usize,
    ) -> *const u8 {
        self.moderate(flags);
        let pi = self.pi;
        self.record(pi, cookie, 1, kind.wc, kind.byte_len, flags.signaled);
        // The block at `pi` is free (pi != limit: retired by the poller, or never used) and
        // not yet announced to the device; 64 bytes, 64-byte aligned, inside the ring.
        let block = self.block(pi) as *mut u64;
        let ds = fill(block);
        debug_assert!((2..=4).contains(&ds));
        // SAFETY: as above.
        unsafe { self.write_control(block, pi, (kind.opcode, kind.imm), ds, flags) };
        self.pi = pi.wrapping_add(1);
        block as *const u8
    }

    /// Completion moderation of one block posted with `flags`: a signaled one restores the
    /// credit of unsignaled blocks, an unsignaled one spends one (the caller checked that
    /// some is left).
    #[inline(always)]
    fn moderate(&mut self, flags: PostFlags) {
        if flags.signaled {
            self.credit = self.half();
        } else {
            self.credit -= 1;
        }
    }

    /// Writes the control segment of the one-block WQE at `block` (position `pi`, `ds`
    /// DS): opmod 0, WQE index, opcode | QP number, DS | signature 0, fm_ce_se (no fence;
    /// a completion when signaled; solicited) | the immediate (`imm`, host order, written
    /// big-endian as rdma-core's `ctrl->imm`; 0 for an opcode without one).
    ///
    /// # Safety
    /// `block` must be the free block at `pi` in the ring, not yet announced to the device.
    #[inline(always)]
    unsafe fn write_control(
        &self,
        block: *mut u64,
        pi: u16,
        (opcode, imm): (Opcode, u32),
        ds: usize,
        flags: PostFlags,
    ) {
        let fm = FmCeSe {
            fence: Fence::None,
            completion: if flags.signaled {
                CompletionMode::Always
            } else {
                CompletionMode::OnError
            },
            solicited: flags.solicited,
        };
        // SAFETY: the caller's contract: the block's first 16 bytes, inside the ring.
        unsafe {
            (block as *mut u32).write(((pi as u32) << 8 | opcode as u32).to_be());
            (block as *mut u32).add(1).write(self.qpn_ds[ds]);
            // Bytes 8..16: signature and reserved 0, fm_ce_se at byte 11, the immediate's
            // big-endian bytes at 12..16 (the word is stored little-endian).
            block
                .add(1)
                .write((fm.to_u8() as u64) << 24 | (imm.to_be() as u64) << 32);
        }
    }

    /// Posts an RDMA write of `data` as inline data and rings: the fast path when it applies
    /// (see the module documentation), else [`SendQueue::post`].
    ///
    /// # Errors
    /// As [`SendQueue::post`]: [`crate::Error::InlineTooLong`] when `data` is longer than
    /// the QP's inline limit, [`crate::Error::QueueFull`]. Nothing is written on error.
    #[inline(always)]
    pub fn write_inline(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.try_write_inline(data, remote, cookie, flags) {
            return Ok(());
        }
        self.write_inline_general(data, remote, cookie, flags)
    }

    /// The fast path of [`SendQueue::write_inline`] alone: posts and returns true when it
    /// applies, else does nothing and returns false.
    #[inline(always)]
    pub(crate) fn try_write_inline(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> bool {
        let limit = self.fast_limit;
        // SAFETY: a nonzero `fast_limit` says the register is the queue's own, with
        // BlueFlame halves of at least 64 bytes.
        unsafe { self.fast_inline(limit, (data, remote, cookie, flags), Self::ring_bf_block) }
    }

    /// The general path of [`SendQueue::write_inline`], kept out of line so that the fast
    /// path carries no request on the stack.
    #[cold]
    #[inline(never)]
    pub(crate) fn write_inline_general(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if self.try_write_inline_shared(data, remote, cookie, flags) {
            return Ok(());
        }
        // The cached room is spent: take more (what the general path would do first) and
        // try the fast paths again.
        if self.refill_room()
            && (self.try_write_inline(data, remote, cookie, flags)
                || self.try_write_inline_shared(data, remote, cookie, flags))
        {
            return Ok(());
        }
        let req = Request::Write {
            remote,
            data: Payload::Inline(data),
        };
        self.post_general(&req, cookie, flags)
    }
}

/// Writes an inline data segment of `data` (at most [`FAST_INLINE_MAX`](super::FAST_INLINE_MAX)
/// bytes) at `at`: the byte count with `MLX5_INLINE_SEG` (rdma-core's `set_data_inl_seg`),
/// then the bytes.
///
/// # Safety
/// `at` must be valid for `4 + data.len()` byte writes, 4-byte aligned, and not overlap
/// `data`.
#[inline(always)]
pub(super) unsafe fn inline_segment(at: *mut u8, data: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe {
        (at as *mut u32).write((data.len() as u32 | INLINE_SEG).to_be());
        copy_short(data, at.add(4));
    }
}

/// Copies `src`, at most 32 bytes, to `dst` without a call to `memcpy` (a length the
/// compiler does not know is otherwise one): two overlapping loads and stores of the
/// largest power of two not above the length, head and tail.
///
/// # Safety
/// `dst` must be valid for `src.len()` byte writes and not overlap `src`.
#[inline(always)]
pub(super) unsafe fn copy_short(src: &[u8], dst: *mut u8) {
    debug_assert!(src.len() <= 32);
    let (n, s) = (src.len(), src.as_ptr());
    /// Copies `W` bytes at the start and `W` at the end (`W <= n <= 2 * W`).
    ///
    /// # Safety
    /// As `copy_short`'s, with `W <= n`.
    #[inline(always)]
    unsafe fn ends<const W: usize>(s: *const u8, d: *mut u8, n: usize) {
        // SAFETY: `W <= n`: both windows lie inside the `n` bytes of `s` and of `d`
        // (the caller's contract); unaligned reads and writes of plain bytes.
        unsafe {
            let head = (s as *const [u8; W]).read_unaligned();
            let tail = (s.add(n - W) as *const [u8; W]).read_unaligned();
            (d as *mut [u8; W]).write_unaligned(head);
            (d.add(n - W) as *mut [u8; W]).write_unaligned(tail);
        }
    }
    // SAFETY: each arm's width is at most `n` (the caller's contract covers the rest); the
    // last arm's three indices are below `n`.
    unsafe {
        if n >= 16 {
            ends::<16>(s, dst, n);
        } else if n >= 8 {
            ends::<8>(s, dst, n);
        } else if n >= 4 {
            ends::<4>(s, dst, n);
        } else if n > 0 {
            *dst = *s;
            *dst.add(n / 2) = *s.add(n / 2);
            *dst.add(n - 1) = *s.add(n - 1);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::direct::FAST_INLINE_MAX;
    use crate::error::Error;
    use mlx5::RawQp;

    /// A ring of 16 blocks (the queues of these tests and of `one_block`'s).
    #[repr(C, align(64))]
    pub(in crate::direct) struct Ring(pub(in crate::direct) [u8; 16 * 64]);
    /// A BlueFlame register of two 256-byte halves.
    #[repr(C, align(64))]
    pub(in crate::direct) struct Bf(pub(in crate::direct) [u8; 512]);

    /// The memory a test queue rings: its ring, doorbell record and register.
    pub(in crate::direct) struct Mem {
        pub(in crate::direct) ring: Box<Ring>,
        pub(in crate::direct) dbrec: [u32; 2],
        pub(in crate::direct) bf: Box<Bf>,
    }

    /// Zeroed memory for a test queue.
    pub(in crate::direct) fn mem() -> Mem {
        Mem {
            ring: Box::new(Ring([0; 16 * 64])),
            dbrec: [0; 2],
            bf: Box::new(Bf([0; 512])),
        }
    }

    /// The QP of a send queue over `m` (QP 0xabcdef, 4 scatter entries, no receive ring).
    pub(in crate::direct) fn raw_qp(m: &mut Mem, bf_size: u32, max_inline: u32) -> RawQp {
        RawQp {
            qpn: 0xab_cdef,
            sq_buf: m.ring.0.as_mut_ptr(),
            sq_wqe_cnt: 16,
            sq_stride: 64,
            rq_buf: core::ptr::null_mut(),
            rq_wqe_cnt: 0,
            rq_stride: 0,
            dbrec: m.dbrec.as_mut_ptr(),
            bf_reg: m.bf.0.as_mut_ptr(),
            bf_size,
            max_inline,
            max_send_sge: 4,
            max_recv_sge: 0,
        }
    }

    /// A send queue over `m` ([`raw_qp`]), on a shared register, unchecked and unaccounted.
    pub(in crate::direct) fn queue(m: &mut Mem, bf_size: u32, max_inline: u32) -> SendQueue {
        let raw = raw_qp(m, bf_size, max_inline);
        // SAFETY: the ring, record and register live in `m`, longer than the queue.
        unsafe { SendQueue::new(&raw) }.unwrap()
    }

    /// The meaningful bytes of the WQE at block `i`: 32, and the inline segment's 4 + len
    /// when len > 0 (padding and bytes beyond DS are not read by the device).
    fn wqe(m: &Mem, i: usize, len: usize) -> Vec<u8> {
        let n = if len == 0 { 32 } else { 36 + len };
        m.ring.0[i * 64..i * 64 + n].to_vec()
    }

    #[test]
    fn same_bytes_as_the_general_encoder_for_every_length_and_flag() {
        let data: Vec<u8> = (0..FAST_INLINE_MAX as u8).map(|b| b ^ 0x5a).collect();
        let remote = Remote {
            addr: 0x0123_4567_89ab_cdef,
            rkey: 0xfeed_beef,
        };
        let flag_sets = [
            PostFlags::SIGNALED,
            PostFlags::UNSIGNALED,
            PostFlags::SIGNALED.solicited(),
        ];
        for len in 0..=FAST_INLINE_MAX {
            for flags in flag_sets {
                let (mut fast, mut slow) = (mem(), mem());
                let mut a = queue(&mut fast, 256, 64);
                let mut b = queue(&mut slow, 256, 64);
                // Three posts each so that the WQE index and the BlueFlame half move.
                for k in 0..3u64 {
                    a.write_inline(&data[..len], remote, k, flags).unwrap();
                    let req = Request::Write {
                        remote,
                        data: Payload::Inline(&data[..len]),
                    };
                    b.post_general(&req, k, flags).unwrap();
                }
                assert_eq!((a.pi, a.credit), (b.pi, b.credit));
                drop((a, b));
                for i in 0..3 {
                    assert_eq!(
                        wqe(&fast, i, len),
                        wqe(&slow, i, len),
                        "len {len} {flags:?}"
                    );
                }
                assert_eq!(fast.dbrec, slow.dbrec);
                // The last BlueFlame copy went to the first half again (three rings).
                let n = wqe(&fast, 0, len).len();
                assert_eq!(&fast.bf.0[..n], &slow.bf.0[..n]);
            }
        }
    }

    #[test]
    fn falls_back_when_the_fast_path_does_not_apply() {
        let remote = Remote { addr: 8, rkey: 1 };
        // Longer than one block: the general path (two blocks).
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        q.write_inline(&[7; 40], remote, 1, PostFlags::SIGNALED)
            .unwrap();
        assert_eq!(q.pi, 2);
        // Over the QP's inline limit: an error, nothing written.
        let mut m = mem();
        let mut q = queue(&mut m, 256, 8);
        let e = q.write_inline(&[7; 9], remote, 1, PostFlags::SIGNALED);
        assert!(matches!(e, Err(Error::InlineTooLong { len: 9, max: 8 })));
        assert_eq!(q.pi, 0);
        drop(q);
        assert!(m.ring.0.iter().all(|&b| b == 0));
        // No BlueFlame register: the 8-byte doorbell of the general path.
        let mut m = mem();
        let mut q = queue(&mut m, 0, 64);
        q.write_inline(&[7; 8], remote, 1, PostFlags::SIGNALED)
            .unwrap();
        drop(q);
        assert_eq!(&m.bf.0[..8], &m.ring.0[..8]);
        assert!(m.bf.0[8..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_full_ring_is_an_error_and_writes_nothing() {
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        let remote = Remote { addr: 8, rkey: 1 };
        for k in 0..16 {
            q.write_inline(&[1; 8], remote, k, PostFlags::SIGNALED)
                .unwrap();
        }
        let e = q.write_inline(&[1; 8], remote, 16, PostFlags::SIGNALED);
        assert!(matches!(
            e,
            Err(Error::QueueFull {
                needed: 1,
                free: 0,
                ..
            })
        ));
        assert_eq!(q.pi, 16);
    }

    #[test]
    fn a_long_unsignaled_run_gets_one_internal_signal() {
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        let remote = Remote { addr: 8, rkey: 1 };
        for k in 0..9 {
            q.write_inline(&[1; 8], remote, k, PostFlags::UNSIGNALED)
                .unwrap();
        }
        drop(q);
        let ce = |i: usize| m.ring.0[i * 64 + 11] & (3 << 2);
        // Blocks 0..8 unsignaled; the ninth (half the ring passed) asks for a completion.
        assert!((0..8).all(|i| ce(i) == 0));
        assert_eq!(ce(8), (CompletionMode::Always as u8) << 2);
    }

    /// One step of a random post sequence.
    #[derive(Clone, Debug)]
    enum Step {
        /// An inline write (up to 40 bytes: beyond 28 the fast path falls back).
        Write {
            len: usize,
            signaled: bool,
            solicited: bool,
        },
        /// A read of one entry of `len` bytes (0: no data segment, the general path), or of
        /// two (the general path).
        Read { len: u32, two: bool, signaled: bool },
        /// An inline send (0 bytes and beyond 28 the fast path falls back).
        Send { len: usize, signaled: bool },
        /// A write (`write`) or send of one registered buffer of `len` bytes (0: no data
        /// segment, the general path), or of two (the general path).
        List {
            write: bool,
            len: u32,
            two: bool,
            signaled: bool,
        },
        /// A local invalidate: arms a fence for the next request.
        Invalidate,
        /// The poller retires up to `n` more blocks.
        Retire(u16),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0usize..=40, any::<bool>(), any::<bool>()).prop_map(|(len, signaled, solicited)| {
                Step::Write { len, signaled, solicited }
            }),
            2 => (prop_oneof![Just(0u32), 1u32..=64, Just(0x7fff_ffff)], any::<bool>(), any::<bool>())
                .prop_map(|(len, two, signaled)| Step::Read { len, two, signaled }),
            2 => (0usize..=40, any::<bool>()).prop_map(|(len, signaled)| Step::Send { len, signaled }),
            2 => (any::<bool>(), prop_oneof![Just(0u32), 1u32..=4096], any::<bool>(), any::<bool>())
                .prop_map(|(write, len, two, signaled)| Step::List { write, len, two, signaled }),
            1 => Just(Step::Invalidate),
            2 => (0u16..=16).prop_map(Step::Retire),
        ]
    }

    proptest::proptest! {
        /// The fast paths (inline write, inline send, read, write or send of one entry)
        /// against the general path alone, over random sequences that wrap the ring, fill it, arm fences and run
        /// long unsignaled: the same results, producer index, moderation credit and shadow
        /// entry after every step, and the same WQEs, decoded.
        #[test]
        fn fast_and_general_paths_post_the_same_wqes(
            steps in proptest::collection::vec(step(), 1..120)
        ) {
            let (mut fm, mut gm) = (mem(), mem());
            let mut f = queue(&mut fm, 256, 40);
            let mut g = queue(&mut gm, 256, 40);
            let data: Vec<u8> = (0..40u8).collect();
            let remote = Remote { addr: 0x1000, rkey: 0x77 };
            let mut wqes = Vec::new();
            for (k, st) in steps.iter().enumerate() {
                let cookie = k as u64;
                let start = f.pi;
                let (a, b) = match *st {
                    Step::Write { len, signaled, solicited } => {
                        let mut flags = PostFlags::UNSIGNALED;
                        flags.signaled = signaled;
                        if solicited {
                            flags = flags.solicited();
                        }
                        let req = Request::Write { remote, data: Payload::Inline(&data[..len]) };
                        let a = f.write_inline(&data[..len], remote, cookie, flags);
                        (a, g.post_general(&req, cookie, flags))
                    }
                    Step::Read { len, two, signaled } => {
                        let e = mlx5::Sge { addr: 0x2000, len, lkey: 5 };
                        let sgl = [e, e];
                        let sgl = if two { &sgl[..] } else { &sgl[..1] };
                        let req = Request::Read { remote, sgl };
                        let mut flags = PostFlags::UNSIGNALED;
                        flags.signaled = signaled;
                        (f.post(&req, cookie, flags), g.post_general(&req, cookie, flags))
                    }
                    Step::List { write, len, two, signaled } => {
                        let e = mlx5::Sge { addr: 0x3000, len, lkey: 6 };
                        let sgl = [e, e];
                        let data = Payload::Sgl(if two { &sgl[..] } else { &sgl[..1] });
                        let req = if write {
                            Request::Write { remote, data }
                        } else {
                            Request::Send { data }
                        };
                        let mut flags = PostFlags::UNSIGNALED;
                        flags.signaled = signaled;
                        (f.post(&req, cookie, flags), g.post_general(&req, cookie, flags))
                    }
                    Step::Send { len, signaled } => {
                        let req = Request::Send { data: Payload::Inline(&data[..len]) };
                        let mut flags = PostFlags::UNSIGNALED;
                        flags.signaled = signaled;
                        (f.post(&req, cookie, flags), g.post_general(&req, cookie, flags))
                    }
                    Step::Invalidate => {
                        let req = Request::LocalInvalidate { rkey: 0x99 };
                        let sig = PostFlags::SIGNALED;
                        (f.post(&req, cookie, sig), g.post_general(&req, cookie, sig))
                    }
                    Step::Retire(n) => {
                        for q in [&f, &g] {
                            let r = q.shadow.retired();
                            let room = q.pi.wrapping_sub(r).min(n);
                            q.shadow.retire(r.wrapping_add(room));
                        }
                        (Ok(()), Ok(()))
                    }
                };
                let (a, b) = (format!("{a:?}"), format!("{b:?}"));
                proptest::prop_assert_eq!(a, b, "step {} {:?}", k, st);
                let (fs, gs) = ((f.pi, f.credit), (g.pi, g.credit));
                proptest::prop_assert_eq!(fs, gs, "step {} {:?}", k, st);
                if f.pi != start {
                    // What the poller will read of it: cookie, blocks, kind, bytes, report.
                    let (x, y) = (f.shadow.get(start), g.shadow.get(start));
                    proptest::prop_assert_eq!(format!("{x:?}"), format!("{y:?}"), "step {}", k);
                    wqes.push((start, f.pi.wrapping_sub(start) as usize));
                }
            }
            drop((f, g));
            // Only the last 16 blocks are still in the ring.
            let recent: Vec<_> = wqes.iter().rev().scan(0usize, |used, &(s, n)| {
                *used += n;
                (*used <= 16).then_some((s, n))
            }).collect();
            for (start, n) in recent {
                let (mut lf, mut lg) = ([0u8; 1024], [0u8; 1024]);
                mlx5::wqe::linearize(&fm.ring.0, start as usize % 16, n, &mut lf);
                mlx5::wqe::linearize(&gm.ring.0, start as usize % 16, n, &mut lg);
                let (mut sf, mut sg) = ([mlx5::Sge::default(); 64], [mlx5::Sge::default(); 64]);
                let df = mlx5::wqe::decode(&lf[..n * 64], &mut sf).map(|d| format!("{d:?}"));
                let dg = mlx5::wqe::decode(&lg[..n * 64], &mut sg).map(|d| format!("{d:?}"));
                proptest::prop_assert_eq!(df, dg, "WQE at {}", start);
            }
        }
    }
}
