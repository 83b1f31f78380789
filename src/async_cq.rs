//! Completions as an async stream (feature `tokio`): [`AsyncCq`] drives a CQ's arm / poll /
//! sleep sequence from tokio's reactor, with the completion channel's descriptor in an
//! [`AsyncFd`].
//!
//! The sequence cannot lose a wake-up: a completion is looked for by polling; when there
//! is none the CQ is armed, then polled once more (a completion that arrived before the arm
//! raises no event); only then does the task wait for the channel to become readable. When
//! it does, every pending event is read (each one disarms the CQ) before tokio's readiness is
//! cleared, so an event that arrives after that read makes the descriptor readable again.

use crate::completion::Completion;
use crate::error::{Error, Result};
use crate::resources::channel::Taken;
use crate::resources::{CompletionChannel, Cq, Notify};
use core::pin::Pin;
use core::task::{ready, Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Completions polled from the ring at once (handed out one by one).
const BATCH: usize = 16;

/// A CQ whose completions are awaited: `cq.next().await` instead of a polling loop.
///
/// Created from a [`Cq`] made with a completion channel of its own
/// ([`CqOptions::channel`](crate::CqOptions::channel)): `AsyncCq` reads every event of that
/// channel and sleeps until the channel's descriptor becomes readable, which it does when the
/// first event is queued, not for each one. A channel serving other CQs would have their
/// events taken here, and the event of this CQ could arrive without a new readiness edge:
/// [`AsyncCq::new`] refuses a channel that serves other CQs, and while the `AsyncCq` lives a
/// CQ created on the channel is refused ([`Error::ChannelTaken`]), and a wait or
/// [`CompletionChannel::try_event`] through another handle of the channel leaves this CQ's
/// events to the stream (as it leaves a [`Cq::wait`]'s). Nothing is allocated per completion; completions are polled in
/// batches of 16 into a buffer inside. The stream never ends; errors (a failed arm, an
/// unreadable channel) are items.
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{AsyncCq, CqOptions, Device, PostFlags, PostSend, QpCaps, QueuePair};
/// let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
/// rt.block_on(async {
///     let dev = Device::sim();
///     let ch = dev.create_channel()?;
///     let cq = dev.create_cq_with(&CqOptions::new(64).channel(&ch))?;
///     let pd = dev.alloc_pd()?;
///     let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
///     let me = qp.endpoint()?;
///     qp.connect(&me)?; // loopback
///     let mr = pd.alloc_mr(64, blueflame::Access::LOCAL_WRITE | blueflame::Access::REMOTE_WRITE)?;
///     let mut cq = AsyncCq::new(cq)?;
///     qp.write_inline(b"hi", mr.remote(0)?, 42, PostFlags::SIGNALED)?;
///     let c = cq.next().await?;
///     assert_eq!((c.cookie, c.is_ok()), (42, true));
///     Ok::<(), blueflame::Error>(())
/// })?;
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct AsyncCq {
    cq: Cq,
    fd: AsyncFd<CompletionChannel>,
    buf: [Completion; BATCH],
    head: usize,
    len: usize,
    /// An arm is outstanding (no event read since it was made).
    armed: bool,
    /// Keeps other CQs off the channel, and the CQ's events for this stream, while it lives.
    _taken: Taken,
}

impl core::fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AsyncCq")
            .field("cq", &self.cq)
            .field("buffered", &(self.len - self.head))
            .field("armed", &self.armed)
            .finish()
    }
}

