//! Which later requests of a QP may overtake an earlier one, and the seeded choices of the
//! ordering mode.
//!
//! The InfiniBand ordering rules (IBTA vol. 1, 9.5 and 10.8.3; `IBV_SEND_FENCE` in
//! `ibv_post_send(3)`) let a responder run a later RDMA write or send before an earlier RDMA
//! read or atomic has read its data, unless the later request carries the fence indicator.
//! A ConnectX also lets the requests after a memory-key operation (a memory-window bind or a
//! local invalidate, both UMR WQEs) start before that operation took effect, unless they carry
//! the initiator small fence, which is why rdma-core (`mlx5_post_send`: `next_fence`) and the
//! kernel (`mlx5_ib_post_send`) arm it on the WQE after one. The fence modes of the control
//! segment (kernel `get_fence`, `MLX5_FENCE_MODE_*`):
//!
//! | mode | waits for earlier |
//! |---|---|
//! | none | nothing |
//! | initiator small | memory-key operations (bind, local invalidate) |
//! | fence (`IBV_SEND_FENCE` alone) | RDMA reads and atomics |
//! | small and fence (`IBV_SEND_FENCE` after a bind: rdma-core's `MLX5_WQE_CTRL_FENCE`) | both |
//! | strong ordering | everything |
//!
//! Completions are reported in order whatever ran first.

use crate::ctrl::Fence;
use crate::request::Request;

/// Whether the software NIC runs each QP's requests strictly in order or as freely as the
/// rules allow.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OrderMode {
    /// Every request runs after the one before it has finished (a kinder NIC than the
    /// rules: a missing fence goes unnoticed).
    Strict,
    /// The default: an RDMA read or atomic may read its data only after later, unfenced
    /// writes and sends have landed, and a bind or local invalidate may take effect only
    /// after later requests without the initiator small fence ran. Each such request is held
    /// back or not by a choice drawn from a generator seeded with `seed` and the QP number, so
    /// a run is reproducible from the seed.
    Relaxed {
        /// The seed of the choices.
        seed: u64,
    },
}

impl Default for OrderMode {
    fn default() -> Self {
        OrderMode::Relaxed { seed: 0 }
    }
}

/// What a request is for the ordering rules.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// RDMA read or atomic: reads responder memory, may be overtaken.
    ReadLike,
    /// Bind or local invalidate (UMR): changes keys, may be overtaken.
    KeyOp,
    /// Anything else (writes, sends, NOP): never held back.
    Other,
}

impl Kind {
    pub(crate) fn of(r: &Request<'_>) -> Kind {
        match r {
            Request::Read { .. }
            | Request::CompareSwap { .. }
            | Request::FetchAdd { .. }
            | Request::Masked { .. } => Kind::ReadLike,
            Request::BindMw(_) | Request::LocalInvalidate { .. } => Kind::KeyOp,
            _ => Kind::Other,
        }
    }

    /// Whether a request of kind `self` with fence `fence` must wait for an earlier held-back
    /// request of kind `earlier`: its fence covers it, or both are of one kind (reads and
    /// atomics run in order among themselves, as do key operations).
    pub(crate) fn waits_for(self, fence: Fence, earlier: Kind) -> bool {
        let fenced = match fence {
            Fence::None => false,
            Fence::InitiatorSmall => earlier == Kind::KeyOp,
            Fence::Fence => earlier == Kind::ReadLike,
            Fence::SmallAndFence | Fence::StrongOrdering => true,
        };
        fenced || (self == earlier && self != Kind::Other)
    }
}

/// A small seeded generator (splitmix64): one per QP.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64, qpn: u32) -> Rng {
        Rng(seed ^ (qpn as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// How long a held-back request waits at most (virtual nanoseconds) before it runs anyway.
pub(crate) const MAX_HOLD_NS: u64 = 8_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_cover_what_the_kernel_says() {
        use Kind::*;
        // A write after a read: only a fence that waits for reads holds it.
        assert!(!Other.waits_for(Fence::None, ReadLike));
        assert!(!Other.waits_for(Fence::InitiatorSmall, ReadLike));
        assert!(Other.waits_for(Fence::Fence, ReadLike));
        assert!(Other.waits_for(Fence::SmallAndFence, ReadLike));
        assert!(Other.waits_for(Fence::StrongOrdering, ReadLike));
        // After a bind: the initiator small fence (rdma-core's next_fence) is enough.
        assert!(!Other.waits_for(Fence::None, KeyOp));
        assert!(Other.waits_for(Fence::InitiatorSmall, KeyOp));
        assert!(!Other.waits_for(Fence::Fence, KeyOp));
        assert!(Other.waits_for(Fence::SmallAndFence, KeyOp));
        // Reads among reads, key operations among key operations: in order.
        assert!(ReadLike.waits_for(Fence::None, ReadLike));
        assert!(KeyOp.waits_for(Fence::None, KeyOp));
        assert!(!ReadLike.waits_for(Fence::None, KeyOp));
    }

    #[test]
    fn the_generator_is_a_function_of_seed_and_qp() {
        let mut a = Rng::new(7, 0x100);
        let mut b = Rng::new(7, 0x100);
        let mut c = Rng::new(7, 0x101);
        let xa: Vec<u64> = (0..8).map(|_| a.next()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }
}
