//! What a ConnectX takes when a QP is created, as rdma-core's libmlx5 sizes its queues
//! (`providers/mlx5/verbs.c`: `_sq_overhead`, `mlx5_calc_send_wqe`, `mlx5_calc_sq_size`,
//! `mlx5_calc_rcv_wqe`, `mlx5_calc_rq_size`) against the limits the kernel's `mlx5_ib`
//! hands it (`mlx5_ib_alloc_ucontext`: `max_sq_desc_sz`, `max_rq_desc_sz`,
//! `max_send_wqebb`, `max_recv_wr`).
//!
//! A QP of these limits that rdma-core refuses (`EINVAL`) is one no ConnectX user can have,
//! so the software NIC refuses it too, and every backend says which limit and which value.
//! One rule is stricter than rdma-core's: a UD WQE's DS count (see [`send_wqe_size`]).

use crate::ctrl::MAX_DS;

/// Bytes of the segments rdma-core sizes a send WQE with (`mlx5dv.h`, `wqe.h`). RDMA
/// (control and remote address, 32) and atomics (48) are shorter than a bind's UMR, so only
/// the UMR's count.
const CTRL: u32 = 16;
const UMR_CTRL: u32 = 48;
const MKEY_CONTEXT: u32 = 64;
/// `max(sizeof(struct mlx5_wqe_umr_klm_seg), 64)`.
const UMR_KLM: u32 = 64;
const DATAGRAM: u32 = 48;
const INLINE_HEADER: u32 = 4;
const DATA: u32 = 16;
const SEND_WQE_BB: u32 = 64;

/// What the kernel reports to rdma-core for a device (`struct mlx5_ib_alloc_ucontext_resp`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// The largest send WQE in bytes (`max_sq_desc_sz`: `max_wqe_sz_sq`).
    pub max_sq_desc: u32,
    /// The largest receive WQE in bytes (`max_rq_desc_sz`: `max_wqe_sz_rq`).
    pub max_rq_desc: u32,
    /// The most blocks of a send queue (`max_send_wqebb`: `1 << log_max_qp_sz`).
    pub max_send_wqebb: u32,
    /// The most receive WQEs of a receive queue (`max_recv_wr`: `1 << log_max_qp_sz`).
    pub max_recv_wr: u32,
}

impl DeviceLimits {
    /// A ConnectX-5 and later: 16-block send WQEs (the most a WQE may take), 512-byte
    /// receive WQEs (32 scatter entries) and `log_max_qp_sz` 15.
    pub const CONNECTX: DeviceLimits = DeviceLimits {
        max_sq_desc: 1024,
        max_rq_desc: 512,
        max_send_wqebb: 1 << 15,
        max_recv_wr: 1 << 15,
    };
}

/// The kind of QP, which sets the segments every send WQE may need.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// RC with every operation, window binds (UMR) included: the send operations
    /// `blueflame` asks rdma-core for, and rdma-core's default for RC.
    Rc,
    /// UD with sends (with and without immediate) only.
    Ud,
    /// A DC initiator (`IBV_QPT_DRIVER`, created without send operation flags: RC's
    /// defaults) with its address segment.
    Dci,
}

impl Transport {
    /// Blocks of the longest WQE the crate's encoders write for this transport under
    /// `lim` (a UD WQE carries a datagram segment, a DCI's an address segment, an RC one a
    /// remote address or a bind's UMR): a ring of `n` times that always holds `n` of them.
    pub fn max_wqe_bbs(self, lim: &crate::wqe::Limits) -> usize {
        match self {
            Transport::Rc => crate::wqe::max_wqe_bbs(lim),
            Transport::Ud => crate::wqe::max_ud_wqe_bbs(lim),
            Transport::Dci => crate::dc::max_dc_wqe_bbs(lim),
        }
    }

    /// `_sq_overhead`: the segments before a WQE's payload, for the longest operation.
    pub const fn overhead(self) -> u32 {
        let mw = CTRL + UMR_CTRL + MKEY_CONTEXT + UMR_KLM;
        match self {
            // The bind's UMR is longer than RDMA (32) and atomics (48).
            Transport::Rc => mw,
            Transport::Ud => CTRL + DATAGRAM,
            Transport::Dci => mw + DATAGRAM,
        }
    }
}

