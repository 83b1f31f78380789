//! What describes a software QP: its state, creation limits and statistics, and its role in
//! the DC or UD transport.

use crate::request::Access;

/// The state of a software QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created, not initialized: doorbells are ignored, and a message arriving is not
    /// answered. An RC QP leaves it for INIT ([`super::Nic::init_qp`]) before it connects;
    /// a UD QP and a DCI are made ready from it.
    Reset,
    /// Initialized (verbs' INIT: port, P_Key index and access rights set), not connected:
    /// receives posted wait in the ring, consumed by nothing until the QP reaches RTS;
    /// doorbells are ignored, and a message arriving is not answered (a ConnectX's
    /// responder is off below RTR), so it consumes no receive.
    Init,
    /// Connected and running.
    Rts,
    /// In error: every WQE and receive is flushed.
    Error,
    /// Send queue error (UD only, IBA 10.3.1 "SQEr"; a ConnectX's `MLX5_QP_STATE_SQER`,
    /// which the kernel's mlx5 `modify_qp` leaves with `SQERR2RTS_QP`): a send failed, so
    /// every later send WQE is flushed, while the receive queue keeps receiving.
    SqError,
}

/// What `ibv_modify_qp` to RTR (and RTS) programs into an RC QP's context of its peer: the
/// path to it and the packet sequence numbers of both directions ([`super::Nic::connect`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct RcPath {
    /// The peer's QP number (`dest_qp_num`, 24 bits).
    pub dest_qpn: u32,
    /// The LID the requests go to (`ah_attr.dlid`): they reach the peer only when it is
    /// this NIC's port's LID.
    pub dlid: u16,
    /// The PSN the QP expects of the peer's first request (`rq_psn`): the peer's first
    /// send PSN, or its requests are never acknowledged.
    pub rq_psn: u32,
    /// The QP's own first send PSN (`sq_psn`, at RTS).
    pub sq_psn: u32,
    /// The path MTU in bytes (256 ..= 4096, at most the port's active MTU).
    pub mtu: u32,
}

/// Creation limits of a software QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// The send queue's size in 64-byte blocks (WQEBBs; rounded up to a power of two,
    /// 16 ..= 32768): the unit of the direct path's ring, where a request takes 1 to 16
    /// blocks (a small inline write or a read 1, a bind 3, a long gather list or inline
    /// payload more). The largest request these limits allow takes
    /// `mlx5::wqe::max_wqe_bbs` blocks, so `sq_blocks / max_wqe_bbs` of them always fit:
    /// blueflame's `Qp::send_depth`. On the verbs path the QP is created with that many work
    /// requests (`max_send_wr`), so both paths have the same depth.
    pub sq_blocks: u32,
    /// The receive queue's size in receive work requests (rounded up to a power of two; 0
    /// for none).
    pub rq_entries: u32,
    /// Gather entries per send WQE.
    pub max_send_sge: u32,
    /// Scatter entries per receive WQE.
    pub max_recv_sge: u32,
    /// Inline bytes per send WQE.
    pub max_inline: u32,
    /// BlueFlame half size in bytes (0: doorbell only; a multiple of 64 otherwise).
    pub bf_size: u32,
    /// RNR retries before an RNR error (7 means retry for ever, as in verbs): the QP's RNR
    /// retry count until [`super::Nic::set_timing`] programs another.
    pub rnr_retry: u8,
    /// Responder scatter-to-CQE (the QP context's `cs_res`). A ConnectX QP created by
    /// rdma-core has it unless `MLX5_SCATTER_TO_CQE=0` or
    /// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` (rdma-core `verbs.c` `use_scatter_to_cqe`;
    /// the kernel's `create_user_qp` sets it for RC QPs, 64 bytes when the receive CQ has
    /// 128-byte entries, else 32): a received send, send with immediate or send with
    /// invalidate of up to 32 bytes (64 with 128-byte CQEs) then arrives inside its CQE
    /// (format INLINE_SCATTER_32 / _64) and the receive buffers are not written: the
    /// driver copies the data (rdma-core `mlx5_copy_to_recv_wqe`).
    pub scatter_to_cqe: bool,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            sq_blocks: 256,
            rq_entries: 256,
            max_send_sge: 8,
            max_recv_sge: 4,
            max_inline: 256,
            bf_size: 256,
            rnr_retry: 7,
            scatter_to_cqe: true,
        }
    }
}

/// What the NIC saw of one QP's doorbells and WQEs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Send WQEs executed or flushed.
    pub wqes: u64,
    /// Receive WQEs consumed or flushed.
    pub recvs: u64,
    /// Rings whose doorbell was found in the BlueFlame register (synchronous mode).
    pub doorbells: u64,
    /// Of those, rings that carried the whole WQE (BlueFlame copy) equal to the ring's bytes.
    pub bf_copies: u64,
    /// Rings that wrote only the 8-byte doorbell.
    pub db_writes: u64,
    /// BlueFlame copies whose bytes differ from the WQE in the ring.
    pub bf_mismatches: u64,
    /// BlueFlame copies that were not allowed (`bf_size == 0`, the WQE larger than it, or a
    /// WQE of one DS, which rdma-core's `post_send_db` rings with the 8-byte doorbell).
    pub bf_violations: u64,
    /// Doorbell records that moved with no matching doorbell write in the register.
    pub doorbell_misses: u64,
    /// Rings that used the same BlueFlame half as the ring before them on the register (the
    /// offset must alternate per register, whichever QP rings: rdma-core `bf->offset`).
    pub bf_out_of_turn: u64,
    /// Times a send found no receive WQE at the responder (RNR NAKs).
    pub rnr_naks: u64,
    /// Retransmissions after a local ACK timeout (the responder answered nothing).
    pub transport_retries: u64,
    /// Requests held back by the ordering mode while later ones ran first.
    pub held_back: u64,
    /// Datagrams this UD QP dropped: a Q_Key that differs from its own, no receive posted
    /// (UD has no RNR), or the QP not ready to receive.
    pub ud_drops: u64,
    /// SRQ WQEs this responder completed with a page fault (REMOTE_ABORTED, vendor syndrome
    /// 0x93) because their buffers had moved; each is also counted as an RNR NAK.
    pub page_faults: u64,
}

/// What a QP is in the DC transport.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum DcRole {
    /// An initiator; `cur` is the destination of the WQE being run.
    Dci { cur: Option<DcDest> },
    /// A target.
    Dct { key: u64, access: Access },
}

/// The destination of a DCI WQE.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct DcDest {
    pub(crate) dctn: u32,
    pub(crate) key: u64,
    /// Whether the WQE's address vector names this port (its LID and, with a GRH, its
    /// GID): a request addressed elsewhere never reaches this NIC's DCTs.
    pub(crate) here: bool,
}

/// What a DCT saw of its initiators.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DctStats {
    /// Requests it dropped because their DC key was not its own (each retransmission counts).
    pub key_violations: u64,
}

/// The UD attributes of a QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct UdCtx {
    /// The QP's Q_Key.
    pub(crate) qkey: u32,
    /// Whether its multicast sends reach itself when attached.
    pub(crate) mcast_loopback: bool,
}
