//! What both data paths keep beside the rings, shared by the direct path (`crate::direct`)
//! and the verbs path (`crate::verbs`), which never import each other: the shadow tables
//! of cookies (`shadow`), CQ accounting (`cq_share`), the queues attached to a CQ
//! (`registry`) and the tombstones of destroyed QPs (`teardown`), an SRQ's shared state
//! (`srq_shared`), the keys peers invalidated through a QP (`invalidations`), the receive
//! targets and the regions they pin (`scatter`, `regions`, `pin`), the post flags (`flags`),
//! the checks made before posting (`checks`) and the spin lock of a shared register or an
//! SRQ's ring (`spin`).

pub(crate) mod checks;
pub(crate) mod cq_share;
pub(crate) mod flags;
pub(crate) mod invalidations;
pub(crate) mod kind;
pub(crate) mod lifetime;
pub(crate) mod pin;
pub(crate) mod regions;
pub(crate) mod registry;
pub(crate) mod retire;
pub(crate) mod scatter;
pub(crate) mod shadow;
pub(crate) mod spin;
pub(crate) mod srq_shared;
pub(crate) mod teardown;

/// The atomics [`pin`] is written against (loom's, when `tests/loom_pins.rs` compiles it).
mod sync {
    pub(crate) use core::sync::atomic::{AtomicU32, Ordering};
}
