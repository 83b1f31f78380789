//! What both data paths keep beside the rings: the receive targets and the regions they
//! pin, shared by the direct path (`crate::direct`) and the verbs path (`crate::verbs`),
//! which never import each other for it.

pub(crate) mod pin;
pub(crate) mod regions;
pub(crate) mod scatter;

/// The atomics [`pin`] is written against (loom's, when `tests/loom_pins.rs` compiles it).
mod sync {
    pub(crate) use core::sync::atomic::{AtomicU32, Ordering};
}
