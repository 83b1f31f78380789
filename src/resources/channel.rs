//! Completion channels: where the completion events of armed CQs arrive, one channel shared
//! by any number of CQs of a device.
//!
//! What runs where:
//! - software NIC: the NIC raises an event when an armed CQ gets an entry (one per arm) and
//!   hands it to the channel through `mlx5::sim::CqEventSink`, from the NIC's thread (or
//!   whoever steps it); the channel queues it and wakes its waiters.
//! - rdma-core devices: the kernel queues the event on the `ibv_comp_channel`; a waiter reads
//!   it with `ibv_get_cq_event` (the descriptor is non-blocking) and the channel queues it.
//!   Events are acknowledged (`ibv_ack_cq_events`) in batches, and all of a CQ's before it
//!   is destroyed.
//!
//! Each event read advances its CQ's arm sequence number (rdma-core's `mlx5_cq_event`, UCX's
//! `cq_sn++`), which the next arm of the direct path writes. Events read for a CQ nobody waits
//! for stay queued for that CQ: a [`Cq::wait`](super::Cq::wait) of it, or the next
//! [`CompletionChannel::try_event`] / [`CompletionChannel::wait`]. While a `Cq::wait` of a CQ
//! runs, the channel's own `wait`/`try_event` leave that CQ's events to it.
//!
//! The channel's descriptor ([`AsFd`]) is readable while an event waits (an eventfd kept in
//! step with the queue; on rdma-core devices an epoll set of that eventfd and the
//! `ibv_comp_channel` descriptor).

use super::Device;
use crate::backend::{ChannelSource, EventSink};
use crate::error::{Error, Result};
use crate::verbs::channel::CompChannel;
use crate::verbs::fd;
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A completion event: the CQ `cqn` (see [`Cq::cqn`](super::Cq::cqn)) has a new entry since
/// it was armed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CqEvent {
    /// The CQ.
    pub cqn: u32,
}

/// Which completions raise the event of an armed CQ.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notify {
    /// The next completion of any kind.
    Any,
    /// The next solicited completion (a send or write-with-immediate sent with
    /// [`PostFlags::SOLICITED`](crate::PostFlags)) or error completion (flushes included).
    Solicited,
}

/// Acknowledge a CQ's events to rdma-core once this many are read (and all of them before
/// the CQ is destroyed): `ibv_ack_cq_events` takes a lock.
const ACK_BATCH: u32 = 64;

/// One CQ on the channel.
struct Member {
    id: u32,
    /// Tells this CQ from an earlier one of the same number.
    token: u64,
    /// Events read so far, modulo 4: the arm sequence number.
    arm_sn: u32,
    /// The `ibv_cq` (rdma-core devices) and its events read but not acknowledged.
    cq: usize,
    unacked: u32,
}

#[derive(Default)]
struct State {
    pending: VecDeque<u32>,
    /// Whether the `ready` eventfd is signalled (it is while `pending` is not empty).
    ready_set: bool,
    /// A thread sleeps in `poll` on the rdma-core descriptor (the others on the condvar).
    reader: bool,
    members: Vec<Member>,
    /// CQs a `Cq::wait` sleeps for: their events are theirs.
    waiting: Vec<u32>,
    next_token: u64,
    /// The CQ whose `AsyncCq` reads every event of the channel (feature `tokio`): no other
    /// CQ may join while it is set.
    taken_by: Option<u32>,
}

pub(crate) struct ChannelInner {
    dev: Device,
    state: Mutex<State>,
    cond: Condvar,
    /// Readable while `pending` is not empty.
    ready: OwnedFd,
    /// Wakes the thread in `poll` when another thread queued an event.
    wake: OwnedFd,
    /// Where the events come from: rdma-core's channel, read from its descriptor, or
    /// nothing to read (the software NIC pushes them: [`EventSink`]).
    pub(crate) source: ChannelSource,
    /// With rdma-core's channel: the epoll set of `ready` and its descriptor.
    epoll: Option<OwnedFd>,
}

