//! Whole send WQEs: size, encode into ring blocks, decode back.
//!
//! The encoder writes one complete WQE for one [`Request`](crate::Request) into the blocks of a
//! send ring, continuing at block 0 when it runs past the end (the inline payload is split at
//! the ring end, as rdma-core splits its `memcpy`). It validates everything *before* writing a
//! byte, so an error never leaves a half-written WQE. The decoder reads a linear copy of a WQE
//! back into a request: the software NIC and the round-trip tests use it.

mod decode;
mod encode;
mod span;
mod ud;

pub use decode::{decode, DecodeError, Decoded};
pub(crate) use encode::encode_at;
pub use encode::{
    encode, max_wqe_bbs, wqe_ds, EncodeError, Limits, MAX_MESSAGE_BYTES, MAX_SGE_BYTES,
};
pub use span::{linearize, Span};
pub use ud::{decode_ud, encode_ud, max_ud_wqe_bbs, ud_wqe_ds, DecodedUd, UdSend, UD_HEADER_DS};

use crate::doorbell::SEND_WQE_BB;
use crate::seg::DS_BYTES;

/// DS units in one basic block.
pub const DS_PER_BB: usize = SEND_WQE_BB / DS_BYTES;
/// The largest WQE in bytes (16 blocks).
pub const MAX_WQE_BYTES: usize = crate::doorbell::MAX_WQE_BBS * SEND_WQE_BB;

/// Blocks taken by a WQE of `ds` DS units.
#[inline(always)]
pub const fn ds_to_bbs(ds: usize) -> usize {
    ds.div_ceil(DS_PER_BB)
}
