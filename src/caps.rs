//! What a QP is created with: [`QpCaps`], the same on every backend.

/// Creation limits of a QP: ring sizes, gather/scatter and inline limits, BlueFlame size,
/// RNR retries, scatter-to-CQE.
///
/// The same fields rule the direct path's rings (on a ConnectX and on the software NIC) and
/// the verbs QP's `ibv_qp_cap` (on other devices). On the direct path one value gives the
/// same ring, send depth ([`QueuePair::send_depth`](crate::QueuePair::send_depth)) and
/// inline limit on a ConnectX as on the software NIC; on the verbs path the depth is at
/// least the same (the provider may round it up).
///
/// On an mlx5 device, and on the software NIC, QPs are refused as rdma-core's libmlx5
/// would refuse them on a ConnectX (`mlx5_calc_send_wqe`, `mlx5_calc_sq_size`,
/// `mlx5_calc_rq_size`: a send WQE of at most 1024 bytes sized for the transport's longest
/// operation), but with [`Error::InvalidParameter`](crate::Error::InvalidParameter) naming
/// the field and its value instead of `EINVAL`: `max_send_sge` at most 52 for RC (59 UD,
/// 49 DCI), `max_inline` at most 828 for RC (940 UD, 780 DCI), `max_recv_sge` at most 32,
/// `rq_entries` at most 32768; on the verbs path also an `sq_blocks` whose depth rdma-core's
/// ring of at most 32768 blocks cannot hold. (rdma-core takes 60 entries and 956 inline
/// bytes on UD, then writes a WQE of 64 DS, which the control segment's 6-bit count cannot
/// say: such a QP could post at its limits on no ConnectX.)
///
/// ```
/// let caps = blueflame::QpCaps {
///     sq_blocks: 64,
///     max_inline: 64,
///     ..blueflame::QpCaps::default()
/// };
/// assert_eq!(caps.rnr_retry, 7);
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// The send queue's size in 64-byte blocks (WQEBBs; rounded up to a power of two,
    /// 16 ..= 32768): the unit of the direct path's ring, where a request takes 1 to 16
    /// blocks (a small inline write or a read 1, a bind 3, a long gather list or inline
    /// payload more). The largest request these limits allow takes
    /// `mlx5::wqe::max_wqe_bbs` blocks, so `sq_blocks / max_wqe_bbs` of them always fit:
    /// [`QueuePair::send_depth`](crate::QueuePair::send_depth). On the verbs path the QP is created with
    /// that many work requests (`max_send_wr`), so it holds at least as many: the provider
    /// may give more (rdma-core rounds its ring up to a power of two: 341 asked of 1024
    /// blocks of 3 give 512), and `send_depth` reports what it gave.
    pub sq_blocks: u32,
    /// The receive queue's size in receive work requests (0 for none), rounded as
    /// rdma-core's `mlx5_calc_rq_size` rounds it on a ConnectX, and so on every mlx5 path:
    /// up to a power of two, and up to one 64-byte block of ring (4 receives of one entry).
    pub rq_entries: u32,
    /// Gather entries per send WQE.
    pub max_send_sge: u32,
    /// Scatter entries per receive WQE, rounded up as rdma-core rounds them on a ConnectX
    /// (a receive WQE of a power of two of 16-byte entries: 3 asked give 4).
    pub max_recv_sge: u32,
    /// Inline bytes per send WQE.
    pub max_inline: u32,
    /// BlueFlame half size in bytes (0: doorbell only; a multiple of 64 otherwise). On a
    /// ConnectX rdma-core chooses it; the software NIC takes this value.
    pub bf_size: u32,
    /// RNR retries before an RNR error (7 means retry for ever, as in verbs). Not for QPs
    /// connected through rdma_cm ([`crate::cm`]), whose count is what the peer's
    /// `rdma_conn_param` says (7): a lower value is refused there with
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    pub rnr_retry: u8,
    /// Responder scatter-to-CQE (the QP context's `cs_res`). A ConnectX QP created by
    /// rdma-core has it unless `MLX5_SCATTER_TO_CQE=0` or
    /// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` (rdma-core `verbs.c` `use_scatter_to_cqe`;
    /// the kernel's `create_user_qp` sets it for RC QPs, 64 bytes when the receive CQ has
    /// 128-byte entries, else 32): a received send, send with immediate or send with
    /// invalidate of up to 32 bytes (64 with 128-byte CQEs) then arrives inside its CQE
    /// (format INLINE_SCATTER_32 / _64) and the receive buffers are not written: the
    /// driver copies the data (rdma-core `mlx5_copy_to_recv_wqe`). Off, the device writes
    /// every receive to its buffers: the way to receive into regions the CPU cannot write
    /// (dma-buf, implicit ODP). On a ConnectX such an RC or UD QP is created with
    /// `mlx5dv_create_qp` and `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` (on both data
    /// paths); a QP connected through rdma_cm cannot ask for it ([`Error::Unsupported`],
    /// `MLX5_SCATTER_TO_CQE=0` turns it off for the whole process instead). DCIs and DCTs
    /// ignore it (a DCT follows `MLX5_SCATTER_TO_CQE`).
    ///
    /// [`Error::Unsupported`]: crate::Error::Unsupported
    pub scatter_to_cqe: bool,
}

