//! Waiting for completions on the software NIC, one module per subject (each was its own
//! test binary before; `cargo test --test events wait_spin::` runs one of them): completion
//! channels and their events (`events`), and waiting by spinning (`wait_spin`).

mod events;
mod wait_spin;