/// A completion channel: the completion events of the CQs created with it
/// ([`CqOptions::channel`](super::CqOptions::channel)) arrive here after they are armed
/// ([`Cq::arm`](super::Cq::arm)). Cloning gives another handle to the same channel; any
/// number of threads may wait on it.
///
/// Most programs call [`Cq::wait`](super::Cq::wait), which polls, arms and sleeps without
/// missing a wake-up. The descriptor ([`AsFd`], [`AsRawFd`]) is readable while an event waits,
/// for epoll, mio or tokio; then call [`CompletionChannel::try_event`]. An event queued for a
/// CQ whose [`Cq::wait`](super::Cq::wait) is running keeps the descriptor readable although
/// `try_event` leaves it to that waiter (`None`): do not mix descriptor readiness with
/// `Cq::wait` on the same channel, or expect such brief spurious readiness.
///
/// On the stepped software NIC (`Device::sim_stepped`) nothing runs the NIC while a
/// thread sleeps: a wait finds only what the NIC produced before it, so give it a timeout.
#[derive(Clone)]
pub struct CompletionChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl core::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl CompletionChannel {
    /// A channel of `dev` (`ibv_create_comp_channel` on rdma-core devices).
    pub(crate) fn new(dev: &Device) -> Result<CompletionChannel> {
        let ready = fd::eventfd().map_err(Error::Io)?;
        let wake = fd::eventfd().map_err(Error::Io)?;
        let source = dev.backend.create_channel()?;
        let epoll = match &source {
            Some(ch) => Some(fd::epoll_of(&[ready.as_raw_fd(), ch.fd()]).map_err(Error::Io)?),
            None => None,
        };
        Ok(CompletionChannel {
            inner: Arc::new(ChannelInner {
                dev: dev.clone(),
                state: Mutex::default(),
                cond: Condvar::new(),
                ready,
                wake,
                source,
                epoll,
            }),
        })
    }

