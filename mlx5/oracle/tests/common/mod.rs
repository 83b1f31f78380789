//! The harness every oracle test uses: one request posted through rdma-core's provider
//! ([`OracleQp`]) and encoded by the `mlx5` crate into a ring of the same size, pattern and
//! producer index; then the two rings are compared byte for byte.
#![allow(dead_code)]

use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
use mlx5::wqe::{self, Limits, Span};
use mlx5::{Payload, Request};
use mlx5_oracle::{
    Addr, Data, IbvSge, Op, OracleQp, QpKind, Wr, IBV_SEND_FENCE, IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
};

pub const QPN: u32 = 0x00ab_cdef;
pub const MAX_INLINE: usize = 512;
pub const MAX_GS: usize = 30;

/// How a request's data reaches rdma-core: which setter a program calls.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Setter {
    /// `ibv_wr_set_sge_list` / `ibv_wr_set_inline_data`.
    List,
    /// `ibv_wr_set_sge` for a one-entry list; `ibv_wr_set_inline_data_list` with the inline
    /// bytes cut in pieces of this many bytes (at least 1).
    Pieces(usize),
}

/// The crate's flags for verbs' `IBV_SEND_*`, as rdma-core's `_common_wqe_init_op` composes
/// `fm_ce_se` (with `fence_after_bind`: the initiator small fence rdma-core keeps in
/// `fm_cache` after a bind or local invalidate, which the crate's send queue keeps as its
/// `next_fence`).
pub fn fm_ce_se(ibv_flags: u32, fence_after_bind: bool) -> FmCeSe {
    FmCeSe {
        fence: if ibv_flags & IBV_SEND_FENCE != 0 {
            Fence::SmallAndFence
        } else if fence_after_bind {
            Fence::InitiatorSmall
        } else {
            Fence::None
        },
        completion: if ibv_flags & IBV_SEND_SIGNALED != 0 {
            CompletionMode::Always
        } else {
            CompletionMode::OnError
        },
        solicited: ibv_flags & IBV_SEND_SOLICITED != 0,
    }
}

/// Which of the crate's WQE encoders a request goes through.
#[derive(Copy, Clone, Debug)]
pub enum Transport<'a> {
    /// `wqe::encode`.
    Rc,
    /// `mlx5::dc::encode_dc` to this destination.
    Dc(&'a mlx5::dc::DcAddr),
    /// `wqe::encode_ud` with this datagram segment.
    Ud(mlx5::av::DatagramSeg),
}

