//! The transports beside RC on the software NIC through the direct path, one module per
//! subject (each was its own test binary before; `cargo test --test transports dc::` runs one
//! of them): unreliable datagram (`ud`, and the differential UD scenarios in `ud_scenarios`)
//! and the dynamically connected transport (`dc`).

#[path = "../scenarios/mod.rs"]
mod scenarios;

mod addressing;
mod dc;
mod ud;
mod ud_scenarios;