    /// Waits for the next event of any CQ of the channel (except the CQs a
    /// [`Cq::wait`](super::Cq::wait) waits for) for at most `timeout` (None: no limit).
    /// Returns None when the time is up. The CQ must be armed again for its next event.
    ///
    /// # Errors
    /// [`Error::Io`] when the wait itself fails, or the channel's descriptor did (its device
    /// was removed or reset).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Option<CqEvent>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let id = self.inner.wait_for(None, deadline)?;
        Ok(id.map(|cqn| CqEvent { cqn }))
    }

    /// The next event if one is there; never blocks.
    ///
    /// # Errors
    /// [`Error::Io`] when the channel's descriptor failed (its device was removed or reset:
    /// the kernel fails every read of it from then on).
    pub fn try_event(&self) -> Result<Option<CqEvent>> {
        let mut st = self.inner.lock();
        // Events already read are handed out before a failure is.
        let drained = self.inner.drain(&mut st);
        let id = self.inner.take(&mut st, None);
        match (id, drained) {
            (Some(cqn), _) => Ok(Some(CqEvent { cqn })),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(None),
        }
    }

    /// Whether this channel belongs to `dev`.
    pub(crate) fn is_of(&self, dev: &Device) -> bool {
        self.inner.dev.same(dev)
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.inner.epoll {
            Some(ep) => ep.as_fd(),
            None => self.inner.ready.as_fd(),
        }
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl ChannelInner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds CQ `id` (`cq`: its `ibv_cq`, 0 on the software NIC); returns its token. Checks
    /// and joins under the one lock `ChannelInner::take_alone` holds: a CQ joins before the
    /// channel is taken (and `take_alone` refuses), or is refused.
    ///
    /// # Errors
    /// [`Error::ChannelTaken`] while an `AsyncCq` holds the channel.
    pub(crate) fn attach(&self, id: u32, cq: usize) -> Result<u64> {
        let mut st = self.lock();
        if let Some(owner) = st.taken_by {
            return Err(Error::ChannelTaken { cqn: owner });
        }
        st.next_token += 1;
        let token = st.next_token;
        st.members.push(Member {
            id,
            token,
            arm_sn: 0,
            cq,
            unacked: 0,
        });
        Ok(token)
    }

    /// Takes the channel for CQ `id`, its only member, until the guard drops: from here on
    /// [`ChannelInner::attach`] refuses every other CQ (checked and set under one lock).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] (the count) when the channel serves other CQs too, or
    /// none; [`Error::ChannelTaken`] when it is taken already.
    #[cfg(feature = "tokio")]
    pub(crate) fn take_alone(self: &Arc<Self>, id: u32) -> Result<Taken> {
        let mut st = self.lock();
        if let Some(owner) = st.taken_by {
            return Err(Error::ChannelTaken { cqn: owner });
        }
        let members = st.members.len();
        if members != 1 || st.members[0].id != id {
            return Err(Error::InvalidParameter {
                what: "AsyncCq: CQs on the channel (it must serve this CQ alone)",
                value: members as u64,
            });
        }
        st.taken_by = Some(id);
        // Its events are the stream's: a wait or try_event through another handle of the
        // channel that took one would leave the stream believing its arm outstanding while
        // the device spent it (the next completion raises no event: the task sleeps for good).
        st.waiting.push(id);
        Ok(Taken {
            chan: self.clone(),
            id,
        })
    }

    /// Removes CQ `id` before it is destroyed: its events are acknowledged and forgotten.
    pub(crate) fn detach(&self, id: u32, token: u64) {
        let mut st = self.lock();
        if let Some(i) = st.members.iter().position(|m| m.token == token) {
            let m = st.members.swap_remove(i);
            // SAFETY: `m.cq` is the live `ibv_cq` whose `m.unacked` events were read and not
            // acknowledged (it is destroyed only after this).
            unsafe { CompChannel::ack(m.cq as *mut _, m.unacked) };
        }
        st.pending.retain(|&p| p != id);
        self.sync_ready(&mut st);
        drop(st);
        self.cond.notify_all();
    }

    /// The arm sequence number of CQ `id`.
    pub(crate) fn arm_sn(&self, id: u32, token: u64) -> u32 {
        let st = self.lock();
        st.members
            .iter()
            .find(|m| m.token == token && m.id == id)
            .map_or(0, |m| m.arm_sn)
    }

    /// Queues an event of CQ `id` (one of this channel's: `token` matches).
    fn deliver(&self, st: &mut State, id: u32, token: Option<u64>, cq: usize) -> bool {
        let Some(m) = st
            .members
            .iter_mut()
            .find(|m| m.id == id && token.map_or(m.cq == cq, |t| m.token == t))
        else {
            return false;
        };
        m.arm_sn = (m.arm_sn + 1) & 3;
        if m.cq != 0 {
            m.unacked += 1;
            if m.unacked >= ACK_BATCH {
                // SAFETY: a live `ibv_cq` (a member) with this many events unacknowledged.
                unsafe { CompChannel::ack(m.cq as *mut _, m.unacked) };
                m.unacked = 0;
            }
        }
        st.pending.push_back(id);
        if st.reader {
            fd::signal(&self.wake);
        }
        self.sync_ready(st);
        self.cond.notify_all();
        true
    }

    /// Reads every event waiting on the rdma-core descriptor (never blocks).
    ///
    /// # Errors
    /// [`Error::Io`] when the descriptor failed (a disassociated device's: its poll says
    /// EPOLLERR at once and its reads fail for good, so a wait that took it for "nothing
    /// yet" polled it again at once until its deadline).
    fn drain(&self, st: &mut State) -> Result<()> {
        let Some(ch) = &self.source else {
            return Ok(());
        };
        while let Some((cq, ctx)) = ch.next_event().map_err(Error::Io)? {
            if !self.deliver(st, ctx as u32, None, cq as usize) {
                // A CQ already detached (its QPs keep it alive until they go): acknowledge
                // now, its destruction waits for it.
                // SAFETY: the event was just read for this live `ibv_cq`.
                unsafe { CompChannel::ack(cq, 1) };
            }
        }
        Ok(())
    }

    /// Takes the first queued event of `filter` (None: of any CQ nobody waits for).
    fn take(&self, st: &mut State, filter: Option<u32>) -> Option<u32> {
        let i = match filter {
            Some(id) => st.pending.iter().position(|&p| p == id)?,
            None => {
                let waiting = &st.waiting;
                st.pending.iter().position(|p| !waiting.contains(p))?
            }
        };
        let id = st.pending.remove(i);
        self.sync_ready(st);
        id
    }

    /// Keeps `ready` readable exactly while events are queued.
    fn sync_ready(&self, st: &mut State) {
        let want = !st.pending.is_empty();
        if want != st.ready_set {
            if want {
                fd::signal(&self.ready);
            } else {
                fd::clear(&self.ready);
            }
            st.ready_set = want;
        }
    }

    /// Marks CQ `id` as waited for by a [`Cq::wait`](super::Cq::wait) (before it arms): the
    /// channel's own `wait` and `try_event` leave its events to it until the guard drops.
    pub(crate) fn waiter(&self, id: u32) -> Waiter<'_> {
        self.lock().waiting.push(id);
        Waiter { chan: self, id }
    }

    /// Waits for an event of `filter` (None: any CQ nobody waits for) until `deadline`.
    pub(crate) fn wait_for(
        &self,
        filter: Option<u32>,
        deadline: Option<Instant>,
    ) -> Result<Option<u32>> {
        let st = self.lock();
        self.wait_locked(st, filter, deadline).1
    }

    fn wait_locked<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        filter: Option<u32>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, Result<Option<u32>>) {
        loop {
            // Events already read are handed out before a failure is.
            let drained = self.drain(&mut st);
            if let Some(id) = self.take(&mut st, filter) {
                return (st, Ok(Some(id)));
            }
            if let Err(e) = drained {
                return (st, Err(e));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return (st, Ok(None)),
                },
                None => None,
            };
            match &self.source {
                Some(ch) if !st.reader => {
                    // This thread reads the rdma-core descriptor; the others sleep on the
                    // condvar until it queues their events.
                    st.reader = true;
                    drop(st);
                    let r = fd::poll2(ch.fd(), self.wake.as_raw_fd(), left);
                    st = self.lock();
                    st.reader = false;
                    fd::clear(&self.wake);
                    self.cond.notify_all();
                    if let Err(e) = r {
                        return (st, Err(Error::Io(e)));
                    }
                }
                _ => {
                    st = match left {
                        Some(left) => {
                            self.cond
                                .wait_timeout(st, left)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                        None => self.cond.wait(st).unwrap_or_else(|e| e.into_inner()),
                    };
                }
            }
        }
    }
}