/// One QP twice: rdma-core's (memory-backed) and a plain ring the crate encodes into.
pub struct Pair {
    pub oracle: OracleQp,
    pub ring: Vec<u8>,
    pub pi: u32,
    pub wqe_cnt: usize,
    fence_after_bind: bool,
    /// Post through rdma-core's classic `ibv_post_send` (`mlx5_post_send`) instead of the
    /// `ibv_wr_*` API.
    pub classic: bool,
    /// (first block, blocks) of every WQE posted, for messages.
    pub wqes: Vec<(u32, usize, String)>,
    /// Ring bytes that legitimately differ (see [`masked`]), with the reason.
    pub masked: Vec<(usize, &'static str)>,
}

/// Bytes of a WQE (offsets from its control segment) that rdma-core leaves as they were in
/// the ring while the crate writes them, for a field the NIC does not read for this request.
/// Everything else must be equal byte for byte.
pub fn masked(req: &Request<'_>) -> Vec<(std::ops::Range<usize>, &'static str)> {
    masked_for(req, false)
}

/// [`masked`] for one of rdma-core's two APIs: the classic `mlx5_post_send` writes `ctrl.imm`
/// for every opcode (`send_ieth`: 0 without an immediate), so nothing is masked there.
pub fn masked_for(req: &Request<'_>, classic: bool) -> Vec<(std::ops::Range<usize>, &'static str)> {
    let mut m = Vec::new();
    let imm_used = matches!(
        req,
        Request::WriteImm { .. }
            | Request::SendImm { .. }
            | Request::SendInv { .. }
            | Request::BindMw(_)
            | Request::LocalInvalidate { .. }
    );
    if !imm_used && !classic {
        // rdma-core's _common_wqe_init_op stores opmod_idx_opcode, zeroes bytes 8..12
        // (signature, dci_stream_channel_id, fm_ce_se) and sets fm_ce_se, qpn_ds; it writes
        // `imm` only for the *_WITH_IMM, SEND_WITH_INV and UMR builders. The crate writes 0.
        m.push((12..16, "ctrl.imm of an opcode without immediate"));
    }
    if let Request::FetchAdd { .. } = req {
        // rdma-core's _set_atomic_seg writes only swap_add for a fetch-and-add; the atomic
        // segment's `compare` (WQE bytes 40..48) keeps what the ring held. The NIC reads no
        // compare value for ATOMIC_FA; the crate writes 0.
        m.push((40..48, "atomic compare of a fetch-and-add"));
    }
    let bind_len = match req {
        Request::BindMw(b) => Some(b.len),
        Request::LocalInvalidate { .. } => Some(0),
        _ => None,
    };
    if let Some(len) = bind_len {
        // The mkey context segment (WQE bytes 64..128). rdma-core's set_umr_mkey_seg writes
        // only the fields the UMR control segment's mkey_mask names (free, qpn_mkey, and for a
        // bind access_flags, start_addr, len); the NIC takes only the masked fields. The crate
        // writes the whole segment (zeroes elsewhere).
        let ctx = 64;
        let why = "mkey context field outside the UMR mkey_mask";
        m.push((ctx + 1..ctx + 2, why)); // reserved1
        m.push((ctx + 3..ctx + 4, why)); // sf
        m.push((ctx + 8..ctx + 16, why)); // reserved2, flags_pd
        m.push((ctx + 32..ctx + 64, why)); // bsf_octword_size .. reserved
        if len == 0 {
            // An unbind / local invalidate: mkey_mask is FREE | MKEY | QPN only.
            m.push((ctx + 2..ctx + 3, why)); // access_flags
            m.push((ctx + 16..ctx + 32, why)); // start_addr, len
        }
    }
    m
}

/// The inline data's length of `req`, when it carries some (an empty inline payload adds no
/// segment).
pub fn inline_len(req: &Request<'_>) -> Option<usize> {
    match req {
        Request::Write {
            data: Payload::Inline(b),
            ..
        }
        | Request::WriteImm {
            data: Payload::Inline(b),
            ..
        }
        | Request::Send {
            data: Payload::Inline(b),
        }
        | Request::SendImm {
            data: Payload::Inline(b),
            ..
        }
        | Request::SendInv {
            data: Payload::Inline(b),
            ..
        } if !b.is_empty() => Some(b.len()),
        _ => None,
    }
}

/// The padding after `req`'s inline segment up to its last 16-byte DS: bytes neither side
/// writes, which the NIC does not read.
pub fn inline_pad(req: &Request<'_>) -> usize {
    inline_len(req).map_or(0, |n| (n + 4).div_ceil(16) * 16 - (n + 4))
}

impl Pair {
    /// Both rings `wqe_cnt` blocks filled with `pattern(i)`, producer index `pi`.
    pub fn new(kind: QpKind, wqe_cnt: usize, pi: u32, pattern: impl Fn(usize) -> u8) -> Pair {
        let mut oracle = OracleQp::new(kind, QPN, wqe_cnt, MAX_INLINE, MAX_GS);
        let ring: Vec<u8> = (0..wqe_cnt * 64).map(&pattern).collect();
        oracle.ring_mut().copy_from_slice(&ring);
        oracle.set_cur_post(pi);
        Pair {
            oracle,
            ring,
            pi,
            wqe_cnt,
            fence_after_bind: false,
            classic: false,
            wqes: Vec::new(),
            masked: Vec::new(),
        }
    }

    /// Encodes `req` with the crate at the current producer index; returns its blocks.
    pub fn encode(&mut self, req: &Request<'_>, ibv_flags: u32) -> usize {
        self.encode_as(req, ibv_flags, Transport::Rc)
    }

