//! Plain rdma-core calls, for `bfperf icount-verbs` (callgrind inside the rxe VM,
//! `cargo xtask rxe-icount`): the baseline the crate's verbs path is counted against.
//!
//! [`Plain`] is two RC QPs connected to each other on one device, built with this module's
//! objects, and work requests prepared once, as a C program (perftest) prepares them. Each
//! measured call is an `#[inline(never)]` method doing what the C `static inline` calls of
//! verbs.h do and nothing else: `ibv_post_send` of an 8-byte inline RDMA write, the same
//! write through `ibv_wr_start` / `ibv_wr_rdma_write` / `ibv_wr_set_inline_data` /
//! `ibv_wr_complete`, the same for an 8-byte inline send (`ibv_wr_send`) and an 8-byte RDMA
//! read into one buffer (`ibv_wr_rdma_read` / `ibv_wr_set_sge`), `ibv_poll_cq` of one
//! completion, `ibv_start_poll` / `ibv_end_poll` of one, and `ibv_post_recv` of one 8-byte
//! buffer.
//!
//! Each extended post is written out whole, as a C program writes it, not through a shared
//! helper taking the opcode's calls as a closure: the helper moved the request's fields
//! into registers before `ibv_wr_start` and spilled them across it, and the baseline grew
//! (the read 224 -> 232, the send 231 -> 235 in the rxe VM), which would flatter the crate.

use super::device::Context;
use super::ex::{ApiChoice, SendOps};
use super::objects::{ConnLimits, Cq, Endpoint, Mr, Pd, Qp, Timing};
use crate::error::{Error, Result};
use mlx5::request::Access;
use rdma_sys as ffi;
use std::sync::Arc;

/// Two connected RC QPs (`a` writes and sends to `b`) with prepared work requests.
pub struct Plain {
    a: Qp,
    b: Qp,
    cq_a: Arc<Cq>,
    cq_b: Arc<Cq>,
    mr_b: Mr,
    write: ffi::ibv_send_wr,
    send: ffi::ibv_send_wr,
    /// An 8-byte RDMA read of `b`'s region at 0 into its bytes at 1024 (one buffer).
    read: ffi::ibv_send_wr,
    msg: Box<[u8; 8]>,
    /// The gather entry of `write` and `send` (they point to it).
    _sge: Box<ffi::ibv_sge>,
    recv: ffi::ibv_recv_wr,
    /// The scatter entry of `recv`.
    _rsge: Box<ffi::ibv_sge>,
    /// The scatter entry of `read`.
    _dsge: Box<ffi::ibv_sge>,
    wc: [ffi::ibv_wc; 1],
    /// The QP's extended send operations (None where the provider lacks them).
    ex: Option<SendOps>,
}

// SAFETY: the work requests point only into this value's own boxes; the objects are
// thread-safe in rdma-core and every call takes `&mut self`.
unsafe impl Send for Plain {}

impl std::fmt::Debug for Plain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plain")
            .field("a", &self.a.qpn())
            .field("b", &self.b.qpn())
            .finish()
    }
}

fn connect(qp: &Qp, ctx: &Context, to: &Qp, gid_index: Option<i32>) -> Result<()> {
    let port = ctx.port(1)?;
    let gid = match gid_index {
        Some(i) => ctx.gid(1, i)?,
        None => [0; 16],
    };
    let remote = Endpoint {
        qpn: to.qpn(),
        psn: 0,
        gid,
        lid: port.lid,
        mtu: port.active_mtu,
        max_dest_rd_atomic: 1,
    };
    let lim = ConnLimits {
        local_mtu: port.active_mtu,
        max_qp_rd_atom: 1,
        max_qp_init_rd_atom: 1,
        remote_dest_rd_atomic: remote.max_dest_rd_atomic,
    };
    let t = Timing::default();
    qp.to_init(1)?;
    qp.to_rtr(&remote, 1, gid_index, &t, &lim)?;
    qp.to_rts(0, &t, &lim)?;
    Ok(())
}

