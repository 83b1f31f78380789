//! Safe handles over the C oracle: one request = one `ibv_wr_*` builder, the setters its QP
//! type needs, in the order rdma-core's man page gives (`ibv_wr_post(3)`), checked here before
//! any C call so that no setter ever runs without its builder.

use crate::ffi;
use crate::{IbvDataBuf, IbvSge, QpKind, SrqGeometry};

/// The send operation of one work request (the `ibv_wr_*` builder).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `ibv_wr_rdma_write`.
    Write {
        /// Remote key.
        rkey: u32,
        /// Remote address.
        raddr: u64,
    },
    /// `ibv_wr_rdma_write_imm` (immediate in host order; the oracle passes `htobe32`).
    WriteImm {
        /// Remote key.
        rkey: u32,
        /// Remote address.
        raddr: u64,
        /// Immediate, host order.
        imm: u32,
    },
    /// `ibv_wr_rdma_read`.
    Read {
        /// Remote key.
        rkey: u32,
        /// Remote address.
        raddr: u64,
    },
    /// `ibv_wr_send`.
    Send,
    /// `ibv_wr_send_imm` (host order).
    SendImm {
        /// Immediate, host order.
        imm: u32,
    },
    /// `ibv_wr_send_inv`.
    SendInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
    /// `ibv_wr_atomic_cmp_swp`.
    CmpSwp {
        /// Remote key.
        rkey: u32,
        /// Remote address.
        raddr: u64,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// `ibv_wr_atomic_fetch_add`.
    FetchAdd {
        /// Remote key.
        rkey: u32,
        /// Remote address.
        raddr: u64,
        /// Addend.
        add: u64,
    },
    /// `ibv_wr_bind_mw` (always a type-2 window in this API).
    BindMw {
        /// The window's current rkey.
        mw_rkey: u32,
        /// The new rkey.
        new_rkey: u32,
        /// The region's lkey.
        mr_lkey: u32,
        /// Start of the range.
        addr: u64,
        /// Length (0 unbinds).
        length: u64,
        /// `IBV_ACCESS_*` rights.
        access: u32,
    },
    /// `ibv_wr_local_inv`.
    LocalInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
}

impl Op {
    /// Whether the builder finishes the WQE by itself (no data setter follows).
    fn is_complete_alone(&self) -> bool {
        matches!(self, Op::BindMw { .. } | Op::LocalInv { .. })
    }
}

/// The data setter of one work request.
#[derive(Copy, Clone, Debug)]
pub enum Data<'a> {
    /// `ibv_wr_set_sge`.
    Sge(IbvSge),
    /// `ibv_wr_set_sge_list`.
    SgeList(&'a [IbvSge]),
    /// `ibv_wr_set_inline_data`.
    Inline(&'a [u8]),
    /// `ibv_wr_set_inline_data_list`.
    InlineList(&'a [&'a [u8]]),
}

/// The address setter (UD and DCI QPs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    /// RC: none.
    None,
    /// `ibv_wr_set_ud_addr` with an address handle whose `mlx5_wqe_av` is `av`.
    Ud {
        /// The 48 bytes of the address vector.
        av: [u8; 48],
        /// Remote QP number.
        qpn: u32,
        /// Remote Q_Key.
        qkey: u32,
    },
    /// `mlx5dv_wr_set_dc_addr` with an address handle whose `mlx5_wqe_av` is `av`.
    Dc {
        /// The 48 bytes of the address vector.
        av: [u8; 48],
        /// Remote DCT number.
        dctn: u32,
        /// DC access key.
        dc_key: u64,
    },
}

/// One work request as a program hands it to rdma-core's `ibv_wr_*` API.
#[derive(Copy, Clone, Debug)]
pub struct Wr<'a> {
    /// `qpx->wr_id`.
    pub wr_id: u64,
    /// `qpx->wr_flags` (`IBV_SEND_*`).
    pub flags: u32,
    /// The builder.
    pub op: Op,
    /// The address setter (UD / DCI).
    pub addr: Addr,
    /// The data setter; `None` for bind / local invalidate (an RC request that needs one
    /// gets an empty `ibv_wr_set_sge_list`).
    pub data: Option<Data<'a>>,
}