    /// [`Pair::encode`] as an RC WQE (`wqe::encode`), a DCI WQE (`mlx5::dc::encode_dc`) or a
    /// UD WQE (`wqe::encode_ud`; `req` a send).
    pub fn encode_as(&mut self, req: &Request<'_>, ibv_flags: u32, t: Transport<'_>) -> usize {
        let lim = Limits {
            max_sge: MAX_GS,
            max_inline: MAX_INLINE,
        };
        let flags = fm_ce_se(ibv_flags, self.fence_after_bind);
        self.fence_after_bind = matches!(req, Request::BindMw(_) | Request::LocalInvalidate { .. });
        let ud = |dgram: mlx5::av::DatagramSeg| match *req {
            Request::Send { data } => wqe::UdSend {
                dgram,
                data,
                imm: None,
            },
            Request::SendImm { data, imm } => wqe::UdSend {
                dgram,
                data,
                imm: Some(imm),
            },
            ref r => panic!("not a UD send: {r:?}"),
        };
        let ds = match t {
            Transport::Rc => wqe::wqe_ds(req, &lim),
            Transport::Dc(_) => mlx5::dc::dc_wqe_ds(req, &lim),
            Transport::Ud(g) => wqe::ud_wqe_ds(&ud(g).data, &lim),
        }
        .expect("a request the crate encodes");
        let bbs = wqe::ds_to_bbs(ds);
        let start = self.pi as usize % self.wqe_cnt;
        let mut span = Span::of_ring(&mut self.ring, start, bbs);
        let pi = self.pi as u16;
        match t {
            Transport::Rc => assert_eq!(wqe::encode(req, ds, pi, QPN, flags, &mut span), bbs),
            Transport::Dc(a) => {
                assert_eq!(
                    mlx5::dc::encode_dc(req, ds, pi, QPN, flags, a, &mut span),
                    bbs
                )
            }
            Transport::Ud(g) => wqe::encode_ud(&ud(g), ds, pi, QPN, flags, &mut span),
        }
        // Offsets of `masked` past the control segment move behind the datagram segment.
        let shift = match t {
            Transport::Rc => 0,
            _ => mlx5::av::AV_BYTES,
        };
        let mut desc = format!("{req:?}");
        desc.truncate(160);
        self.wqes
            .push((self.pi, bbs, format!("{desc} flags {ibv_flags:#x}")));
        let first = (self.pi as usize % self.wqe_cnt) * 64;
        // The new WQE overwrote its bytes: masks of older WQEs there are gone. Neither side
        // writes the padding after inline data nor the tail of the last block, which keep
        // older bytes, and their masks.
        let inline_pad = inline_pad(req);
        let written = ds * 16 - inline_pad;
        let len = self.ring.len();
        self.masked
            .retain(|&(o, _)| (o + len - first) % len >= written);
        for (range, why) in masked_for(req, self.classic) {
            for off in range {
                let off = if off < 16 { off } else { off + shift };
                self.masked.push(((first + off) % self.ring.len(), why));
            }
        }
        self.pi = self.pi.wrapping_add(bbs as u32);
        bbs
    }

    /// Posts `req` on a DCI through rdma-core (builder, `mlx5dv_wr_set_dc_addr` with an AH
    /// whose AV is `c_av`, data setter) and encodes it with `mlx5::dc::encode_dc` to `addr`.
    pub fn post_dc(
        &mut self,
        req: &Request<'_>,
        ibv_flags: u32,
        setter: Setter,
        c_av: [u8; 48],
        addr: &mlx5::dc::DcAddr,
    ) {
        let a = Addr::Dc {
            av: c_av,
            dctn: addr.dctn,
            dc_key: addr.dc_key,
        };
        post_oracle(&mut self.oracle, req, ibv_flags, setter, a);
        self.encode_as(req, ibv_flags, Transport::Dc(addr));
        self.check_indices();
    }

    /// Posts the send `req` on a UD QP through rdma-core (`ibv_wr_set_ud_addr`, or the
    /// classic `wr.ud` when `self.classic`) with an AH whose AV is `c_av`, and encodes it
    /// with `wqe::encode_ud` with `DatagramSeg::ud(av, qpn, qkey)`.
    #[allow(clippy::too_many_arguments)]
    pub fn post_ud(
        &mut self,
        req: &Request<'_>,
        ibv_flags: u32,
        setter: Setter,
        c_av: [u8; 48],
        av: &mlx5::av::Av,
        qpn: u32,
        qkey: u32,
    ) {
        let a = Addr::Ud {
            av: c_av,
            qpn,
            qkey,
        };
        if self.classic {
            post_oracle_classic(&mut self.oracle, req, ibv_flags, a);
        } else {
            post_oracle(&mut self.oracle, req, ibv_flags, setter, a);
        }
        let dgram = mlx5::av::DatagramSeg::ud(av, qpn, qkey);
        self.encode_as(req, ibv_flags, Transport::Ud(dgram));
        self.check_indices();
    }