impl AsyncCq {
    /// Takes `cq` (created with a completion channel) and registers its channel's
    /// descriptor with the current tokio runtime.
    ///
    /// # Errors
    /// [`Error::NoChannel`] for a CQ without a completion channel;
    /// [`Error::InvalidParameter`] when the channel serves other CQs too (checked, and the
    /// channel taken, in one step: a CQ created on it meanwhile is either counted here or
    /// refused with [`Error::ChannelTaken`]);
    /// [`Error::Unsupported`] outside a tokio runtime, or inside one built without I/O
    /// (`enable_io`); [`Error::Io`] when the reactor refuses the descriptor.
    ///
    /// # Panics
    /// tokio 1.x has no call that says whether a runtime has its I/O driver: registering a
    /// descriptor without one panics inside tokio (`AsyncFd::with_interest` and
    /// `AsyncFd::try_with_interest` alike). That panic is caught here and returned as
    /// [`Error::Unsupported`], but the panic hook still runs (the default one prints tokio's
    /// message), and a program built with `panic = "abort"` aborts there.
    pub fn new(cq: Cq) -> Result<AsyncCq> {
        let Some(ch) = cq.channel().cloned() else {
            return Err(Error::NoChannel { cqn: cq.cqn() });
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Unsupported(
                "AsyncCq::new outside a tokio runtime (call it from a task or block_on)",
            ));
        }
        // Before the descriptor is registered: a refusal here registers nothing. Released if
        // the registration fails.
        let taken = ch.inner.take_alone(cq.cqn())?;
        // tokio panics at its `driver::Handle::io()` when the runtime has no I/O driver,
        // before it changes anything: nothing is left half-done by the unwinding (the channel
        // handle moved in drops), hence AssertUnwindSafe. Any other panic goes on.
        let register =
            std::panic::AssertUnwindSafe(|| AsyncFd::with_interest(ch, Interest::READABLE));
        let fd = match std::panic::catch_unwind(register) {
            Ok(r) => r.map_err(Error::Io)?,
            Err(p) if io_disabled(&*p) => {
                return Err(Error::Unsupported(
                    "AsyncCq::new in a tokio runtime without I/O (build it with enable_io)",
                ))
            }
            Err(p) => std::panic::resume_unwind(p),
        };
        Ok(AsyncCq {
            cq,
            fd,
            buf: [Completion::default(); BATCH],
            head: 0,
            len: 0,
            armed: false,
            _taken: taken,
        })
    }

    /// The next completion, waiting (without blocking the thread) until there is one.
    ///
    /// # Errors
    /// Arming the CQ or reading its channel failed.
    pub async fn next(&mut self) -> Result<Completion> {
        core::future::poll_fn(|cx| self.poll_completion(cx)).await
    }

    /// The next completion if there is one; otherwise arms the CQ and registers `cx` to be
    /// woken by its channel.
    ///
    /// # Errors
    /// Arming the CQ or reading its channel failed.
    pub(crate) fn poll_completion(&mut self, cx: &mut Context<'_>) -> Poll<Result<Completion>> {
        loop {
            if self.head < self.len {
                let c = self.buf[self.head];
                self.head += 1;
                return Poll::Ready(Ok(c));
            }
            self.cq.dev.process();
            let n = self.cq.poll(&mut self.buf);
            if n > 0 {
                (self.head, self.len) = (0, n);
                continue;
            }
            if !self.armed {
                // Arm, then poll again: a completion written before the arm raises no event.
                self.cq.arm(Notify::Any)?;
                self.armed = true;
                continue;
            }
            let mut guard = match ready!(self.fd.poll_read_ready(cx)) {
                Ok(g) => g,
                Err(e) => return Poll::Ready(Err(Error::Io(e))),
            };
            // Read every pending event before clearing tokio's readiness: one arriving after
            // this loop makes the descriptor readable again.
            while self._taken.try_event()?.is_some() {
                self.armed = false;
            }
            guard.clear_ready();
        }
    }

    /// The CQ (to check it, or read its counters).
    pub fn get_ref(&self) -> &Cq {
        &self.cq
    }

    /// Gives the CQ back (and the channel: CQs may be created on it again). Completions
    /// already taken from the ring and not yet returned by [`AsyncCq::next`] are returned
    /// with it.
    pub fn into_inner(self) -> (Cq, Vec<Completion>) {
        let rest = self.buf[self.head..self.len].to_vec();
        (self.cq, rest)
    }
}

/// Whether a panic's payload is tokio's "A Tokio 1.x context was found, but IO is disabled"
/// (`driver::Handle::io`).
fn io_disabled(payload: &(dyn core::any::Any + Send)) -> bool {
    let msg = match (
        payload.downcast_ref::<String>(),
        payload.downcast_ref::<&str>(),
    ) {
        (Some(s), _) => s.as_str(),
        (None, Some(s)) => s,
        (None, None) => return false,
    };
    msg.contains("IO is disabled")
}

impl futures_core::Stream for AsyncCq {
    type Item = Result<Completion>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_completion(cx).map(Some)
    }
}
