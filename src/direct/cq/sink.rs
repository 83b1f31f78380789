//! Where a poll writes its completions: a slice of them ([`Completion`]s alone), or a
//! timed poll's pair of slices, the completions and the raw timestamps of their CQEs
//! ([`Stamped`]). The poller is written once over [`Sink`]; the plain poll's stamp is
//! `()`, so its code is what it was before timestamps existed.

use crate::completion::Completion;
use crate::queue::shadow::SendEntry;
use mlx5::cqe::{Cqe64, CqeOpcode};

/// Where the poller puts completions.
pub(crate) trait Sink {
    /// What is kept of a CQE besides its completion (nothing, or its timestamp), read
    /// while the entry is still software's.
    type Stamp: Copy;
    /// How many completions fit.
    fn room(&self) -> usize;
    /// The stamp of `cqe`.
    fn stamp(cqe: &Cqe64) -> Self::Stamp;
    /// The stamp of a completion that has no CQE of its own (a mini-CQE's).
    fn unstamped() -> Self::Stamp;
    /// Puts completion `c`, stamped `s`, at position `n` (below [`Sink::room`]).
    fn put(&mut self, n: usize, c: Completion, s: Self::Stamp);
    /// Puts the successful send completion of `e` on QP `qpn`, stamped `s`, at position
    /// `n` (below [`Sink::room`]): [`Sink::put`] of what [`SendEntry::completion_into`] writes.
    fn put_send(&mut self, n: usize, e: &SendEntry, qpn: u32, s: Self::Stamp);
}

impl Sink for [Completion] {
    type Stamp = ();
    #[inline(always)]
    fn room(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn stamp(_: &Cqe64) {}
    #[inline(always)]
    fn unstamped() {}
    #[inline(always)]
    fn put(&mut self, n: usize, c: Completion, _: ()) {
        self[n] = c;
    }
    #[inline(always)]
    fn put_send(&mut self, n: usize, e: &SendEntry, qpn: u32, _: ()) {
        e.completion_into(qpn, &mut self[n]);
    }
}

/// A timed poll's output: completions, and for each the raw timestamp of its CQE (None
/// for an error CQE, whose timestamp bytes hold its syndromes, and for a mini-CQE's).
pub(crate) struct Stamped<'a> {
    pub(crate) out: &'a mut [Completion],
    pub(crate) times: &'a mut [Option<u64>],
}

impl Sink for Stamped<'_> {
    type Stamp = Option<u64>;
    #[inline(always)]
    fn room(&self) -> usize {
        self.out.len().min(self.times.len())
    }
    #[inline(always)]
    fn stamp(cqe: &Cqe64) -> Option<u64> {
        let op = cqe.op_own >> 4;
        (op != CqeOpcode::ReqErr as u8 && op != CqeOpcode::RespErr as u8)
            .then(|| cqe.timestamp.get())
    }
    #[inline(always)]
    fn unstamped() -> Option<u64> {
        None
    }
    #[inline(always)]
    fn put(&mut self, n: usize, c: Completion, s: Option<u64>) {
        self.out[n] = c;
        self.times[n] = s;
    }
    #[inline(always)]
    fn put_send(&mut self, n: usize, e: &SendEntry, qpn: u32, s: Option<u64>) {
        e.completion_into(qpn, &mut self.out[n]);
        self.times[n] = s;
    }
}