/// A channel taken by an `AsyncCq` (see [`ChannelInner::take_alone`]); dropping it lets CQs join
/// again.
#[cfg(feature = "tokio")]
pub(crate) struct Taken {
    chan: Arc<ChannelInner>,
    id: u32,
}

#[cfg(feature = "tokio")]
impl Taken {
    /// The next event of the stream's CQ if one is there (never blocks).
    ///
    /// # Errors
    /// As [`CompletionChannel::try_event`].
    pub(crate) fn try_event(&self) -> Result<Option<u32>> {
        let mut st = self.chan.lock();
        let drained = self.chan.drain(&mut st);
        match (self.chan.take(&mut st, Some(self.id)), drained) {
            (Some(id), _) => Ok(Some(id)),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(None),
        }
    }
}

#[cfg(feature = "tokio")]
impl Drop for Taken {
    fn drop(&mut self) {
        self.chan.leave(self.id, true);
    }
}

/// A [`Cq::wait`](super::Cq::wait) in progress (see [`ChannelInner::waiter`]).
pub(crate) struct Waiter<'a> {
    chan: &'a ChannelInner,
    id: u32,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.chan.leave(self.id, false);
    }
}

impl ChannelInner {
    /// CQ `id`'s waiter (or, `taken`, its `AsyncCq`'s reservation) goes: events it left
    /// may now go to the channel's own waiters, who are woken.
    fn leave(&self, id: u32, taken: bool) {
        let mut st = self.lock();
        if taken {
            st.taken_by = None;
        }
        if let Some(i) = st.waiting.iter().position(|&w| w == id) {
            st.waiting.swap_remove(i);
        }
        let more = st.pending.iter().any(|p| !st.waiting.contains(p));
        drop(st);
        if more {
            self.cond.notify_all();
        }
    }
}

