//! The device tests: the same programs on a real verbs device (rxe in the VM of `cargo xtask
//! test`, through the verbs path) and, where they can, on the software NIC. The device tests
//! are ignored on the host; the rxe stage runs each module on its own (`--ignored
//! rxe_verbs::`, as when each was its own binary) with `BLUEFLAME_DEVICE=rxe0`. The modules
//! that compare with the software NIC need the `sim` feature; the others are built without
//! it too.

#[path = "../events_cases/mod.rs"]
mod events_cases;
#[path = "../memory_cases/mod.rs"]
mod memory_cases;
#[path = "../scenarios/mod.rs"]
mod scenarios;
#[path = "../spec/mod.rs"]
mod spec;

mod rxe_cm;
mod rxe_cq_accounting;
#[cfg(feature = "sim")]
mod rxe_dc;
#[cfg(feature = "sim")]
mod rxe_differential;
mod rxe_events;
mod rxe_memory;
mod rxe_retry;
mod rxe_spec;
#[cfg(feature = "sim")]
mod rxe_srq;
mod rxe_timestamps;
mod rxe_ud;
mod rxe_verbs;
#[cfg(feature = "sim")]
mod rxe_verbs_api;