    /// Posts `req` through rdma-core (one `ibv_wr_start` .. `ibv_wr_complete`) and through
    /// the crate's encoder; checks that both producer indices moved alike.
    pub fn post(&mut self, req: &Request<'_>, ibv_flags: u32, setter: Setter) {
        if self.classic {
            post_oracle_classic(&mut self.oracle, req, ibv_flags, Addr::None);
        } else {
            post_oracle(&mut self.oracle, req, ibv_flags, setter, Addr::None);
        }
        self.encode(req, ibv_flags);
        self.check_indices();
    }

    pub fn check_indices(&self) {
        assert_eq!(
            self.oracle.cur_post(),
            self.pi,
            "sq.cur_post after {:?}",
            self.wqes.last()
        );
        assert_eq!(self.oracle.sq_dbrec(), self.pi & 0xffff, "doorbell record");
    }

    /// Byte-for-byte comparison of the two rings, but for the bytes of [`masked`]. Panics
    /// with the first differing WQE, the offset in it and both bytes.
    #[track_caller]
    pub fn assert_same(&self) {
        let c = self.oracle.ring();
        for (i, (&a, &b)) in c.iter().zip(&self.ring).enumerate() {
            if a == b || self.masked.iter().any(|&(o, _)| o == i) {
                continue;
            }
            let blk = i / 64;
            let owner = self.wqes.iter().rev().find(|(pi, n, _)| {
                let first = *pi as usize % self.wqe_cnt;
                (0..*n).any(|k| (first + k) % self.wqe_cnt == blk)
            });
            let (desc, off) = match owner {
                Some((pi, _, d)) => {
                    let first = *pi as usize % self.wqe_cnt;
                    let rel = (blk + self.wqe_cnt - first) % self.wqe_cnt * 64 + i % 64;
                    (d.clone(), rel)
                }
                None => ("(no WQE)".into(), i % 64),
            };
            panic!(
                "ring byte {i} (block {blk}), byte {off} of WQE [{desc}]: rdma-core {a:#04x}, \
                 mlx5 crate {b:#04x}\n  rdma-core: {}\n  crate:     {}",
                hex(&c[blk * 64..blk * 64 + 64]),
                hex(&self.ring[blk * 64..blk * 64 + 64]),
            );
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| c.iter().map(|x| format!("{x:02x}")).collect::<String>())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The operation a program builds for `req` (`ibv_wr_*` builder or `ibv_post_send` opcode)
/// and the data it sets: `atomic` for an atomic (the `ibv_wr_*` API takes its 8-byte local
/// buffer from the data setter), none for a bind or an invalidate; None for a request no
/// builder makes.
pub fn op_of<'a>(
    req: &Request<'a>,
    atomic: Option<Payload<'a>>,
) -> Option<(Op, Option<Payload<'a>>)> {
    Some(match *req {
        Request::Write { remote, data } => (
            Op::Write {
                rkey: remote.rkey,
                raddr: remote.addr,
            },
            Some(data),
        ),
        Request::WriteImm { remote, data, imm } => (
            Op::WriteImm {
                rkey: remote.rkey,
                raddr: remote.addr,
                imm,
            },
            Some(data),
        ),
        Request::Read { remote, sgl } => (
            Op::Read {
                rkey: remote.rkey,
                raddr: remote.addr,
            },
            Some(Payload::Sgl(sgl)),
        ),
        Request::Send { data } => (Op::Send, Some(data)),
        Request::SendImm { data, imm } => (Op::SendImm { imm }, Some(data)),
        Request::SendInv { data, rkey } => (Op::SendInv { rkey }, Some(data)),
        Request::CompareSwap {
            remote,
            compare,
            swap,
            ..
        } => (
            Op::CmpSwp {
                rkey: remote.rkey,
                raddr: remote.addr,
                compare,
                swap,
            },
            atomic,
        ),
        Request::FetchAdd { remote, add, .. } => (
            Op::FetchAdd {
                rkey: remote.rkey,
                raddr: remote.addr,
                add,
            },
            atomic,
        ),
        Request::BindMw(b) => (
            Op::BindMw {
                mw_rkey: b.mw_rkey,
                new_rkey: b.new_rkey,
                mr_lkey: b.mr_lkey,
                addr: b.addr,
                length: b.len,
                access: b.access.0,
            },
            None,
        ),
        Request::LocalInvalidate { rkey } => (Op::LocalInv { rkey }, None),
        _ => return None,
    })
}

/// The `ibv_wr_*` calls a program makes for `req`.
pub fn post_oracle(
    oracle: &mut OracleQp,
    req: &Request<'_>,
    flags: u32,
    setter: Setter,
    addr: Addr,
) {
    let sgl: Vec<IbvSge>;
    let pieces: Vec<&[u8]>;
    // The 8-byte local buffer of an atomic (the crate's requests carry it, rdma-core takes it
    // from the data setter).
    let atomic: [mlx5::Sge; 1] = match *req {
        Request::CompareSwap { local, .. } | Request::FetchAdd { local, .. } => {
            [mlx5::Sge { len: 8, ..local }]
        }
        _ => [mlx5::Sge::default()],
    };
    if let Request::BindMw(b) = req {
        assert_eq!(
            b.mw_type,
            mlx5::request::MwType::Two,
            "ibv_wr_bind_mw binds type 2"
        );
    }
    let (op, payload) = op_of(req, Some(Payload::Sgl(&atomic)))
        .unwrap_or_else(|| panic!("no ibv_wr_* builder for {req:?}"));
    let data = match payload {
        None => None,
        Some(Payload::Sgl(l)) => {
            sgl = l.iter().copied().map(IbvSge::from).collect();
            match setter {
                Setter::Pieces(_) if sgl.len() == 1 => Some(Data::Sge(sgl[0])),
                _ => Some(Data::SgeList(&sgl)),
            }
        }
        Some(Payload::Inline(b)) => match setter {
            Setter::Pieces(n) => {
                pieces = b.chunks(n.max(1)).collect();
                Some(Data::InlineList(&pieces))
            }
            Setter::List => Some(Data::Inline(b)),
        },
    };
    let wr = Wr {
        wr_id: 7,
        flags,
        op,
        addr,
        data,
    };
    let rc = oracle.post(&[wr]);
    assert_eq!(rc, 0, "ibv_wr_complete refused {req:?}");
}

/// The `ibv_post_send` a program makes for `req` (rdma-core's `mlx5_post_send`); inline data
/// in two pieces when it has more than one byte, to cross `set_data_inl_seg`'s loop.
pub fn post_oracle_classic(oracle: &mut OracleQp, req: &Request<'_>, flags: u32, addr: Addr) {
    let rc = post_classic(oracle, req, flags, addr);
    assert_eq!(rc, 0, "mlx5_post_send refused {req:?}");
}

/// [`post_oracle_classic`], returning `mlx5_post_send`'s answer (0, or the error it
/// refused the request with) instead of requiring 0.
pub fn post_classic(oracle: &mut OracleQp, req: &Request<'_>, flags: u32, addr: Addr) -> i32 {
    use mlx5_oracle::{ClassicData, ClassicWr};
    let mut local = [IbvSge::default()];
    let list: Vec<IbvSge>;
    let pieces: Vec<&[u8]>;
    let mut type1 = false;
    let (op, payload) =
        op_of(req, None).unwrap_or_else(|| panic!("no ibv_post_send opcode for {req:?}"));
    match *req {
        Request::CompareSwap { local: l, .. } | Request::FetchAdd { local: l, .. } => {
            local = [IbvSge::from(mlx5::Sge { len: 8, ..l })];
        }
        Request::BindMw(b) => type1 = b.mw_type == mlx5::request::MwType::One,
        _ => {}
    }
    let data = match (op, payload) {
        (Op::CmpSwp { .. } | Op::FetchAdd { .. }, _) => ClassicData::Sgl(&local),
        (_, None) => ClassicData::Sgl(&[]),
        (_, Some(Payload::Sgl(l))) => {
            list = l.iter().copied().map(IbvSge::from).collect();
            ClassicData::Sgl(&list)
        }
        (_, Some(Payload::Inline(b))) => {
            let (x, y) = b.split_at(b.len() / 2);
            pieces = if b.len() > 1 { vec![x, y] } else { vec![b] };
            ClassicData::Inline(&pieces)
        }
    };
    oracle.post_send(&ClassicWr {
        wr_id: 9,
        flags,
        op,
        type1,
        addr,
        data,
    })
}