/// What a QP is asked to hold, in rdma-core's terms (`struct ibv_qp_cap`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpAsk {
    /// Send work requests (`max_send_wr`; 0: no send queue).
    pub max_send_wr: u32,
    /// Gather entries per send WQE.
    pub max_send_sge: u32,
    /// Inline bytes per send WQE.
    pub max_inline: u32,
    /// Receive work requests (0: none, or an SRQ).
    pub max_recv_wr: u32,
    /// Scatter entries per receive WQE.
    pub max_recv_sge: u32,
    /// WQE signatures (`MLX5_QP_SIGNATURE`, `qp->wq_sig`): each receive WQE carries a
    /// 16-byte signature segment beside its scatter entries.
    pub wq_sig: bool,
}

/// A limit a QP creation passes: the field and the value asked for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The field of [`QpAsk`] that broke it.
    pub field: Field,
    /// The field and the rule it broke.
    pub what: &'static str,
    /// The value asked for.
    pub value: u64,
}

/// A field of [`QpAsk`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Field {
    /// `max_send_wr`: the ring those requests need.
    SendWr,
    /// `max_send_sge`.
    SendSge,
    /// `max_inline`.
    Inline,
    /// `max_recv_wr`.
    RecvWr,
    /// `max_recv_sge`.
    RecvSge,
}

/// How rdma-core sizes a QP's send queue.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SendSize {
    /// The bytes every WQE is sized for (`mlx5_calc_send_wqe`, a multiple of 64).
    pub wqe_size: u32,
    /// The inline bytes rdma-core reports (`max_inline_data`, at least what was asked).
    pub max_inline: u32,
    /// The ring's blocks (`sq.wqe_cnt`).
    pub blocks: u32,
}

const fn align(v: u32, a: u32) -> u32 {
    v.div_ceil(a) * a
}

/// The largest WQE of transport `t` whose payload a ConnectX can be told of: the device's
/// `max_sq_desc`, but for UD at most 63 DS (1008 bytes). A UD WQE's overhead is its real
/// header (control and datagram segments), so its payload meets the control segment's 6-bit
/// DS count (`MLX5_WQE_CTRL_DS_MASK`) before the descriptor's end: rdma-core takes 60 gather
/// entries or 956 inline bytes and writes DS 64 into `qpn_ds` (`qp.c`), which the field
/// cannot hold. The other transports' overheads (a bind's UMR) exceed their real headers,
/// so their largest payloads stay within 54 DS.
fn usable_desc(t: Transport, lim: &DeviceLimits) -> u32 {
    match t {
        Transport::Ud => lim.max_sq_desc.min(MAX_DS * DATA),
        _ => lim.max_sq_desc,
    }
}

/// The most inline bytes a UD WQE can carry on a ConnectX (940: 63 DS less the control
/// and datagram segments and the inline header), where rdma-core reports 956 for a QP whose
/// WQEs are 1024 bytes: a UD WQE's payload meets the control segment's 6-bit DS count
/// first ([`send_wqe_size`]).
pub const UD_MAX_INLINE: u32 = MAX_DS * DATA - CTRL - DATAGRAM - INLINE_HEADER;

/// `mlx5_calc_send_wqe`: the bytes every send WQE of the QP is sized for.
///
/// # Errors
/// `max_send_sge` past the gather entries a WQE has room for beside the transport's
/// segments, or `max_inline` past the inline bytes it has room for.
pub fn send_wqe_size(t: Transport, ask: &QpAsk, lim: &DeviceLimits) -> Result<u32, Refusal> {
    let over = t.overhead();
    let room = usable_desc(t, lim).saturating_sub(over);
    if ask.max_send_sge > room / DATA {
        return Err(Refusal {
            field: Field::SendSge,
            what: match t {
                Transport::Rc => "max_send_sge (RC on a ConnectX: at most 52)",
                Transport::Ud => "max_send_sge (UD on a ConnectX: at most 59)",
                Transport::Dci => "max_send_sge (DCI on a ConnectX: at most 49)",
            },
            value: ask.max_send_sge as u64,
        });
    }
    // An inline payload past the largest WQE is refused here before its sum could wrap.
    if ask.max_inline > room.saturating_sub(INLINE_HEADER) {
        return Err(Refusal {
            field: Field::Inline,
            what: match t {
                Transport::Rc => "max_inline (RC on a ConnectX: at most 828)",
                Transport::Ud => "max_inline (UD on a ConnectX: at most 940)",
                Transport::Dci => "max_inline (DCI on a ConnectX: at most 780)",
            },
            value: ask.max_inline as u64,
        });
    }
    let inline = if ask.max_inline == 0 {
        0
    } else {
        over + align(INLINE_HEADER + ask.max_inline, 16)
    };
    let gather = over + ask.max_send_sge * DATA;
    let size = align(gather.max(inline), SEND_WQE_BB);
    // `mlx5_calc_sq_size`: a device whose largest WQE is not whole blocks.
    if size > lim.max_sq_desc {
        return Err(Refusal {
            field: Field::Inline,
            what: "max_inline or max_send_sge (the WQE would pass the device's largest)",
            value: size as u64,
        });
    }
    Ok(size)
}