impl QpCaps {
    /// The send depth these caps ask for on transport `t`: requests of the largest kind
    /// they allow (a UD WQE carries a datagram segment, a DCI's an address segment) that
    /// `sq_blocks` blocks hold, at least one.
    pub(crate) fn depth(&self, t: mlx5::qp_size::Transport) -> u32 {
        let lim = mlx5::wqe::Limits {
            max_sge: self.max_send_sge as usize,
            max_inline: self.max_inline as usize,
        };
        (self.sq_blocks / t.max_wqe_bbs(&lim) as u32).max(1)
    }

    /// The verbs QP's `ibv_qp_cap`: `sq_blocks` is a ring size in blocks and rdma-core
    /// takes work requests, sizing each for the largest WQE (`mlx5_calc_sq_size`), so as many
    /// requests of the largest kind as the blocks hold: at least the direct path's depth
    /// ([`QueuePair::send_depth`](crate::QueuePair::send_depth)).
    pub(crate) fn verbs(&self) -> crate::verbs::objects::Caps {
        crate::verbs::objects::Caps {
            max_send_wr: self.depth(mlx5::qp_size::Transport::Rc),
            max_recv_wr: self.rq_entries.max(1),
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline: self.max_inline,
        }
    }
}

impl Default for QpCaps {
    /// 256 send blocks and receive entries, 8 gather and 4 scatter entries, 256 inline
    /// bytes, 256-byte BlueFlame halves, RNR retries for ever, scatter-to-CQE on.
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

/// The software NIC's creation limits for the same QP (every field, by name: a field added
/// to either type is a compile error here until it is mapped).
#[cfg(feature = "sim")]
impl From<QpCaps> for mlx5::sim::QpCaps {
    fn from(c: QpCaps) -> Self {
        let QpCaps {
            sq_blocks,
            rq_entries,
            max_send_sge,
            max_recv_sge,
            max_inline,
            bf_size,
            rnr_retry,
            scatter_to_cqe,
        } = c;
        mlx5::sim::QpCaps {
            sq_blocks,
            rq_entries,
            max_send_sge,
            max_recv_sge,
            max_inline,
            bf_size,
            rnr_retry,
            scatter_to_cqe,
        }
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::QpCaps;

    #[test]
    fn defaults_are_the_software_nics() {
        assert_eq!(
            mlx5::sim::QpCaps::from(QpCaps::default()),
            mlx5::sim::QpCaps::default()
        );
    }

    #[test]
    fn every_field_crosses_the_boundary() {
        let c = QpCaps {
            sq_blocks: 64,
            rq_entries: 32,
            max_send_sge: 3,
            max_recv_sge: 2,
            max_inline: 60,
            bf_size: 0,
            rnr_retry: 5,
            scatter_to_cqe: false,
        };
        let s = mlx5::sim::QpCaps::from(c);
        assert_eq!(
            (s.sq_blocks, s.rq_entries, s.max_send_sge, s.max_recv_sge),
            (64, 32, 3, 2)
        );
        assert_eq!(
            (s.max_inline, s.bf_size, s.rnr_retry, s.scatter_to_cqe),
            (60, 0, 5, false)
        );
    }
}
