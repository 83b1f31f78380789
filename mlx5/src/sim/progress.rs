//! How the WQEs of a send queue stand while the NIC runs them: the outcome of one WQE, the
//! timer the head of the queue waits for, and the WQEs started whose completions wait their turn.

use super::order::Kind;
use crate::syndrome::Syndrome;
use crate::wqe::MAX_WQE_BYTES;

/// The result of running one WQE.
pub(crate) enum Outcome {
    /// Done; bytes for the CQE's byte count.
    Done(u32),
    /// Failed with this syndrome (the QP goes to error).
    Failed(Syndrome),
    /// The responder had no receive WQE: try again when the RNR timer expires.
    Retry,
    /// One packet of a message longer than the path MTU went and the responder holds the
    /// receive WQE it took for it: the rest goes on the next pass.
    Partial,
}

/// What the WQE at the head of the send queue waits for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum WaitFor {
    /// The local ACK timeout: the responder answered nothing.
    Ack,
    /// The RNR NAK timer: the responder had no receive.
    Rnr,
}

/// A timer of the WQE at the head of the send queue.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    /// Virtual time it expires (`u64::MAX`: never).
    pub(crate) until: u64,
    pub(crate) kind: WaitFor,
}

/// How a started WQE stands.
pub(crate) enum Progress {
    /// Ran; bytes for the CQE.
    Done(u32),
    /// Failed with this syndrome.
    Failed(Syndrome),
    /// Held back by the ordering mode: runs at `due` or when a later WQE waits for it.
    Held {
        wqe: Box<[u8; MAX_WQE_BYTES]>,
        len: usize,
        kind: Kind,
        due: u64,
    },
}

/// A WQE the NIC started whose completion is not written yet (completions go in order: a
/// WQE that ran waits behind a held-back one before it).
pub(crate) struct Started {
    pub(crate) pi: u32,
    pub(crate) opcode: u8,
    pub(crate) signaled: bool,
    pub(crate) progress: Progress,
}
