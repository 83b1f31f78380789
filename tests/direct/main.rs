//! The direct path on the stepped software NIC, one module per subject (each was its own
//! test binary before; `cargo test --test direct direct_errors::` runs one of them): every
//! opcode and error path, flags, inline data, gather and scatter lists at their limits,
//! doorbells and BlueFlame registers, ring wraps, full queues, unsignaled runs, CQ
//! accounting, overruns and stalls, shared CQs, CQE compression and scatter-to-CQE, flushes,
//! teardown, asynchronous events, SRQs, atomics, the differential scenarios and a smoke test.

#[path = "../common/mod.rs"]
mod common;
#[path = "../scenarios/mod.rs"]
mod scenarios;

mod atomics;
mod direct_async_events;
mod direct_counter_wrap;
mod direct_cq_overrun;
mod direct_cq_stall;
mod direct_cqe_zip;
mod direct_depth;
mod direct_doorbell;
mod direct_errors;
mod direct_flags;
mod direct_flush;
mod direct_inline;
mod direct_opcodes;
mod direct_pingpong;
mod direct_queue_full;
mod direct_responder;
mod direct_ring_wrap;
mod direct_scatter_cqe;
mod direct_scenarios;
mod direct_sge_limits;
mod direct_shared_cq;
mod direct_shared_register;
mod direct_srq;
mod direct_teardown;
mod direct_timestamps;
mod direct_unsignaled;
mod smoke;