/// The data of a classic-API request (`ibv_send_wr.sg_list`).
#[derive(Copy, Clone, Debug)]
pub enum ClassicData<'a> {
    /// A gather list (addresses never dereferenced).
    Sgl(&'a [IbvSge]),
    /// `IBV_SEND_INLINE`: the list points at these bytes, which rdma-core copies.
    Inline(&'a [&'a [u8]]),
}

/// One request of rdma-core's classic API (`ibv_post_send` -> `mlx5_post_send`).
#[derive(Copy, Clone, Debug)]
pub struct ClassicWr<'a> {
    /// `wr_id`.
    pub wr_id: u64,
    /// `send_flags` (`IBV_SEND_*`; `IBV_SEND_INLINE` is added for [`ClassicData::Inline`]).
    pub flags: u32,
    /// The operation (as the `ibv_wr_*` builders name them).
    pub op: Op,
    /// For [`Op::BindMw`]: a type-1 window (`ibv_bind_mw`'s path) rather than type 2.
    pub type1: bool,
    /// RC: [`Addr::None`]; UD: [`Addr::Ud`] (`wr.ud`). DC has no classic API.
    pub addr: Addr,
    /// `sg_list` / `num_sge`.
    pub data: ClassicData<'a>,
}

/// A memory-backed rdma-core mlx5 QP (see the crate docs).
pub struct OracleQp {
    raw: *mut ffi::OracleQp,
    kind: QpKind,
    wqe_cnt: usize,
    /// (entries, stride bytes) of the receive queue, once set up.
    rq: Option<(usize, usize)>,
}

/// Largest `max_gs` / `max_inline` accepted: a WQE then fits 16 blocks, so the ring (at
/// least 16 blocks) never holds a WQE longer than itself.
pub const MAX_GS: usize = 30;
/// See [`MAX_GS`].
pub const MAX_INLINE: usize = 512;

impl OracleQp {
    /// A QP of `kind` with a send ring of `wqe_cnt` 64-byte blocks (a power of two, at least
    /// 16), `max_inline` inline bytes and `max_gs` gather entries, its function pointers
    /// filled by rdma-core's `mlx5_qp_fill_wr_pfns`. The ring starts zeroed; the producer
    /// index at 0.
    ///
    /// # Panics
    /// On a geometry outside those bounds, or when rdma-core refuses the QP.
    pub fn new(kind: QpKind, qpn: u32, wqe_cnt: usize, max_inline: usize, max_gs: usize) -> Self {
        assert!(wqe_cnt.is_power_of_two() && (16..=1 << 16).contains(&wqe_cnt));
        assert!(max_inline <= MAX_INLINE && (1..=MAX_GS).contains(&max_gs));
        // SAFETY: plain values; the C function allocates and returns an owned object or NULL.
        let raw = unsafe {
            ffi::oracle_qp_new(
                kind as i32,
                qpn,
                wqe_cnt as u32,
                max_inline as i32,
                max_gs as i32,
            )
        };
        assert!(
            !raw.is_null(),
            "rdma-core refused the QP (mlx5_qp_fill_wr_pfns)"
        );
        OracleQp {
            raw,
            kind,
            wqe_cnt,
            rq: None,
        }
    }

    /// The send ring (`wqe_cnt * 64` bytes).
    pub fn ring(&self) -> &[u8] {
        // SAFETY: the ring is `wqe_cnt << 6` bytes owned by the live oracle QP; no C code runs
        // while the borrow of `self` lasts (every C call takes `&mut self`).
        unsafe { std::slice::from_raw_parts(ffi::oracle_qp_ring(self.raw), self.wqe_cnt * 64) }
    }

