//! The hot paths never allocate: the direct path's posts and polls (`direct_zero_alloc`) and
//! the DCI's (`dc_hot`), measured by a counting global allocator (`tests/alloc_count`). Its
//! own binary: the allocator is the whole process's (it counts per thread, so the tests may
//! run side by side, but no other test runs on it).

#[path = "../alloc_count/mod.rs"]
mod alloc_count;
#[path = "../common/mod.rs"]
mod common;

mod dc_hot;
mod direct_zero_alloc;
