//! The software NIC held to the rules a ConnectX and rdma-core follow, one module per
//! subject (each was its own test binary before; `cargo test --test conformance sim_timers::`
//! runs one of them): the specifications' promises (`spec_sim`), the InfiniBand ordering
//! rules (`sim_ordering`), the transport timers (`sim_timers`), rdma-core's rules of the
//! direct path (`rdma_core_rules`), seeded random operations (`random_ops`), the shared queue
//! bookkeeping under random legal use (`bookkeeping`), the guide's CQ sizing rule
//! (`sizing`) and the one-sided connect (`connect_one_side`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../scenarios/mod.rs"]
mod scenarios;
#[path = "../spec/mod.rs"]
mod spec;

mod bookkeeping;
mod connect_one_side;
mod random_ops;
mod rdma_core_rules;
mod sim_ordering;
mod sim_timers;
mod sizing;
mod spec_sim;