    /// The send ring, writable (to fill it with a pattern before posting).
    pub fn ring_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `ring`, and the `&mut self` borrow makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(ffi::oracle_qp_ring(self.raw), self.wqe_cnt * 64) }
    }

    /// The BlueFlame "register": two buffers of 256 bytes (`bf->offset` alternates).
    pub fn bf_reg(&self) -> &[u8] {
        // SAFETY: `bf_reg` is a 512-byte array inside the live oracle object.
        unsafe { std::slice::from_raw_parts(ffi::oracle_qp_bf_reg(self.raw), 512) }
    }

    /// `bf->offset`.
    pub fn bf_offset(&self) -> u32 {
        // SAFETY: reads one field of the live object.
        unsafe { ffi::oracle_qp_bf_offset(self.raw) }
    }

    /// Empties the queue and puts its producer index at `cur_post` (16-bit counter in the
    /// control segment, ring slot `cur_post % wqe_cnt`).
    pub fn set_cur_post(&mut self, cur_post: u32) {
        // SAFETY: writes three integer fields of the live object.
        unsafe { ffi::oracle_qp_set_cur_post(self.raw, cur_post) }
    }

    /// `sq.cur_post`: the producer index after the last post, in blocks.
    pub fn cur_post(&self) -> u32 {
        // SAFETY: reads one field.
        unsafe { ffi::oracle_qp_cur_post(self.raw) }
    }

    /// The send doorbell record (`dbrec[MLX5_SND_DBR]`), host order.
    pub fn sq_dbrec(&self) -> u32 {
        // SAFETY: reads the doorbell record inside the live object.
        unsafe { ffi::oracle_qp_sq_dbrec(self.raw) }
    }

    /// Gives the QP a receive queue of `wqe_cnt` entries (a power of two) for `max_gs`
    /// scatter entries (1..=64), laid out as rdma-core's `mlx5_calc_rq_size` lays it out
    /// without WQE signatures: a stride of `max_gs` data segments rounded up to a power of
    /// two. Returns the stride in bytes.
    ///
    /// # Panics
    /// On another geometry, or a second call.
    pub fn setup_rq(&mut self, wqe_cnt: usize, max_gs: usize) -> usize {
        assert!(wqe_cnt.is_power_of_two() && wqe_cnt <= 1 << 14 && (1..=64).contains(&max_gs));
        assert!(self.rq.is_none(), "one receive queue per QP");
        // SAFETY: the C function checks the geometry and allocates the queue it owns.
        let rc = unsafe { ffi::oracle_qp_rq_setup(self.raw, wqe_cnt as u32, max_gs as i32) };
        assert_eq!(rc, 0, "oracle_qp_rq_setup");
        let stride = (max_gs * 16).next_power_of_two().max(16);
        self.rq = Some((wqe_cnt, stride));
        stride
    }

    /// The receive queue's buffer (`wqe_cnt * stride` bytes).
    ///
    /// # Panics
    /// Before [`OracleQp::setup_rq`].
    pub fn rq_buf(&self) -> &[u8] {
        let (n, stride) = self.rq.expect("setup_rq first");
        // SAFETY: the buffer is `n * stride` bytes owned by the live QP; C runs only under
        // `&mut self`.
        unsafe { std::slice::from_raw_parts(ffi::oracle_qp_rq_buf(self.raw), n * stride) }
    }

    /// The receive queue's buffer, writable (to fill it with a pattern).
    ///
    /// # Panics
    /// Before [`OracleQp::setup_rq`].
    pub fn rq_buf_mut(&mut self) -> &mut [u8] {
        let (n, stride) = self.rq.expect("setup_rq first");
        // SAFETY: as `rq_buf`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(ffi::oracle_qp_rq_buf(self.raw), n * stride) }
    }

    /// rdma-core's `mlx5_post_recv` of one receive (the queue emptied first, as if every
    /// earlier receive had completed): 0 or its errno (`EINVAL` when the list has more
    /// entries, empty ones included, than `max_gs`).
    ///
    /// # Panics
    /// Before [`OracleQp::setup_rq`], or with more than 64 entries.
    pub fn post_recv(&mut self, wr_id: u64, sgl: &[IbvSge]) -> i32 {
        assert!(self.rq.is_some(), "setup_rq first");
        assert!(sgl.len() <= 64);
        // SAFETY: the list is live for the call and only read; rdma-core refuses more
        // entries than the stride holds before writing, and writes inside its queue.
        unsafe { ffi::oracle_qp_post_recv(self.raw, wr_id, sgl.as_ptr(), sgl.len() as i32) }
    }

    /// `rq.head`: receives posted.
    pub fn rq_head(&self) -> u32 {
        // SAFETY: reads one field.
        unsafe { ffi::oracle_qp_rq_head(self.raw) }
    }

    /// The receive doorbell record (`dbrec[MLX5_RCV_DBR]`), host order.
    pub fn rq_dbrec(&self) -> u32 {
        // SAFETY: reads the doorbell record inside the live object.
        unsafe { ffi::oracle_qp_rq_dbrec(self.raw) }
    }

    /// rdma-core's classic `mlx5_post_send` of one request (the queue emptied first, as if
    /// every earlier request had completed): 0 or its errno.
    ///
    /// # Panics
    /// On a DC address, an address that does not fit the QP's kind, a list of more than 64
    /// entries or more than [`MAX_INLINE`] inline bytes.
    pub fn post_send(&mut self, wr: &ClassicWr<'_>) -> i32 {
        let (opcode, rkey, raddr, compare_add, swap, imm) = match wr.op {
            Op::Write { rkey, raddr } => (0, rkey, raddr, 0, 0, 0),
            Op::WriteImm { rkey, raddr, imm } => (1, rkey, raddr, 0, 0, imm),
            Op::Send => (2, 0, 0, 0, 0, 0),
            Op::SendImm { imm } => (3, 0, 0, 0, 0, imm),
            Op::Read { rkey, raddr } => (4, rkey, raddr, 0, 0, 0),
            Op::CmpSwp {
                rkey,
                raddr,
                compare,
                swap,
            } => (5, rkey, raddr, compare, swap, 0),
            Op::FetchAdd { rkey, raddr, add } => (6, rkey, raddr, add, 0, 0),
            Op::LocalInv { rkey } => (7, rkey, 0, 0, 0, 0),
            Op::BindMw { .. } => (8, 0, 0, 0, 0, 0),
            Op::SendInv { rkey } => (9, rkey, 0, 0, 0, 0),
        };
        let (mw_rkey, new_rkey, mr_lkey, bind_addr, bind_len, bind_access) = match wr.op {
            Op::BindMw {
                mw_rkey,
                new_rkey,
                mr_lkey,
                addr,
                length,
                access,
            } => (mw_rkey, new_rkey, mr_lkey, addr, length, access),
            _ => (0, 0, 0, 0, 0, 0),
        };
        let (av, remote_qpn, remote_qkey) = match (self.kind, wr.addr) {
            (QpKind::Rc, Addr::None) => (None, 0, 0),
            (QpKind::Ud, Addr::Ud { av, qpn, qkey }) => (Some(av), qpn, qkey),
            (k, a) => panic!("{a:?} on a {k:?} QP through the classic API"),
        };
        let pieces: Vec<IbvSge>;
        let (sgl, flags) = match wr.data {
            ClassicData::Sgl(l) => (l, wr.flags & !crate::IBV_SEND_INLINE),
            ClassicData::Inline(bufs) => {
                let n: usize = bufs.iter().map(|b| b.len()).sum();
                assert!(n <= MAX_INLINE, "inline over {MAX_INLINE}");
                pieces = bufs
                    .iter()
                    .map(|b| IbvSge {
                        addr: b.as_ptr() as u64,
                        length: b.len() as u32,
                        lkey: 0,
                    })
                    .collect();
                (&pieces[..], wr.flags | crate::IBV_SEND_INLINE)
            }
        };
        assert!(sgl.len() <= 64, "a list of at most 64 entries");
        let w = ffi::SendWr {
            wr_id: wr.wr_id,
            opcode,
            send_flags: flags,
            imm_host: imm,
            rkey,
            raddr,
            compare_add,
            swap,
            mw_rkey,
            mw_type: if wr.type1 { 1 } else { 2 },
            new_rkey,
            mr_lkey,
            bind_addr,
            bind_len,
            bind_access,
            num_sge: sgl.len() as i32,
            sgl: sgl.as_ptr(),
            av: av.as_ref().map_or(std::ptr::null(), |a| a.as_ptr()),
            remote_qpn,
            remote_qkey,
        };
        // SAFETY: `w` and everything it points at (the list, the inline bytes the list
        // points at when IBV_SEND_INLINE is set, the AV) live until the call returns and are
        // only read; rdma-core refuses more entries than the QP's max_gs and more inline
        // bytes than its max_inline_data before writing, and the bounds above keep the WQE
        // inside the ring.
        unsafe { ffi::oracle_post_send(self.raw, &w) }
    }

    /// Posts `wrs` as one `ibv_wr_start` .. `ibv_wr_complete` batch and returns what
    /// `ibv_wr_complete` returned (0, or the errno of the first refused request: then
    /// rdma-core rolled the whole batch back).
    ///
    /// # Panics
    /// If a request does not fit this QP's kind (an RC op on a UD QP, a missing address),
    /// has a data setter where the builder takes none, or is longer than [`MAX_GS`] entries /
    /// [`MAX_INLINE`] bytes (rdma-core refuses what exceeds the QP's own `max_gs` /
    /// `max_inline` itself, without writing; these bounds keep any WQE inside the ring).
    pub fn post(&mut self, wrs: &[Wr<'_>]) -> i32 {
        for wr in wrs {
            self.check(wr);
        }
        let q = self.raw;
        // SAFETY: (whole block) `q` is the live oracle QP; every builder is followed by the
        // setters its QP type needs before the next builder or the completion (checked by
        // `check`), so each setter writes through the `cur_ctrl` / `cur_data` its builder set;
        // the pointers given (gather lists, inline bytes, AV bytes) are live for the call and
        // only read by rdma-core, which copies what it needs into the ring.
        unsafe {
            ffi::oracle_qp_retire_all(q);
            ffi::oracle_wr_start(q);
            for wr in wrs {
                ffi::oracle_wr_next(q, wr.wr_id, wr.flags);
                match wr.op {
                    Op::Write { rkey, raddr } => ffi::oracle_wr_rdma_write(q, rkey, raddr),
                    Op::WriteImm { rkey, raddr, imm } => {
                        ffi::oracle_wr_rdma_write_imm(q, rkey, raddr, imm)
                    }
                    Op::Read { rkey, raddr } => ffi::oracle_wr_rdma_read(q, rkey, raddr),
                    Op::Send => ffi::oracle_wr_send(q),
                    Op::SendImm { imm } => ffi::oracle_wr_send_imm(q, imm),
                    Op::SendInv { rkey } => ffi::oracle_wr_send_inv(q, rkey),
                    Op::CmpSwp {
                        rkey,
                        raddr,
                        compare,
                        swap,
                    } => ffi::oracle_wr_atomic_cmp_swp(q, rkey, raddr, compare, swap),
                    Op::FetchAdd { rkey, raddr, add } => {
                        ffi::oracle_wr_atomic_fetch_add(q, rkey, raddr, add)
                    }
                    Op::BindMw {
                        mw_rkey,
                        new_rkey,
                        mr_lkey,
                        addr,
                        length,
                        access,
                    } => {
                        ffi::oracle_wr_bind_mw(q, mw_rkey, new_rkey, mr_lkey, addr, length, access)
                    }
                    Op::LocalInv { rkey } => ffi::oracle_wr_local_inv(q, rkey),
                }
                if wr.op.is_complete_alone() {
                    continue;
                }
                match wr.addr {
                    Addr::None => {}
                    Addr::Ud { av, qpn, qkey } => {
                        ffi::oracle_wr_set_ud_addr(q, av.as_ptr(), qpn, qkey)
                    }
                    Addr::Dc { av, dctn, dc_key } => {
                        ffi::oracle_wr_set_dc_addr(q, av.as_ptr(), dctn, dc_key)
                    }
                }
                match wr.data {
                    None | Some(Data::SgeList(&[])) => {
                        ffi::oracle_wr_set_sge_list(q, 0, std::ptr::null())
                    }
                    Some(Data::Sge(s)) => ffi::oracle_wr_set_sge(q, s.lkey, s.addr, s.length),
                    Some(Data::SgeList(l)) => ffi::oracle_wr_set_sge_list(q, l.len(), l.as_ptr()),
                    Some(Data::Inline(b)) => ffi::oracle_wr_set_inline_data(q, b.as_ptr(), b.len()),
                    Some(Data::InlineList(bufs)) => {
                        let v: Vec<IbvDataBuf> = bufs
                            .iter()
                            .map(|b| IbvDataBuf {
                                addr: b.as_ptr(),
                                length: b.len(),
                            })
                            .collect();
                        ffi::oracle_wr_set_inline_data_list(q, v.len(), v.as_ptr())
                    }
                }
            }
            ffi::oracle_wr_complete(q)
        }
    }

    #[track_caller]
    fn check(&self, wr: &Wr<'_>) {
        let rc_only = matches!(
            wr.op,
            Op::SendInv { .. } | Op::BindMw { .. } | Op::LocalInv { .. }
        );
        let ud_ok = matches!(wr.op, Op::Send | Op::SendImm { .. });
        match self.kind {
            QpKind::Rc => assert_eq!(wr.addr, Addr::None, "RC requests have no address"),
            QpKind::Ud => {
                assert!(ud_ok, "{:?} on a UD QP", wr.op);
                assert!(matches!(wr.addr, Addr::Ud { .. }), "UD needs Addr::Ud");
            }
            QpKind::Dci => {
                assert!(!rc_only, "{:?} on a DCI", wr.op);
                assert!(matches!(wr.addr, Addr::Dc { .. }), "a DCI needs Addr::Dc");
            }
        }
        if wr.op.is_complete_alone() {
            assert!(wr.data.is_none(), "{:?} takes no data setter", wr.op);
        }
        match wr.data {
            Some(Data::SgeList(l)) => assert!(l.len() <= MAX_GS, "list over {MAX_GS}"),
            Some(Data::Inline(b)) => assert!(b.len() <= MAX_INLINE, "inline over {MAX_INLINE}"),
            Some(Data::InlineList(l)) => {
                let n: usize = l.iter().map(|b| b.len()).sum();
                assert!(n <= MAX_INLINE, "inline over {MAX_INLINE}");
            }
            _ => {}
        }
    }
}

