//! The fast paths of the other usual one-block posts, beside the inline write's
//! (`super::inline_write`): an inline send of 1 to
//! [`FAST_INLINE_MAX`](super::FAST_INLINE_MAX) bytes, with immediate or not; an inline RDMA
//! write with immediate of 0 to `FAST_INLINE_MAX` bytes; and an RDMA read into one buffer,
//! an RDMA write or a send of one buffer, the write and the send with immediate or not.
//! Each writes the bytes the general encoder ([`mlx5::wqe::encode`]) writes for it (a test
//! compares them), through the same [`SendQueue::push_block`], and rings the block with
//! BlueFlame as rdma-core's `post_send_db` does for one WQE of more than one DS.
//!
//! rdma-core's `_mlx5_post_send` writes the same segments: for `IBV_WR_SEND` with
//! `IBV_SEND_INLINE`, the control segment and `set_data_inl_seg` (the byte count with
//! `MLX5_INLINE_SEG`, then the bytes); for `IBV_WR_RDMA_READ` and `IBV_WR_RDMA_WRITE`,
//! `set_raddr_seg` and one `set_data_ptr_seg`, for `IBV_WR_SEND` the data segment alone (a
//! zero-length entry gets no segment: the general path's). The `_WITH_IMM` opcodes write
//! the same, with the immediate in the control segment (`ctrl->imm`, big-endian).
//!
//! Anything else goes to the general path: a longer or empty send (an empty one is one DS,
//! which `post_send_db` rings with the 8-byte doorbell), an empty inline write on a queue
//! that copies only inline WQEs with BlueFlame (no inline data: the doorbell too), a list
//! of several entries, of an
//! empty one or of one over [`MAX_SGE_BYTES`](mlx5::wqe::MAX_SGE_BYTES), a fence, a full ring, an unsignaled run that
//! needs a signal, a QP without a BlueFlame register of at least one block, and lists on a
//! queue that copies only inline WQEs with BlueFlame (`MLX5_POST_SEND_PREFER_BF=0`).

use super::inline_write::{inline_segment, BlockKind};
use super::sq::SendQueue;
use crate::completion::WcOpcode;
use crate::queue::flags::PostFlags;
use mlx5::ctrl::Fence;
use mlx5::opcode::Opcode;
use mlx5::request::{Remote, Sge};

impl SendQueue {
    /// Posts an inline send of `data` (with the immediate `imm`, when Some) and rings when a
    /// fast path takes it (1 to `FAST_INLINE_MAX` bytes, within the QP's inline limit):
    /// returns true; else writes nothing and returns false.
    #[inline(always)]
    pub(crate) fn try_send_inline(
        &mut self,
        data: &[u8],
        imm: Option<u32>,
        cookie: u64,
        flags: PostFlags,
    ) -> bool {
        let len = data.len();
        // At most one of the two limits is not 0 (the register is the queue's own or shared).
        let limit = self.fast_limit | self.shared_fast_limit;
        if len == 0 || !self.inline_applies(limit, len, flags) {
            return false;
        }
        let fill = move |block: *mut u64| {
            // SAFETY: `push_block`'s contract: the block is 64 bytes and free; the stores
            // stay within bytes 16 .. 20 + len <= 48.
            unsafe { inline_segment(block.add(2) as *mut u8, data) };
            // DS: control, and the inline segment's header and bytes.
            2 + (len > 12) as usize
        };
        let kind = BlockKind {
            opcode: if imm.is_some() {
                Opcode::SendImm
            } else {
                Opcode::Send
            },
            wc: WcOpcode::Send,
            byte_len: 0,
            imm: imm.unwrap_or(0),
        };
        // SAFETY: the fast path applies, and a nonzero limit says the register takes a
        // BlueFlame block.
        unsafe { self.post_block((cookie, flags), kind, fill) }
    }