/// `mlx5_calc_sq_size`: the send queue rdma-core makes for `ask` (none for no send work
/// requests).
///
/// # Errors
/// As [`send_wqe_size`]; a ring past the device's `max_send_wqebb` (`sq_blocks`, in
/// `blueflame`'s terms: the work requests that many blocks hold, each sized for the largest
/// WQE).
pub fn send_size(t: Transport, ask: &QpAsk, lim: &DeviceLimits) -> Result<SendSize, Refusal> {
    let wqe_size = send_wqe_size(t, ask, lim)?;
    if ask.max_send_wr == 0 {
        return Ok(SendSize {
            wqe_size,
            max_inline: 0,
            blocks: 0,
        });
    }
    let too_many = Refusal {
        field: Field::SendWr,
        what: "sq_blocks (rdma-core's ring for that many requests of its WQE size: at most 32768 blocks)",
        value: ask.max_send_wr as u64,
    };
    if ask.max_send_wr > 0x7fff_ffff / lim.max_sq_desc.max(1) {
        return Err(too_many);
    }
    let blocks = (ask.max_send_wr * wqe_size).next_power_of_two() / SEND_WQE_BB;
    if blocks > lim.max_send_wqebb {
        return Err(too_many);
    }
    Ok(SendSize {
        wqe_size,
        // rdma-core reports the whole WQE's room (956 on UD); the DS count allows less.
        max_inline: wqe_size.min(usable_desc(t, lim)) - t.overhead() - INLINE_HEADER,
        blocks,
    })
}

/// The send work requests to ask rdma-core for so that its ring is `blocks` blocks (a power
/// of two, at least one WQE of `wqe_size` bytes): as many as fit.
pub fn send_wr_for_ring(blocks: u32, wqe_size: u32) -> u32 {
    (blocks.saturating_mul(SEND_WQE_BB) / wqe_size.max(1)).max(1)
}

/// `mlx5_calc_rcv_wqe` and `mlx5_calc_rq_size` (no signature, no out-of-order receives):
/// whether rdma-core makes the receive queue of `ask`.
///
/// # Errors
/// `max_recv_wr` past the device's `max_recv_wr`; `max_recv_sge` past the scatter entries of
/// its largest receive WQE.
pub fn check_recv(ask: &QpAsk, lim: &DeviceLimits) -> Result<(), Refusal> {
    if ask.max_recv_wr == 0 {
        return Ok(());
    }
    if ask.max_recv_wr > lim.max_recv_wr {
        return Err(Refusal {
            field: Field::RecvWr,
            what: "rq_entries (a ConnectX: at most 32768)",
            value: ask.max_recv_wr as u64,
        });
    }
    // `mlx5_calc_rcv_wqe`: the scatter entries, and the signature segment (`struct
    // mlx5_rwqe_sig`, 16 bytes) with `wq_sig`.
    let sig = if ask.wq_sig { DATA } else { 0 };
    if ask.max_recv_sge.max(1) > lim.max_rq_desc.saturating_sub(sig) / DATA {
        return Err(Refusal {
            field: Field::RecvSge,
            what: "max_recv_sge (a ConnectX: at most 32; 31 with MLX5_QP_SIGNATURE)",
            value: ask.max_recv_sge as u64,
        });
    }
    Ok(())
}

