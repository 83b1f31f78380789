//! Memory the user owns and the lifetimes of what refers to it, on the software NIC, one
//! module per subject (each was its own test binary before; `cargo test --test memory mw::`
//! runs one of them): registrations of every form, regions and CQs kept alive while work is
//! outstanding, memory windows, soundness (no safe call reaches freed or unregistered
//! memory), misuse refused with typed errors, and requests that used to be lost.

#[path = "../memory_cases/mod.rs"]
mod memory_cases;
#[path = "../scenarios/mod.rs"]
mod scenarios;

mod lifetimes;
mod lost_completions;
mod memory;
mod misuse;
mod mw;
mod registration_rules;
mod soundness;