impl Plain {
    /// The pair on device `name` (port 1, source GID `gid_index` on RoCE), with the
    /// extended APIs where the provider has them (the plain calls work on both kinds).
    ///
    /// # Errors
    /// Any verbs error of the set-up.
    pub fn new(name: &str, gid_index: Option<i32>) -> Result<Plain> {
        let ctx = Arc::new(Context::open(name)?);
        let pd = Arc::new(Pd::new(ctx.clone())?);
        let cq_a = Arc::new(Cq::new(ctx.clone(), 64, ApiChoice::Auto)?);
        let cq_b = Arc::new(Cq::new(ctx.clone(), 64, ApiChoice::Auto)?);
        let caps = super::objects::Caps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 64,
        };
        let a = Qp::new(
            pd.clone(),
            cq_a.clone(),
            cq_a.clone(),
            caps,
            false,
            ApiChoice::Auto,
        )?;
        let b = Qp::new(
            pd.clone(),
            cq_b.clone(),
            cq_b.clone(),
            caps,
            false,
            ApiChoice::Auto,
        )?;
        connect(&a, &ctx, &b, gid_index)?;
        connect(&b, &ctx, &a, gid_index)?;
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr_b = Mr::alloc(pd.clone(), 4096, rights)?;
        let (addr_b, _, lkey_b, rkey_b) = mr_b.info();
        let msg = Box::new(*b"12345678");
        let sge = Box::new(ffi::ibv_sge {
            addr: msg.as_ptr() as u64,
            length: 8,
            lkey: 0,
        });
        let rsge = Box::new(ffi::ibv_sge {
            addr: addr_b + 512,
            length: 64,
            lkey: lkey_b,
        });
        let dsge = Box::new(ffi::ibv_sge {
            addr: addr_b + 1024,
            length: 8,
            lkey: lkey_b,
        });
        // SAFETY: all-zero work requests are valid; the fields that matter are set.
        let mut write: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        write.sg_list = &*sge as *const _ as *mut _;
        write.num_sge = 1;
        write.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        write.send_flags =
            ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 | ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        write.wr.rdma = ffi::rdma_t {
            remote_addr: addr_b,
            rkey: rkey_b,
        };
        // SAFETY: as above.
        let mut send: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        send.sg_list = write.sg_list;
        send.num_sge = 1;
        send.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        send.send_flags = write.send_flags;
        // SAFETY: as above.
        let mut read: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        read.sg_list = &*dsge as *const _ as *mut _;
        read.num_sge = 1;
        read.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
        read.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        read.wr.rdma = ffi::rdma_t {
            remote_addr: addr_b,
            rkey: rkey_b,
        };
        // SAFETY: as above.
        let mut recv: ffi::ibv_recv_wr = unsafe { std::mem::zeroed() };
        recv.sg_list = &*rsge as *const _ as *mut _;
        recv.num_sge = 1;
        // SAFETY: `a` is live while the ops are used (both in this value).
        let ex = unsafe { SendOps::of(a.qp) };
        Ok(Plain {
            a,
            b,
            cq_a,
            cq_b,
            mr_b,
            write,
            send,
            read,
            msg,
            _sge: sge,
            recv,
            _rsge: rsge,
            _dsge: dsge,
            // SAFETY: an all-zero ibv_wc is valid.
            wc: unsafe { std::mem::zeroed() },
            ex,
        })
    }

    /// Whether the QP has the extended send operations and its CQ the extended polling.
    pub fn has_extended(&self) -> bool {
        self.ex.is_some() && self.cq_a.poll_ops.is_some()
    }

    /// `ibv_post_send` of the prepared 8-byte inline RDMA write (signaled).
    #[inline(never)]
    pub fn post_send(&mut self, wr_id: u64) -> i32 {
        self.write.wr_id = wr_id;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the request and its gather entry live in `self`.
        unsafe { ffi::ibv_post_send(self.a.qp, &mut self.write, &mut bad) }
    }

    /// The same write with `ibv_wr_start`, `ibv_wr_rdma_write`, `ibv_wr_set_inline_data`,
    /// `ibv_wr_complete`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without the extended operations.
    #[inline(never)]
    pub fn post_wr(&mut self, wr_id: u64) -> Result<i32> {
        if self.ex.is_none() {
            return Err(Error::Unsupported("ibv_wr_* on this QP"));
        }
        // SAFETY: live QP created with the extended operations (checked by `SendOps::of`,
        // so every pointer called is set); the calls are verbs.h's inlines, in its order;
        // the inline data is `self.msg`, copied by the call.
        unsafe {
            let q = ffi::ibv_qp_to_qp_ex(self.a.qp);
            let x = &mut *q;
            x.wr_start.unwrap_unchecked()(q);
            x.wr_id = wr_id;
            x.wr_flags = self.write.send_flags;
            x.wr_rdma_write.unwrap_unchecked()(
                q,
                self.write.wr.rdma.rkey,
                self.write.wr.rdma.remote_addr,
            );
            x.wr_set_inline_data.unwrap_unchecked()(q, self.msg.as_mut_ptr().cast(), 8);
            Ok(x.wr_complete.unwrap_unchecked()(q))
        }
    }

    /// `ibv_post_send` of the prepared 8-byte inline send from `a` to `b` (signaled; `b`
    /// must have a receive posted).
    #[inline(never)]
    pub fn post_send_inline(&mut self, wr_id: u64) -> i32 {
        self.send.wr_id = wr_id;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the request and its gather entry live in `self`.
        unsafe { ffi::ibv_post_send(self.a.qp, &mut self.send, &mut bad) }
    }

    /// The same send with `ibv_wr_start`, `ibv_wr_send`, `ibv_wr_set_inline_data`,
    /// `ibv_wr_complete`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without the extended operations.
    #[inline(never)]
    pub fn post_wr_send(&mut self, wr_id: u64) -> Result<i32> {
        if self.ex.is_none() {
            return Err(Error::Unsupported("ibv_wr_* on this QP"));
        }
        // SAFETY: as in `post_wr`.
        unsafe {
            let q = ffi::ibv_qp_to_qp_ex(self.a.qp);
            let x = &mut *q;
            x.wr_start.unwrap_unchecked()(q);
            x.wr_id = wr_id;
            x.wr_flags = self.send.send_flags;
            x.wr_send.unwrap_unchecked()(q);
            x.wr_set_inline_data.unwrap_unchecked()(q, self.msg.as_mut_ptr().cast(), 8);
            Ok(x.wr_complete.unwrap_unchecked()(q))
        }
    }

    /// `ibv_post_send` of the prepared 8-byte RDMA read into one buffer (signaled).
    #[inline(never)]
    pub fn post_read(&mut self, wr_id: u64) -> i32 {
        self.read.wr_id = wr_id;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the request and its scatter entry live in `self`.
        unsafe { ffi::ibv_post_send(self.a.qp, &mut self.read, &mut bad) }
    }

    /// The same read with `ibv_wr_start`, `ibv_wr_rdma_read`, `ibv_wr_set_sge`,
    /// `ibv_wr_complete`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without the extended operations.
    #[inline(never)]
    pub fn post_wr_read(&mut self, wr_id: u64) -> Result<i32> {
        if self.ex.is_none() {
            return Err(Error::Unsupported("ibv_wr_* on this QP"));
        }
        // SAFETY: as in `post_wr`; the scatter entry's buffer is `b`'s region, in the same
        // protection domain as `a`.
        unsafe {
            let q = ffi::ibv_qp_to_qp_ex(self.a.qp);
            let x = &mut *q;
            let d = &*self.read.sg_list;
            x.wr_start.unwrap_unchecked()(q);
            x.wr_id = wr_id;
            x.wr_flags = self.read.send_flags;
            x.wr_rdma_read.unwrap_unchecked()(
                q,
                self.read.wr.rdma.rkey,
                self.read.wr.rdma.remote_addr,
            );
            x.wr_set_sge.unwrap_unchecked()(q, d.lkey, d.addr, d.length);
            Ok(x.wr_complete.unwrap_unchecked()(q))
        }
    }

    /// `ibv_post_send` of an 8-byte inline send from `a` to `b` (not measured).
    ///
    /// # Errors
    /// The `ibv_post_send` error.
    pub fn send(&mut self, wr_id: u64) -> Result<()> {
        self.send.wr_id = wr_id;
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in `post_send`.
        let rc = unsafe { ffi::ibv_post_send(self.a.qp, &mut self.send, &mut bad) };
        if rc != 0 {
            return Err(Error::Verbs(super::code("ibv_post_send", rc)));
        }
        Ok(())
    }

    /// `ibv_post_recv` of the prepared 64-byte receive on `b`.
    #[inline(never)]
    pub fn post_recv(&mut self, wr_id: u64) -> i32 {
        self.recv.wr_id = wr_id;
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the request and its scatter entry live in `self`.
        unsafe { ffi::ibv_post_recv(self.b.qp, &mut self.recv, &mut bad) }
    }

    /// `ibv_poll_cq` of one completion of `a`'s CQ; its (wr_id, status) when there was one.
    #[inline(never)]
    pub fn poll_cq(&mut self) -> Option<(u64, u32)> {
        // SAFETY: live CQ; room for one entry.
        let n = unsafe { ffi::ibv_poll_cq(self.cq_a.cq, 1, self.wc.as_mut_ptr()) };
        (n == 1).then(|| (self.wc[0].wr_id, self.wc[0].status))
    }

    /// `ibv_start_poll`, reading `wr_id` and `status`, `ibv_end_poll` on `a`'s CQ.
    #[inline(never)]
    pub fn start_poll(&mut self) -> Option<(u64, u32)> {
        let ops = self.cq_a.poll_ops?;
        // SAFETY: live CQ polled only here; end follows a successful start.
        unsafe {
            if ops.start() != 0 {
                return None;
            }
            let (wr_id, status) = {
                use super::ex::WcRead;
                let wc = ops.current();
                (wc.wr_id(), wc.status())
            };
            ops.end();
            Some((wr_id, status))
        }
    }

    /// `ibv_poll_cq` of one completion of `b`'s CQ (not measured).
    pub fn poll_b(&mut self) -> Option<(u64, u32)> {
        // SAFETY: live CQ; room for one entry.
        let n = unsafe { ffi::ibv_poll_cq(self.cq_b.cq, 1, self.wc.as_mut_ptr()) };
        (n == 1).then(|| (self.wc[0].wr_id, self.wc[0].status))
    }

    /// The byte at `off` of `b`'s region (the writes land at 0..8); None past its end.
    pub fn b_byte(&self, off: usize) -> Option<u8> {
        let (addr, len, _, _) = self.mr_b.info();
        if off >= len as usize {
            return None;
        }
        // SAFETY: inside the live region; a volatile read of memory the device writes (a
        // torn value is harmless for a byte).
        Some(unsafe { std::ptr::read_volatile((addr as *const u8).add(off)) })
    }

    /// Sets the first byte of the message the writes and sends carry.
    pub fn set_tag(&mut self, tag: u8) {
        self.msg[0] = tag;
    }
}