    /// Posts an RDMA write with immediate of `data` inline (0 to `FAST_INLINE_MAX` bytes,
    /// within the QP's inline limit) to `remote` and rings when a fast path takes it:
    /// returns true; else writes nothing and returns false. Its WQE is the inline write's
    /// (`push_inline_write`) with the immediate's opcode.
    #[inline(always)]
    pub(crate) fn try_write_imm_inline(
        &mut self,
        remote: Remote,
        data: &[u8],
        imm: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> bool {
        // At most one of the two limits is not 0 (the register is the queue's own or shared).
        let limit = self.fast_limit | self.shared_fast_limit;
        if !self.inline_applies(limit, data.len(), flags) {
            return false;
        }
        // The inline write's own WQE, with the immediate.
        let block = self.push_inline_write(data, remote, Some(imm), cookie, flags);
        // SAFETY: `block` holds the WQE just written; a nonzero limit says the register
        // takes a BlueFlame block.
        unsafe { self.ring_block(block) };
        true
    }

    /// Posts an RDMA read of `remote` into `sgl` and rings when a fast path takes it (one
    /// entry of 1 to [`MAX_SGE_BYTES`](mlx5::wqe::MAX_SGE_BYTES) bytes): returns true; else writes nothing and
    /// returns false.
    #[inline(always)]
    pub(crate) fn try_read(
        &mut self,
        remote: Remote,
        sgl: &[Sge],
        cookie: u64,
        flags: PostFlags,
    ) -> bool {
        let kind = (Opcode::RdmaRead, WcOpcode::RdmaRead, 0);
        self.try_one_entry(kind, Some(remote), sgl, cookie, flags)
    }

    /// Posts a request of one scatter/gather entry and rings when a fast path takes it
    /// (one entry of 1 to [`MAX_SGE_BYTES`](mlx5::wqe::MAX_SGE_BYTES) bytes): an RDMA read (`remote` Some) or write,
    /// with immediate or not (the same), of a registered buffer, or a send (`remote` None)
    /// of one, with immediate or not. `kind` is the device opcode, what the completion
    /// reports (a read's reports its byte count) and the immediate (host order; 0 for an
    /// opcode without one). Returns true when posted; else writes nothing and returns
    /// false.
    #[inline(always)]
    pub(crate) fn try_one_entry(
        &mut self,
        (opcode, wc, imm): (Opcode, WcOpcode, u32),
        remote: Option<Remote>,
        sgl: &[Sge],
        cookie: u64,
        flags: PostFlags,
    ) -> bool {
        let [s] = *sgl else { return false };
        if !self.fast_entry || s.len.wrapping_sub(1) >= self.one_max || !self.block_applies(flags) {
            return false;
        }
        let fill = move |block: *mut u64| {
            // SAFETY: `push_block`'s contract: the block is 64 bytes and free; the stores
            // are its bytes 16 .. 48 at most.
            unsafe {
                // Remote address (address, rkey, reserved), then the data segment (byte
                // count, lkey, address); a send's data segment follows the control segment.
                let data = match remote {
                    Some(r) => {
                        block.add(2).write(r.addr.to_be());
                        block.add(3).write(r.rkey.to_be() as u64);
                        block.add(4)
                    }
                    None => block.add(2),
                };
                data.write((s.lkey.to_be() as u64) << 32 | s.len.to_be() as u64);
                data.add(1).write(s.addr.to_be());
            }
            // DS: control, remote address when there is one, data segment.
            2 + remote.is_some() as usize
        };
        // A read's completion reports the bytes read; a write's and a send's none.
        let byte_len = if wc == WcOpcode::RdmaRead { s.len } else { 0 };
        let kind = BlockKind {
            opcode,
            wc,
            byte_len,
            imm,
        };
        // SAFETY: the fast path applies, and `fast_entry` says the register takes a
        // BlueFlame block.
        unsafe { self.post_block((cookie, flags), kind, fill) }
    }

    /// Whether a one-block fast path takes a request with `flags` now: a free block, no
    /// fence asked for, and a signal asked for or credit left for one more unsignaled
    /// block. (The queue-wide conditions, a fast path turned on and no fence armed, are in
    /// `fast_limit`, `shared_fast_limit` and `fast_entry`.)
    #[inline(always)]
    fn block_applies(&self, flags: PostFlags) -> bool {
        self.pi != self.limit && flags.fence == Fence::None && (flags.signaled || self.credit != 0)
    }

    /// Writes a one-block WQE ([`SendQueue::push_block`] with `kind` and `fill`) and rings
    /// it with BlueFlame: on the queue's own register, or under the lock of a shared one.
    /// Returns true.
    ///
    /// # Safety
    /// A fast path applies ([`SendQueue::block_applies`] or `inline_applies`), and the
    /// queue's register takes a BlueFlame block: `fast_limit` (the queue's own register) or
    /// `shared_fast_limit` (a shared one) is not 0, each saying its register's halves hold
    /// at least one block.
    #[inline(always)]
    unsafe fn post_block(
        &mut self,
        post: (u64, PostFlags),
        kind: BlockKind,
        fill: impl FnOnce(*mut u64) -> usize,
    ) -> bool {
        let block = self.push_block(post, kind, fill);
        // SAFETY: `block` holds the WQE just written; the caller's contract for the
        // register.
        unsafe { self.ring_block(block) };
        true
    }

    /// Rings the one-block WQE at `block` with BlueFlame: on the queue's own register, or
    /// under the lock of a shared one.
    ///
    /// # Safety
    /// `block` holds the WQE just written at `pi - 1`, and the queue's register takes a
    /// BlueFlame block (`fast_limit`, the queue's own register, or `shared_fast_limit`, a
    /// shared one, is not 0; or `fast_entry`, which says one of them would be).
    #[inline(always)]
    unsafe fn ring_block(&mut self, block: *const u8) {
        // SAFETY: the caller's contract; `fast_limit` is not 0 only on a register of the
        // queue's own.
        unsafe {
            if self.fast_limit != 0 {
                self.ring_bf_block(block)
            } else {
                self.ring_bf_block_shared(block)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::direct::inline_write::tests::{mem, queue, Mem};
    use crate::direct::FAST_INLINE_MAX;
    use crate::error::Error;
    use mlx5::request::{Payload, Request};
    use mlx5::wqe::MAX_SGE_BYTES;

    /// The remote buffer of the shorter tests.
    const REMOTE: Remote = Remote { addr: 8, rkey: 1 };

    /// A scatter list of one entry of `len` bytes.
    fn one(len: u32) -> [Sge; 1] {
        [Sge {
            addr: 64,
            len,
            lkey: 5,
        }]
    }

    const FLAG_SETS: [PostFlags; 3] = [
        PostFlags::SIGNALED,
        PostFlags::UNSIGNALED,
        PostFlags::SIGNALED.solicited(),
    ];

    /// The first `n` bytes of the WQE at block `i`.
    fn wqe(m: &Mem, i: usize, n: usize) -> &[u8] {
        &m.ring.0[i * 64..i * 64 + n]
    }

    /// Posts `req` three times on a fresh queue through `post` (the fast paths) and on
    /// another through the general path alone, and compares everything the device and the
    /// poller read: the WQEs' first `n` bytes, the doorbell record, the last BlueFlame
    /// copy, the producer index, the moderation credit and the shadow entries.
    fn same_as_general(req: &Request<'_>, flags: PostFlags, n: usize) {
        let (mut fast, mut slow) = (mem(), mem());
        let mut a = queue(&mut fast, 256, 64);
        let mut b = queue(&mut slow, 256, 64);
        for k in 0..3u64 {
            assert!(
                a.try_one_block(req, k, flags),
                "a fast path takes {req:?} {flags:?}"
            );
            b.post_general(req, k, flags).unwrap();
        }
        assert_eq!((a.pi, a.credit), (b.pi, b.credit), "{req:?} {flags:?}");
        for k in 0..3u16 {
            let (x, y) = (a.shadow.get(k), b.shadow.get(k));
            assert_eq!(format!("{x:?}"), format!("{y:?}"), "{req:?} {flags:?}");
        }
        drop((a, b));
        for i in 0..3 {
            assert_eq!(wqe(&fast, i, n), wqe(&slow, i, n), "{req:?} {flags:?}");
        }
        assert_eq!(fast.dbrec, slow.dbrec);
        // Three rings: the last BlueFlame copy went to the first half again.
        assert_eq!(&fast.bf.0[..n], &slow.bf.0[..n]);
        assert_eq!(&fast.bf.0[..n], wqe(&fast, 2, n));
    }

    #[test]
    fn an_inline_send_writes_what_the_general_encoder_writes_for_every_length() {
        let data: Vec<u8> = (0..FAST_INLINE_MAX as u8).map(|b| b ^ 0xa5).collect();
        for len in 1..=FAST_INLINE_MAX {
            for flags in FLAG_SETS {
                let req = Request::Send {
                    data: Payload::Inline(&data[..len]),
                };
                // Control, the inline header and the bytes.
                same_as_general(&req, flags, 20 + len);
                let req = Request::SendImm {
                    data: Payload::Inline(&data[..len]),
                    imm: 0x1234_5678,
                };
                same_as_general(&req, flags, 20 + len);
            }
        }
    }

    #[test]
    fn an_inline_write_with_immediate_writes_what_the_general_encoder_writes_for_every_length() {
        let data: Vec<u8> = (0..FAST_INLINE_MAX as u8).map(|b| b ^ 0x5a).collect();
        let remote = Remote {
            addr: 0x0123_4567_89ab_cdef,
            rkey: 0xfeed_beef,
        };
        for len in 0..=FAST_INLINE_MAX {
            for flags in FLAG_SETS {
                let req = Request::WriteImm {
                    remote,
                    data: Payload::Inline(&data[..len]),
                    imm: 0x8765_4321,
                };
                // Control, remote address, and the inline header and bytes when there are
                // bytes (none for none).
                let n = if len == 0 { 32 } else { 36 + len };
                same_as_general(&req, flags, n);
            }
        }
    }

    /// With `MLX5_POST_SEND_PREFER_BF=0` a WQE without inline data is rung with the 8-byte
    /// doorbell (rdma-core's `post_send_db`: `inl || prefer_bf`): an empty inline write,
    /// with immediate or not, is not copied with BlueFlame; with the default it is.
    #[test]
    fn an_empty_inline_write_is_copied_with_blueflame_only_when_the_queue_prefers_it() {
        let reqs = [
            Request::Write {
                remote: REMOTE,
                data: Payload::Inline(&[]),
            },
            Request::WriteImm {
                remote: REMOTE,
                data: Payload::Inline(&[]),
                imm: 7,
            },
        ];
        for req in reqs {
            for inline_only in [false, true] {
                for fast in [true, false] {
                    let mut m = mem();
                    let mut q = queue(&mut m, 256, 64);
                    q.set_blueflame_inline_only(inline_only);
                    if fast {
                        q.post(&req, 1, PostFlags::SIGNALED).unwrap();
                    } else {
                        q.post_general(&req, 1, PostFlags::SIGNALED).unwrap();
                    }
                    drop(q);
                    // Control and remote address: 2 DS either way.
                    assert_eq!(m.ring.0[7] & 0x3f, 2, "{req:?}");
                    let copied = m.bf.0[8..64].iter().any(|&b| b != 0);
                    assert_eq!(copied, !inline_only, "{req:?} inline_only {inline_only}");
                    assert_eq!(&m.bf.0[..8], &m.ring.0[..8], "{req:?}");
                }
            }
        }
    }

    #[test]
    fn a_read_write_or_send_of_one_buffer_writes_what_the_general_encoder_writes() {
        let remote = Remote {
            addr: 0x0123_4567_89ab_cdef,
            rkey: 0xfeed_beef,
        };
        for len in [1, 8, 64, 4096, MAX_SGE_BYTES] {
            for flags in FLAG_SETS {
                let sgl = [Sge {
                    addr: 0xfedc_ba98_7654_3210,
                    len,
                    lkey: 0x1234_5678,
                }];
                let data = Payload::Sgl(&sgl);
                // Control, remote address and the data segment (a send: no remote address).
                same_as_general(&Request::Read { remote, sgl: &sgl }, flags, 48);
                same_as_general(&Request::Write { remote, data }, flags, 48);
                same_as_general(&Request::Send { data }, flags, 32);
                let imm = 0x0102_0304;
                same_as_general(&Request::WriteImm { remote, data, imm }, flags, 48);
                same_as_general(&Request::SendImm { data, imm }, flags, 32);
            }
        }
    }

    #[test]
    fn a_list_the_fast_path_does_not_take_is_encoded_as_before() {
        // An empty entry gets no data segment; two entries two; the DS count in byte 7.
        for (sgl, write_ds, send_ds) in [(&one(0)[..], 2, 1), (&[one(8)[0], one(8)[0]][..], 4, 3)] {
            let data = Payload::Sgl(sgl);
            for (req, ds) in [
                (
                    Request::Write {
                        remote: REMOTE,
                        data,
                    },
                    write_ds,
                ),
                (Request::Send { data }, send_ds),
            ] {
                let mut m = mem();
                let mut q = queue(&mut m, 256, 64);
                q.post(&req, 1, PostFlags::SIGNALED).unwrap();
                drop(q);
                assert_eq!(m.ring.0[7] & 0x3f, ds, "{req:?}");
            }
        }
    }

    #[test]
    fn the_general_path_takes_what_the_fast_paths_do_not() {
        let remote = REMOTE;
        // An empty send is one DS: the 8-byte doorbell, no BlueFlame copy.
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        let empty = Request::Send {
            data: Payload::Inline(&[]),
        };
        q.post(&empty, 1, PostFlags::SIGNALED).unwrap();
        drop(q);
        assert_eq!(&m.bf.0[..8], &m.ring.0[..8]);
        assert!(m.bf.0[8..64].iter().all(|&b| b == 0));
        // A send over the fast path's limit: two blocks.
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        let long = Request::Send {
            data: Payload::Inline(&[3; 40]),
        };
        q.post(&long, 1, PostFlags::SIGNALED).unwrap();
        assert_eq!(q.pi, 1);
        assert_eq!(m.ring.0[7] & 0x3f, 4, "1 + 3 DS");
        // Over the QP's inline limit: refused, nothing written.
        let mut m = mem();
        let mut q = queue(&mut m, 256, 8);
        let nine = Request::Send {
            data: Payload::Inline(&[3; 9]),
        };
        let e = q.post(&nine, 1, PostFlags::SIGNALED);
        assert!(
            matches!(e, Err(Error::InlineTooLong { len: 9, max: 8 })),
            "{e:?}"
        );
        assert_eq!(q.pi, 0);
        drop(q);
        assert!(m.ring.0.iter().all(|&b| b == 0));
        // A read of an empty entry has no data segment (2 DS); of two entries, 4 DS; over
        // 2^31 - 1 bytes, refused with nothing written.
        for (sgl, ds) in [(&one(0)[..], 2), (&[one(8)[0], one(8)[0]][..], 4)] {
            let mut m = mem();
            let mut q = queue(&mut m, 256, 64);
            q.post(&Request::Read { remote, sgl }, 1, PostFlags::SIGNALED)
                .unwrap();
            drop(q);
            assert_eq!(m.ring.0[7] & 0x3f, ds);
        }
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        let huge = one(MAX_SGE_BYTES + 1);
        let e = q.post(
            &Request::Read { remote, sgl: &huge },
            1,
            PostFlags::SIGNALED,
        );
        assert!(e.is_err(), "{e:?}");
        assert_eq!(q.pi, 0);
        drop(q);
        assert!(m.ring.0.iter().all(|&b| b == 0));
        // No BlueFlame register: the 8-byte doorbell of the general path.
        let mut m = mem();
        let mut q = queue(&mut m, 0, 64);
        q.post(
            &Request::Read {
                remote,
                sgl: &one(8),
            },
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        drop(q);
        assert_eq!(&m.bf.0[..8], &m.ring.0[..8]);
        assert!(m.bf.0[8..].iter().all(|&b| b == 0));
    }

    #[test]
    fn lists_get_the_doorbell_when_blueflame_is_kept_for_inline_wqes() {
        // rdma-core's MLX5_POST_SEND_PREFER_BF=0: a read, write or send of a buffer (no
        // inline data) is rung with the 8-byte doorbell, an inline send still with BlueFlame.
        let (remote, sgl) = (REMOTE, one(8));
        let data = Payload::Sgl(&sgl);
        for req in [
            Request::Read { remote, sgl: &sgl },
            Request::Write { remote, data },
            Request::Send { data },
        ] {
            let mut m = mem();
            let mut q = queue(&mut m, 256, 64);
            q.set_blueflame_inline_only(true);
            q.post(&req, 1, PostFlags::SIGNALED).unwrap();
            drop(q);
            assert!(
                m.bf.0[8..64].iter().all(|&b| b == 0),
                "a doorbell, not a copy: {req:?}"
            );
        }
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        q.set_blueflame_inline_only(true);
        q.post(&Request::Read { remote, sgl: &sgl }, 1, PostFlags::SIGNALED)
            .unwrap();
        let send = Request::Send {
            data: Payload::Inline(&[9; 8]),
        };
        q.post(&send, 2, PostFlags::SIGNALED).unwrap();
        drop(q);
        // The send's copy went to the second half (each ring flips it).
        assert_eq!(&m.bf.0[256..256 + 28], &m.ring.0[64..64 + 28]);
    }

    #[test]
    fn a_full_ring_and_a_spent_credit_take_the_general_path() {
        let (remote, sgl) = (REMOTE, one(8));
        let read = Request::Read { remote, sgl: &sgl };
        let mut m = mem();
        let mut q = queue(&mut m, 256, 64);
        // Unsignaled: eight take the credit (half the ring), the ninth is signaled by the
        // general path.
        for k in 0..9 {
            q.post(&read, k, PostFlags::UNSIGNALED).unwrap();
        }
        for k in 9..16 {
            q.post(&read, k, PostFlags::SIGNALED).unwrap();
        }
        let e = q.post(&read, 16, PostFlags::SIGNALED);
        assert!(
            matches!(
                e,
                Err(Error::QueueFull {
                    needed: 1,
                    free: 0,
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(q.pi, 16);
        drop(q);
        let ce = |i: usize| m.ring.0[i * 64 + 11] & (3 << 2);
        assert!((0..8).all(|i| ce(i) == 0));
        assert_eq!(ce(8), (mlx5::ctrl::CompletionMode::Always as u8) << 2);
    }
}