/// Both queues of `ask`, as rdma-core would make them: the send queue's size.
///
/// # Errors
/// The first limit `ask` passes (send side first, as `mlx5_calc_wq_size`).
pub fn qp_size(t: Transport, ask: &QpAsk, lim: &DeviceLimits) -> Result<SendSize, Refusal> {
    let s = send_size(t, ask, lim)?;
    check_recv(ask, lim)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CX: DeviceLimits = DeviceLimits::CONNECTX;

    fn ask(max_send_wr: u32, max_send_sge: u32, max_inline: u32) -> QpAsk {
        QpAsk {
            max_send_wr,
            max_send_sge,
            max_inline,
            max_recv_wr: 256,
            max_recv_sge: 4,
            wq_sig: false,
        }
    }

    #[test]
    fn overheads_are_rdma_cores() {
        // ctrl + umr ctrl + mkey context + 64; UD: ctrl + datagram; DCI: both.
        assert_eq!(Transport::Rc.overhead(), 192);
        assert_eq!(Transport::Ud.overhead(), 64);
        assert_eq!(Transport::Dci.overhead(), 240);
    }

    #[test]
    fn the_default_rc_qp_as_rdma_core_sizes_it() {
        // 8 gather entries (192 + 128 = 320), 256 inline (192 + 260 -> 464): 512 bytes, and
        // 51 of them round up to a ring of 512 blocks; rdma-core reports 316 inline bytes.
        let s = send_size(Transport::Rc, &ask(51, 8, 256), &CX).unwrap();
        assert_eq!(
            s,
            SendSize {
                wqe_size: 512,
                max_inline: 316,
                blocks: 512
            }
        );
        // Asked for a ring of 256 blocks: 32 requests.
        assert_eq!(send_wr_for_ring(256, 512), 32);
        let s = send_size(Transport::Rc, &ask(32, 8, 256), &CX).unwrap();
        assert_eq!(s.blocks, 256);
    }

    #[test]
    fn the_largest_payloads_each_transport_takes() {
        for (t, sge, inline) in [
            (Transport::Rc, 52, 828),
            (Transport::Ud, 59, UD_MAX_INLINE),
            (Transport::Dci, 49, 780),
        ] {
            assert!(send_size(t, &ask(1, sge, 0), &CX).is_ok(), "{t:?} {sge}");
            let e = send_size(t, &ask(1, sge + 1, 0), &CX).unwrap_err();
            assert!(e.what.starts_with("max_send_sge") && e.what.contains(&sge.to_string()));
            assert_eq!(e.value, sge as u64 + 1);
            let s = send_size(t, &ask(1, 1, inline), &CX).unwrap();
            assert!(s.wqe_size <= 1024 && s.max_inline >= inline, "{t:?}");
            let e = send_size(t, &ask(1, 1, inline + 1), &CX).unwrap_err();
            assert!(e.what.starts_with("max_inline") && e.what.contains(&inline.to_string()));
            // No sum wraps.
            assert!(send_size(t, &ask(1, 1, u32::MAX), &CX).is_err());
            assert!(send_size(t, &ask(1, u32::MAX, 0), &CX).is_err());
        }
    }

    #[test]
    fn rings_past_32768_blocks_are_refused() {
        // 512-byte WQEs: 4096 of them are 32768 blocks, one more is twice that.
        assert_eq!(
            send_size(Transport::Rc, &ask(4096, 8, 256), &CX)
                .unwrap()
                .blocks,
            32768
        );
        let e = send_size(Transport::Rc, &ask(4097, 8, 256), &CX).unwrap_err();
        assert!(e.what.starts_with("sq_blocks"), "{e:?}");
        assert!(send_size(Transport::Rc, &ask(u32::MAX, 1, 0), &CX).is_err());
        assert_eq!(
            send_size(Transport::Rc, &ask(0, 8, 256), &CX)
                .unwrap()
                .blocks,
            0
        );
    }

    #[test]
    fn receive_limits() {
        let r = |max_recv_wr, max_recv_sge| {
            check_recv(
                &QpAsk {
                    max_recv_wr,
                    max_recv_sge,
                    ..ask(1, 1, 0)
                },
                &CX,
            )
        };
        assert!(r(32768, 32).is_ok());
        let signed = |max_recv_sge| {
            check_recv(
                &QpAsk {
                    max_recv_sge,
                    wq_sig: true,
                    ..ask(1, 1, 0)
                },
                &CX,
            )
        };
        assert!(signed(31).is_ok());
        assert_eq!(signed(32).unwrap_err().field, Field::RecvSge);
        assert!(r(0, 1000).is_ok(), "no receive queue");
        assert_eq!(r(32769, 1).unwrap_err().value, 32769);
        let e = r(16, 33).unwrap_err();
        assert!(e.what.starts_with("max_recv_sge"));
        assert_eq!(e.value, 33);
    }
}
