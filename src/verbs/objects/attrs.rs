//! What a QP is created and connected with: its sizes ([`Caps`]), its peer's path
//! ([`Endpoint`]), the device's limits on the connection ([`ConnLimits`]) and its timeouts
//! and retries ([`Timing`]).

/// Sizes of an RC QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Send work requests.
    pub max_send_wr: u32,
    /// Receive work requests.
    pub max_recv_wr: u32,
    /// Gather entries per send.
    pub max_send_sge: u32,
    /// Scatter entries per receive.
    pub max_recv_sge: u32,
    /// Inline bytes per send.
    pub max_inline: u32,
}

/// What a peer needs to connect to a QP: exchange it out of band (see [`crate::connect`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// GID (RoCE: the IPv4-mapped RoCE v2 GID).
    pub gid: [u8; 16],
    /// LID (InfiniBand).
    pub lid: u16,
    /// Path MTU (verbs enum).
    pub mtu: u32,
    /// Reads and atomics the QP's responder accepts in flight (its `max_dest_rd_atomic`):
    /// the most a peer's requester may have outstanding towards it (its `max_rd_atomic`).
    /// 0 = not given, taken as 16, the depth the crate asks for (as an MTU of 0 takes the
    /// local one).
    pub max_dest_rd_atomic: u8,
}

/// The limits a connection must stay within: the local device's (rdma-core's
/// `mlx5_modify_qp` passes the attributes to the kernel, which refuses values above the
/// device's) and the peer's responder depth.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// The local port's active MTU (verbs enum: 1 = 256 ... 5 = 4096).
    pub local_mtu: u32,
    /// `max_qp_rd_atom` of the device: the responder's limit.
    pub max_qp_rd_atom: u8,
    /// `max_qp_init_rd_atom` of the device: the requester's limit.
    pub max_qp_init_rd_atom: u8,
    /// What the peer's responder accepts ([`Endpoint::max_dest_rd_atomic`]; 0 = not
    /// given).
    pub remote_dest_rd_atomic: u8,
}

impl ConnLimits {
    /// Reads and atomics in flight the crate asks for, in each direction.
    pub const RD_ATOMIC: u8 = 16;

    /// The path MTU: the smaller of the two ports' active MTUs (the verbs enum grows with
    /// the size); a peer that sent none (0) gets the local one.
    pub fn path_mtu(&self, remote_mtu: u32) -> u32 {
        match (self.local_mtu, remote_mtu) {
            (0, r) => r,
            (l, 0) => l,
            (l, r) => l.min(r),
        }
    }

    /// `max_dest_rd_atomic` (RTR): at most the device's `max_qp_rd_atom`.
    pub fn max_dest_rd_atomic(&self) -> u8 {
        Self::dest_rd_atomic_of(self.max_qp_rd_atom)
    }

    /// The responder depth a QP of a device of `max_qp_rd_atom` is connected with: what its
    /// [`Endpoint`] advertises.
    pub fn dest_rd_atomic_of(max_qp_rd_atom: u8) -> u8 {
        Self::RD_ATOMIC.min(max_qp_rd_atom)
    }

    /// `max_rd_atomic` (RTS): at most the device's `max_qp_init_rd_atom` and what the
    /// peer's responder accepts (`remote_dest_rd_atomic`, 0 taken as [`Self::RD_ATOMIC`]),
    /// as perftest programs the peer's `out_reads` (`ctx_modify_qp_to_rts`): more reads in
    /// flight than the responder accepts are NAKed (Invalid Request), the QP in error.
    pub fn max_rd_atomic(&self) -> u8 {
        let remote = match self.remote_dest_rd_atomic {
            0 => Self::RD_ATOMIC,
            r => r,
        };
        Self::RD_ATOMIC.min(self.max_qp_init_rd_atom).min(remote)
    }
}

/// Timeouts and retries of a connection (`ibv_modify_qp` RTR/RTS attributes).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Local ACK timeout exponent (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: for ever).
    pub rnr_retry: u8,
    /// Minimal RNR NAK timer (verbs encoding).
    pub min_rnr_timer: u8,
}

impl Timing {
    /// Checks the values verbs encodes in 3 bits (`retry_cnt`, `rnr_retry`: at most 7) and
    /// 5 bits (`timeout`, `min_rnr_timer`: at most 31); the kernel would silently keep only
    /// the low bits (`rnr_retry` 8 would become 0: no retry at all).
    ///
    /// # Errors
    /// [`crate::Error::InvalidParameter`] naming the field.
    pub(crate) fn check(&self) -> crate::error::Result<()> {
        for (what, v, max) in [
            ("timing: rnr_retry (at most 7)", self.rnr_retry, 7),
            ("timing: retry_cnt (at most 7)", self.retry_cnt, 7),
            ("timing: timeout (at most 31)", self.timeout, 31),
            ("timing: min_rnr_timer (at most 31)", self.min_rnr_timer, 31),
        ] {
            if v > max {
                return Err(crate::error::Error::InvalidParameter {
                    what,
                    value: v as u64,
                });
            }
        }
        Ok(())
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnLimits;

    /// A ConnectX-like device (16 / 16) and a small one (4 responder, 2 requester) on a
    /// 1024-byte port: the depths never exceed the device's, the MTU is the smaller one.
    #[test]
    fn connection_attributes_stay_within_the_device() {
        let cx = ConnLimits {
            local_mtu: 5,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            remote_dest_rd_atomic: 0,
        };
        assert_eq!((cx.max_dest_rd_atomic(), cx.max_rd_atomic()), (16, 16));
        let small = ConnLimits {
            local_mtu: 3,
            max_qp_rd_atom: 4,
            max_qp_init_rd_atom: 2,
            remote_dest_rd_atomic: 0,
        };
        assert_eq!((small.max_dest_rd_atomic(), small.max_rd_atomic()), (4, 2));
        let big = ConnLimits {
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            ..small
        };
        assert_eq!((big.max_dest_rd_atomic(), big.max_rd_atomic()), (16, 16));
        // Path MTU: min(local, remote); a remote that sent none gets the local one.
        assert_eq!(small.path_mtu(5), 3, "remote 4096, local 1024");
        assert_eq!(cx.path_mtu(3), 3, "remote 1024, local 4096");
        assert_eq!(small.path_mtu(0), 3);
    }

    /// The requester's depth stays within what the peer's responder accepts: a peer that
    /// advertises 4 (perftest's `-o 4`, a device whose `max_qp_rd_atom` is 4) gets at most
    /// 4 reads in flight, where 16 made its responder NAK (Invalid Request) and the QP
    /// fail. A peer that gave none (0) is taken as accepting the crate's 16; the local
    /// device's limit still applies, and the responder's own depth is the local one.
    #[test]
    fn the_requester_depth_stays_within_the_peers_responder() {
        let cx = ConnLimits {
            local_mtu: 5,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            remote_dest_rd_atomic: 4,
        };
        assert_eq!((cx.max_rd_atomic(), cx.max_dest_rd_atomic()), (4, 16));
        let given = |remote_dest_rd_atomic| ConnLimits {
            remote_dest_rd_atomic,
            ..cx
        };
        assert_eq!(given(0).max_rd_atomic(), 16, "not given: the crate's 16");
        assert_eq!(given(1).max_rd_atomic(), 1);
        assert_eq!(
            given(64).max_rd_atomic(),
            16,
            "the crate asks for 16 at most"
        );
        let small = ConnLimits {
            max_qp_init_rd_atom: 2,
            ..given(4)
        };
        assert_eq!(small.max_rd_atomic(), 2, "the local device's limit");
    }
}