impl EventSink for ChannelInner {
    /// The software NIC's side of a CQ's channel: called when the armed CQ raises its event.
    fn cq_event(&self, id: u32, token: u64) {
        let mut st = self.lock();
        self.deliver(&mut st, id, Some(token), 0);
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::*;

    /// CPU time this thread has used.
    fn cpu() -> Duration {
        // SAFETY: `ru` is plain data, written by the call.
        let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
        // SAFETY: a live buffer.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        Duration::from_secs(ru.ru_utime.tv_sec as u64 + ru.ru_stime.tv_sec as u64)
            + Duration::from_micros(ru.ru_utime.tv_usec as u64 + ru.ru_stime.tv_usec as u64)
    }

    /// A channel whose rdma-core descriptor fails as the kernel's completion-event file does
    /// once its device is disassociated (hot removal, reset: `ib_uverbs_free_event_queue`
    /// sets `is_closed`; `ib_uverbs_event_poll` then says EPOLLERR at once and
    /// `ib_uverbs_event_read` fails with EIO for good): here the write end of a pipe whose
    /// read end is closed (poll: POLLERR; read: EBADF).
    fn failed_channel() -> CompletionChannel {
        let mut p = [0; 2];
        // SAFETY: a live two-descriptor buffer.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the read end, ours, closed once.
        unsafe { libc::close(p[0]) };
        let raw = Box::leak(Box::new(rdma_sys::ibv_comp_channel {
            context: core::ptr::null_mut(),
            fd: p[1],
            refcnt: 0,
        }));
        // SAFETY: leaked, so alive for the rest of the process.
        let source = Arc::new(unsafe { CompChannel::without_device(raw) });
        // Never destroyed (it has no context): kept reachable, not leaked (the
        // AddressSanitizer stage's leak check).
        static KEPT: std::sync::Mutex<Vec<Arc<CompChannel>>> = std::sync::Mutex::new(Vec::new());
        KEPT.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(source.clone());
        let ready = fd::eventfd().unwrap();
        let epoll = fd::epoll_of(&[ready.as_raw_fd(), source.fd()]).unwrap();
        CompletionChannel {
            inner: Arc::new(ChannelInner {
                dev: Device::sim_stepped(),
                state: Mutex::default(),
                cond: Condvar::new(),
                ready,
                wake: fd::eventfd().unwrap(),
                source: Some(source),
                epoll: Some(epoll),
            }),
        }
    }

    /// A failed descriptor is an error of the wait (`Error::Io`, as `CompletionChannel::wait`
    /// and `try_event` promise for "a failing descriptor"), at once: the wait polled the
    /// descriptor (POLLERR at once), read nothing, and polled again for the whole timeout,
    /// a core spent until the deadline (forever without one), every other waiter of the
    /// channel woken at each turn, and returned `Ok(None)` as if nothing had happened.
    #[test]
    fn a_failed_channel_descriptor_ends_the_wait_with_an_error_instead_of_spinning() {
        let ch = failed_channel();
        let (t0, c0) = (Instant::now(), cpu());
        let r = ch.wait(Some(Duration::from_millis(300)));
        let (took, spent) = (t0.elapsed(), cpu() - c0);
        assert!(
            matches!(r, Err(Error::Io(_))),
            "wait on a failed descriptor: {r:?} after {took:?}, {spent:?} of CPU"
        );
        assert!(spent < Duration::from_millis(100), "{spent:?} of CPU spent");
        let r = ch.try_event();
        assert!(matches!(r, Err(Error::Io(_))), "try_event: {r:?}");
    }
}
