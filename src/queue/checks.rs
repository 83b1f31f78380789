//! The checks both data paths make before anything is posted: message lengths, atomics,
//! receive lists. A request the device would fail (and move the QP to error for) is refused
//! here with a typed error instead.

use crate::error::{Error, QueueUnit, Result};
use mlx5::request::Sge;

/// The most bytes one message moves anywhere (InfiniBand's 2^31; a CQE counts them in 32
/// bits): [`mlx5::wqe::MAX_MESSAGE_BYTES`]. A port may take fewer (its `max_msg_sz`,
/// [`crate::Device::max_message`]): each send queue is told its own.
pub(crate) const MAX_MESSAGE: u32 = mlx5::wqe::MAX_MESSAGE_BYTES as u32;

/// A send queue's message limits from the port's largest message `max`: the largest it
/// posts (at most 2^31) and the longest single gather entry its straight posts take (at
/// most `MAX_SGE_BYTES` as well).
pub(crate) fn message_limits(max: u32) -> (u32, u32) {
    let msg = max.min(MAX_MESSAGE);
    (msg, msg.min(mlx5::wqe::MAX_SGE_BYTES))
}

/// The length of a message gathered from (or scattered into) `sgl`, refused past `max`
/// (the port's `max_msg_sz`) before anything is posted, with the sum of the entries in the
/// error (the device would fail it with a local length error and move the QP to error).
/// The lengths are summed in u64, saturating: no sum overflows.
#[inline]
pub(crate) fn message_len(sgl: &[Sge], max: u32) -> Result<u32> {
    let total = sgl.iter().fold(0u64, |t, s| t.saturating_add(s.len as u64));
    if total > u64::from(max) {
        return Err(too_long(total));
    }
    Ok(total as u32)
}

/// The refusal of a message of `total` bytes.
#[cold]
#[inline(never)]
pub(crate) fn too_long(total: u64) -> Error {
    Error::InvalidParameter {
        what: "message length (the sum of the entries; at most the port's max_msg_sz, \
               Device::max_message)",
        value: total,
    }
}

/// What [`check_atomic_kind`] says of a device without standard atomics.
pub(crate) const STANDARD_ATOMICS: &str =
    "compare-swap / fetch-add on this device (atomic_cap IBV_ATOMIC_NONE)";
/// The same for masked atomics.
pub(crate) const MASKED_ATOMICS: &str = "masked atomics on this device (not reported by it)";

/// The checks of an atomic before anything is written, in rdma-core's order: the device can
/// run it (`_mlx5_post_send`: EOPNOTSUPP without `atomic_cap`; `what` names the kind in
/// the `Unsupported` error), the remote address is aligned to the operand, and the local
/// entry is exactly the operand's size.
#[cold]
pub(crate) fn check_atomic_kind(
    supported: bool,
    what: &'static str,
    addr: u64,
    len: u32,
    size: u32,
) -> Result<()> {
    if !supported {
        return Err(Error::Unsupported(what));
    }
    if addr % size as u64 != 0 {
        return Err(Error::Misaligned { addr, align: size });
    }
    if len != size {
        return Err(Error::AtomicLength { len, size });
    }
    Ok(())
}

/// The checks of one receive before anything is written: room (`free` receives), entry
/// lengths, entries (`max_sge`). Returns the non-empty entries. The SRQ's.
///
/// # Errors
/// [`Error::QueueFull`], [`Error::InvalidParameter`] (an entry's length),
/// [`Error::TooManySge`].
#[inline(always)]
pub(crate) fn check_recv(free: u32, sgl: &[Sge], max_sge: usize) -> Result<usize> {
    check_recv_room(free)?;
    check_recv_list(sgl, max_sge)
}

/// [`check_recv`]'s room: a receive needs one of the `free` entries (the receive queues'
/// cached room, `recv_room_end`, checks it too).
///
/// # Errors
/// [`Error::QueueFull`].
#[inline(always)]
pub(crate) fn check_recv_room(free: u32) -> Result<()> {
    if free == 0 {
        return Err(Error::QueueFull {
            needed: 1,
            free,
            unit: QueueUnit::Receives,
        });
    }
    Ok(())
}

/// [`check_recv`] without the room (the receive queue checks its own, cached): entry
/// lengths and entries.
///
/// # Errors
/// [`Error::InvalidParameter`] (an entry's length), [`Error::TooManySge`].
#[inline(always)]
pub(crate) fn check_recv_list(sgl: &[Sge], max_sge: usize) -> Result<usize> {
    if let Some(s) = sgl.iter().find(|s| s.len > mlx5::wqe::MAX_SGE_BYTES) {
        return Err(Error::InvalidParameter {
            what: "scatter/gather entry length",
            value: s.len as u64,
        });
    }
    let n = sgl.iter().filter(|s| s.len != 0).count();
    if n > max_sge {
        return Err(Error::TooManySge { n, max: max_sge });
    }
    Ok(n)
}