impl Drop for OracleQp {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `oracle_qp_new` and is freed once, here.
        unsafe { ffi::oracle_qp_free(self.raw) }
    }
}

/// A memory-backed rdma-core mlx5 SRQ: buffer sized and linked by rdma-core's
/// `mlx5_alloc_srq_buf`, posted to with `mlx5_post_srq_recv`.
pub struct OracleSrq {
    raw: *mut ffi::OracleSrq,
}

impl OracleSrq {
    /// An SRQ for `max_wr` receives of `max_gs` entries, as `mlx5_create_srq` sizes it.
    ///
    /// # Panics
    /// When rdma-core refuses the geometry.
    pub fn new(max_wr: u32, max_gs: u32) -> Self {
        assert!(max_wr <= 1 << 14 && max_gs <= 64);
        // SAFETY: plain values; returns an owned object or NULL.
        let raw = unsafe { ffi::oracle_srq_new(max_wr, max_gs as i32) };
        assert!(
            !raw.is_null(),
            "rdma-core refused the SRQ (mlx5_alloc_srq_buf)"
        );
        OracleSrq { raw }
    }

    /// The WQE buffer (main queue then wait queue).
    pub fn buf(&self) -> &[u8] {
        // SAFETY: the buffer is `max << wqe_shift` bytes owned by the live SRQ; C runs only
        // under `&mut self`.
        unsafe {
            let len = ffi::oracle_srq_buf_len(self.raw);
            std::slice::from_raw_parts(ffi::oracle_srq_buf(self.raw), len)
        }
    }

    /// rdma-core's sizes and indices.
    pub fn geometry(&self) -> SrqGeometry {
        let mut g = SrqGeometry::default();
        // SAFETY: writes one `repr(C)` struct through a valid pointer.
        unsafe { ffi::oracle_srq_geometry(self.raw, &mut g) };
        g
    }

    /// `mlx5_post_srq_recv` of one receive: 0, or its errno (`EINVAL` over `max_gs`, `ENOMEM`
    /// when full).
    pub fn post_recv(&mut self, wr_id: u64, sgl: &[IbvSge]) -> i32 {
        let n = i32::try_from(sgl.len()).expect("a short list");
        // SAFETY: the list is live for the call and only read; rdma-core checks `n` against
        // `max_gs` before writing, and writes inside its own buffer.
        unsafe { ffi::oracle_srq_post_recv(self.raw, wr_id, sgl.as_ptr(), n) }
    }
}

impl Drop for OracleSrq {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `oracle_srq_new` and is freed once, here.
        unsafe { ffi::oracle_srq_free(self.raw) }
    }
}
