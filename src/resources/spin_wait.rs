//! Spin, then sleep: [`Cq::wait_spin`], for programs that want the latency of busy polling
//! when the answer comes quickly and an idle core when it does not.
//!
//! Which call to use:
//! - [`Cq::poll`] in a loop (busy polling): the lowest latency, a core spent whether work
//!   comes or not. Trading loops and benchmarks.
//! - [`Cq::wait`]: poll, arm, poll, sleep on the completion channel. No core spent while
//!   idle; each sleep costs a wake-up (an arm, a system call, the scheduler: microseconds
//!   on real hardware, see the README's benchmark section). Servers with many idle
//!   connections, background threads.
//! - [`Cq::wait_spin`]: busy-polls for a budget (a number of polls or a duration), then
//!   waits as [`Cq::wait`]. Give it a budget a little above the latency you expect (a round
//!   trip, a remote computation): replies inside the budget cost nothing more than busy
//!   polling, a long gap costs the budget's spinning and one wake-up. HPC codes between
//!   bursts, request/response clients.
//! - [`AsyncCq`](crate::AsyncCq) (feature `tokio`): the same arm / poll / sleep sequence
//!   driven by tokio's reactor.

use super::Cq;
use crate::completion::Completion;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// How long [`Cq::wait_spin`] busy-polls before it sleeps.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Spin {
    /// A first poll, then at most this many more empty ones: `n + 1` polls in all,
    /// `Polls(0)` one (an empty poll of the direct path is a few nanoseconds; the verbs
    /// path's `ibv_poll_cq` more).
    Polls(u32),
    /// For at most this long (the clock is read once per poll).
    For(Duration),
}

impl Cq {
    /// Waits for completions: busy-polls for `spin`, then sleeps on the CQ's completion
    /// channel as [`Cq::wait`] does (poll, arm, poll, sleep: no wake-up is missed), until
    /// something arrives or `timeout` (counted from the call, spinning included) runs out.
    /// Returns how many completions were written to `out` (0: the timeout ran out).
    ///
    /// Spinning ends early at the timeout; `Spin::Polls(0)` does one poll before sleeping.
    /// With the stepped software NIC, each poll runs the NIC first (as [`Cq::poll_n`]).
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Access, Completion, CqOptions, Device, PostFlags, PostSend, QpCaps, QueuePair, Spin};
    /// use std::time::Duration;
    /// let dev = Device::sim(); // the software NIC, in its own thread
    /// let ch = dev.create_channel()?;
    /// let mut cq = dev.create_cq_with(&CqOptions::new(64).channel(&ch))?;
    /// let pd = dev.alloc_pd()?;
    /// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    /// let me = qp.endpoint()?;
    /// qp.connect(&me)?; // loopback
    /// let mr = pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    /// let mut out = [Completion::default(); 4];
    /// // Nothing posted: 1000 polls, then a 10 ms sleep, then 0.
    /// assert_eq!(cq.wait_spin(&mut out, Spin::Polls(1000), Some(Duration::from_millis(10)))?, 0);
    /// qp.write_inline(b"hi", mr.remote(0)?, 7, PostFlags::SIGNALED)?;
    /// // Found while spinning, or by the sleep that follows 50 us of it.
    /// let n = cq.wait_spin(&mut out, Spin::For(Duration::from_micros(50)), None)?;
    /// assert_eq!((n, out[0].cookie), (1, 7));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// Those of [`Cq::wait`], before any spinning: [`Error::NoChannel`] for a CQ created
    /// without a completion channel, [`Error::InvalidParameter`] for an empty `out`.
    pub fn wait_spin(
        &mut self,
        out: &mut [Completion],
        spin: Spin,
        timeout: Option<Duration>,
    ) -> Result<usize> {
        if self.channel().is_none() {
            return Err(Error::NoChannel { cqn: self.cqn() });
        }
        if out.is_empty() {
            return Err(Error::InvalidParameter {
                what: "completion slots (none to fill)",
                value: 0,
            });
        }
        let start = Instant::now();
        let mut polls = 0u64;
        loop {
            self.dev.process();
            let n = self.poll(out);
            if n > 0 {
                return Ok(n);
            }
            polls += 1;
            let spent = start.elapsed();
            let done = match spin {
                Spin::Polls(p) => polls > u64::from(p),
                Spin::For(d) => spent >= d,
            };
            if done || timeout.is_some_and(|t| spent >= t) {
                break;
            }
            std::hint::spin_loop();
        }
        let rest = timeout.map(|t| t.saturating_sub(start.elapsed()));
        self.wait(out, rest)
    }
}
