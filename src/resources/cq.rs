//! Completion queues.

use super::channel::{CompletionChannel, Notify};
use super::events::Subject;
use super::{CqOptions, Device};
use crate::backend::{self, CqRings, CqSpec, Stamps};
use crate::clock::TimestampFormat;
use crate::completion::Completion;
use crate::direct::{CompletionQueue, Stamped};
use crate::error::{Error, Result};
use crate::queue::registry::Registry;
use crate::verbs::cq::VerbsCompletionQueue;
use crate::verbs::ex::VerbsApi;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A CQ's place on its completion channel.
pub(crate) struct ChannelLink {
    pub(crate) chan: CompletionChannel,
    pub(crate) id: u32,
    pub(crate) token: u64,
}

/// Keeps a CQ alive; the last owner (the poller or a QP) destroys it.
pub(crate) struct CqHandle {
    /// The backend's CQ (destroyed after the handle's drop: field).
    pub(crate) kind: backend::Cq,
    /// Forgets the CQ's events once it is destroyed (after `kind`): its number comes back.
    _forget: super::events::Forget,
    pub(crate) registry: Arc<Registry>,
    /// The completion channel, when the CQ has one.
    pub(crate) link: Option<ChannelLink>,
    /// The CQ stamps its completions in real time (a timestamped CQ of a device in
    /// real-time mode): a QP's two CQs must agree on it ([`CqHandle::check_ts_formats`]).
    pub(crate) real_time: bool,
}

impl CqHandle {
    /// Refuses a QP whose send and receive CQs stamp in different formats: on a device that
    /// stamps in real time, a timestamped CQ is created real-time and a plain one
    /// free-running, and the kernel refuses a QP over the two with `EOPNOTSUPP` (mlx5_ib's
    /// `get_qp_ts_format`: "the send ts_format does not match the receive ts_format").
    ///
    /// # Errors
    /// [`Error::Timestamps`].
    pub(crate) fn check_ts_formats(send: &CqHandle, recv: &CqHandle) -> Result<()> {
        if send.real_time != recv.real_time {
            return Err(Error::Timestamps {
                why: "a QP's send and receive CQs on a device that stamps in real time: \
                      both with timestamps or neither (the kernel refuses a QP over a \
                      real-time CQ and a free-running one)",
            });
        }
        Ok(())
    }

    /// What the device's events call this CQ.
    pub(crate) fn subject(&self) -> Subject {
        self.kind.subject()
    }
}

/// Runs `destroy` (a QP's device object destroyed) with the lists of both the QP's CQs
/// locked, in address order (one lock when both are one CQ: a DC target's or initiator's
/// one CQ is passed twice), then leaves a tombstone for `qpn` in each (`direct::teardown`):
/// no QP can attach meanwhile, so none can reuse the number before the entries the
/// destroyed QP may have left are buried.
pub(crate) fn destroy_and_bury(cqs: [&CqHandle; 2], qpn: u32, destroy: impl FnOnce()) {
    let [a, b] = cqs;
    let (first, second) = if Arc::as_ptr(&a.registry) <= Arc::as_ptr(&b.registry) {
        (a, b)
    } else {
        (b, a)
    };
    let same = Arc::ptr_eq(&a.registry, &b.registry);
    let mut g1 = first.registry.lock();
    let mut g2 = (!same).then(|| second.registry.lock());
    destroy();
    first.registry.bury(&mut g1, qpn);
    if let Some(g2) = g2.as_mut() {
        second.registry.bury(g2, qpn);
    }
    drop((g2, g1));
    // `bury` dropped the tombstones the pollers had passed, under the locks: they may have
    // held the last pins on regions whose domain went.
    crate::queue::lifetime::sweep_held();
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        // First off the channel: its events acknowledged (`ibv_destroy_cq` waits for that),
        // the software NIC's sink removed, the queued ones forgotten.
        if let Some(l) = &self.link {
            self.kind.unlink();
            l.chan.inner.detach(l.id, l.token);
        }
    }
}

/// The verbs poller, out of line: inlined into [`Cq::poll`] its set-up (the extended
/// poller's operations, the registry checks) ran before the direct path's first compare and
/// took the empty direct poll from 10 to 19 instructions (`cargo xtask icount`).
#[inline(never)]
fn poll_verbs(p: &mut VerbsCompletionQueue, out: &mut [Completion]) -> usize {
    p.poll(out)
}

/// [`poll_verbs`] into one slot: [`Cq::poll`] tells it from the others where it is
/// inlined, at no cost where the caller's `out` is an array of one (a latency loop's), and
/// the poller checks no length (3 instructions a poll of one on rdma-core's mlx5). Inlined:
/// it is the poller's one jump through its poll of one (`VerbsCompletionQueue::poll_one`),
/// a direct jump less than a function of its own.
#[inline(always)]
fn poll_verbs_one(p: &mut VerbsCompletionQueue, c: &mut Completion) -> usize {
    p.poll_one(c)
}

/// An explicit tag (`repr(u8)`, at the start): the poll's dispatch is one byte compare,
/// whatever niches the two pollers' fields offer.
#[repr(u8)]
enum Poller {
    Direct(CompletionQueue),
    Verbs(VerbsCompletionQueue),
}

/// A completion queue and its poller.
///
/// [`Cq::poll`] takes what has arrived, never blocks and costs about ten instructions when
/// nothing has; [`Cq::poll_n`] spins until `n` completions or a number of empty polls.
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, PostFlags, PostSend, QpCaps, WcOpcode, WcStatus};
/// let dev = Device::sim();                        // the NIC in its own thread
/// let pd = dev.alloc_pd()?;
/// let mut cq = dev.create_cq(64)?;
/// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
/// qp.connect(&qp.endpoint()?)?;
/// let mr = pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
/// for i in 0..3 {
///     qp.write_inline(&[i as u8], mr.remote(i)?, i as u64, PostFlags::SIGNALED)?;
/// }
/// let mut out = [Completion::default(); 8];
/// let n = cq.poll_n(&mut out, 3, 1 << 32);        // up to 2^32 empty polls
/// assert_eq!(n, 3);
/// for (i, c) in out[..n].iter().enumerate() {
///     assert_eq!((c.cookie, c.status), (i as u64, WcStatus::Success));
///     assert_eq!(c.opcode, WcOpcode::RdmaWrite);
/// }
/// assert_eq!(cq.poll(&mut out), 0);               // nothing more
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct Cq {
    // Field order: the poller goes before the handle that frees its ring.
    poller: Poller,
    pub(crate) handle: Arc<CqHandle>,
    cqn: u32,
    capacity: u32,
    pub(crate) dev: Device,
    /// The UAR page the direct path arms through (null when it has none).
    cq_uar: *mut u8,
    /// What a timed poll's stamps are (None: created without timestamps).
    stamps: Option<Stamps>,
    /// Last: once the poller (and the scatter tables it held) went, the regions whose pins
    /// it held past their domain go.
    _sweep: crate::queue::lifetime::SweepHeld,
}

// SAFETY: `cq_uar` is the CQ's doorbell page, written only by `arm` (through `&mut self`);
// the rest is Send on its own.
unsafe impl Send for Cq {}

impl core::fmt::Debug for Cq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cq")
            .field("cqn", &self.cqn)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Cq {
    /// The verbs path's poller (None on the direct path): for tests that stand in for
    /// another thread between two of its steps.
    #[cfg(test)]
    pub(crate) fn verbs_poller(&mut self) -> Option<&mut VerbsCompletionQueue> {
        match &mut self.poller {
            Poller::Direct(_) => None,
            Poller::Verbs(p) => Some(p),
        }
    }

    /// A CQ as `opts` say (compressing with `opts.zip` when set).
    pub(crate) fn new(dev: &Device, opts: &CqOptions) -> Result<Cq> {
        let max = dev.backend.max_cqe();
        if opts.entries == 0 || opts.entries > max {
            // rdma-core refuses 0 (EINVAL); more than the device has is refused too.
            return Err(Error::CqSize {
                entries: opts.entries,
                max,
            });
        }
        if opts.timestamps && opts.zip.is_some() {
            // A mini-CQE has no room for one (`mlx5_mini_cqe8`): the completions of a
            // session would all carry the title's time, or none.
            return Err(Error::Timestamps {
                why: "with CQE compression: a mini-CQE carries no timestamp",
            });
        }
        let chan = opts.channel.as_ref();
        let spec = CqSpec {
            entries: opts.entries,
            cqe_size: opts.cqe_size,
            zip: opts.zip,
            timestamps: opts.timestamps,
            channel: chan.map(|c| &c.inner.source),
        };
        let (kind, rings, cqn) = dev.backend.create_cq(&spec)?;
        let link = match chan {
            Some(c) => {
                // Refused (an AsyncCq holds the channel): `kind` drops here, destroyed.
                let token = c.inner.attach(cqn, kind.event_handle())?;
                let sink: std::sync::Weak<dyn backend::EventSink> = Arc::downgrade(&c.inner) as _;
                kind.link(cqn, token, sink);
                Some(ChannelLink {
                    chan: c.clone(),
                    id: cqn,
                    token,
                })
            }
            None => None,
        };
        let (poller, capacity, cq_uar, stamps) = match rings {
            CqRings::Direct {
                raw,
                promised,
                compressed,
                stamps,
            } => {
                // SAFETY: the ring and record belong to the CQ `kind` owns, which the handle
                // keeps alive after the poller (field order of Cq); nobody else polls it
                // (rdma-core is never asked to).
                let mut p = unsafe { CompletionQueue::new(&raw)? };
                p.guarantee(promised);
                if compressed {
                    p.set_compressed();
                }
                (Poller::Direct(p), raw.cqe_cnt, raw.cq_uar, stamps)
            }
            CqRings::Verbs { cq, stamps } => {
                let capacity = cq.capacity();
                (
                    Poller::Verbs(VerbsCompletionQueue::new(cq, cqn)),
                    capacity,
                    std::ptr::null_mut(),
                    stamps,
                )
            }
        };
        let registry = match &poller {
            Poller::Direct(p) => p.registry.clone(),
            Poller::Verbs(p) => p.registry.clone(),
        };
        Ok(Cq {
            poller,
            handle: Arc::new(CqHandle {
                _forget: super::events::Forget::new(&dev.events, [Some(kind.subject()), None]),
                kind,
                registry,
                link,
                real_time: matches!(stamps, Some(Stamps::Cqe(TimestampFormat::RealTime))),
            }),
            cqn,
            capacity,
            dev: dev.clone(),
            cq_uar,
            stamps,
            _sweep: Default::default(),
        })
    }

    /// The CQ number: the device's on the direct path; on the verbs path, where rdma-core
    /// does not expose it, a number of blueflame's own (unique in the process, bit 31 set).
    /// [`CqEvent::cqn`](crate::CqEvent::cqn) names CQs by it.
    pub fn cqn(&self) -> u32 {
        self.cqn
    }

    /// Whether the CQ compresses its entries (direct path).
    pub(crate) fn compressed(&self) -> bool {
        match &self.poller {
            Poller::Direct(c) => c.is_compressed(),
            Poller::Verbs(_) => false,
        }
    }

    /// The rdma-core API this CQ is polled with on the verbs path: extended
    /// (`ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`) where the provider has it,
    /// else `ibv_poll_cq` (`BLUEFLAME_VERBS_API` overrides); None on the direct path.
    pub fn verbs_api(&self) -> Option<VerbsApi> {
        match &self.poller {
            Poller::Direct(_) => None,
            Poller::Verbs(p) => Some(p.api()),
        }
    }

    /// Entries in the ring.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Entries the device guarantees, shared out among the queues (the ring's on the
    /// software NIC; one fewer on rdma-core's mlx5 provider, which reports `ncqe - 1`).
    pub fn guaranteed(&self) -> u32 {
        self.handle.registry.slots.capacity()
    }

    /// Polls up to `out.len()` completions; returns how many. Never blocks, never allocates.
    #[inline(always)]
    pub fn poll(&mut self, out: &mut [Completion]) -> usize {
        match &mut self.poller {
            Poller::Direct(p) => p.poll(out),
            Poller::Verbs(p) => match out {
                [c] => poll_verbs_one(p, c),
                _ => poll_verbs(p, out),
            },
        }
    }

    /// Polls as [`Cq::poll`] does, and writes beside each completion when the NIC wrote
    /// it: `times[i]` for `out[i]`, in nanoseconds of the NIC's clock (the kernel's
    /// timecounter over the free-running counter, as `mlx5dv_ts_to_ns` converts it with
    /// the clock-info page read again at each call that returns completions, as rdma-core
    /// reads it at each `ibv_start_poll`; or real time on a device that stamps so: see
    /// [`Device::clock`](super::Device::clock)). None for an error completion, whose CQE
    /// holds its syndromes where the timestamp would be. Polls at most as many as the
    /// shorter slice holds. The CQ must be created with
    /// [`CqOptions::timestamps`](super::CqOptions::timestamps).
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Access, Completion, CqOptions, Device, PostFlags, PostSend, QpCaps};
    /// let dev = Device::sim();
    /// let pd = dev.alloc_pd()?;
    /// let mut cq = dev.create_cq_with(&CqOptions::new(16).timestamps())?;
    /// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    /// qp.connect(&qp.endpoint()?)?;
    /// let mr = pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    /// let before = dev.clock()?.ns;
    /// qp.write_inline(&[1], mr.remote(0)?, 7, PostFlags::SIGNALED)?;
    /// let (mut out, mut times) = ([Completion::default(); 4], [None; 4]);
    /// let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    /// let mut n = 0;
    /// while n == 0 {
    ///     assert!(std::time::Instant::now() < deadline, "no completion within 10 s");
    ///     n = cq.poll_timed(&mut out, &mut times)?;
    /// }
    /// assert!(out[0].is_ok(), "{:?}", out[0]);
    /// let at = times[0].expect("a success carries its time");
    /// assert!(at >= before && at <= dev.clock()?.ns);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// [`Error::Timestamps`] for a CQ created without timestamps.
    pub fn poll_timed(
        &mut self,
        out: &mut [Completion],
        times: &mut [Option<u64>],
    ) -> Result<usize> {
        let Some(stamps) = self.stamps else {
            return Err(Error::Timestamps {
                why: "the CQ was created without CqOptions::timestamps",
            });
        };
        let room = out.len().min(times.len());
        let (out, times) = (&mut out[..room], &mut times[..room]);
        let n = match &mut self.poller {
            Poller::Direct(p) => p.poll_into(&mut Stamped { out, times }),
            Poller::Verbs(p) => p.poll_timed(out, times),
        };
        match stamps {
            Stamps::Ns => {}
            Stamps::Cqe(TimestampFormat::RealTime) => {
                for t in times[..n].iter_mut().flatten() {
                    *t = mlx5::clock::real_time_to_ns(*t);
                }
            }
            Stamps::Cqe(TimestampFormat::FreeRunning) if n > 0 => {
                // Checked at creation; a page that went away meanwhile leaves no time.
                let info = self.dev.backend.clock_info();
                for t in times[..n].iter_mut() {
                    *t = info.zip(*t).map(|(i, ts)| i.ts_to_ns(ts));
                }
            }
            Stamps::Cqe(TimestampFormat::FreeRunning) => {}
        }
        Ok(n)
    }

    /// Polls until `n` completions have arrived or `spins` empty polls in a row; returns
    /// how many arrived (in `out[..n]`). With the stepped software NIC, runs it between polls.
    /// `n` larger than `out` waits for `out.len()` completions.
    pub fn poll_n(&mut self, out: &mut [Completion], n: usize, spins: u64) -> usize {
        let n = n.min(out.len());
        let mut got = 0;
        let mut idle = 0;
        while got < n && idle < spins {
            self.dev.process();
            let k = self.poll(&mut out[got..n]);
            got += k;
            idle = if k == 0 { idle + 1 } else { 0 };
            if k == 0 {
                std::hint::spin_loop();
            }
        }
        got
    }

    /// Reads the device's asynchronous events (never blocks) and reports one about this CQ
    /// (`IBV_EVENT_CQ_ERR`: it overran or its memory failed, it writes no more completions),
    /// a QP that completes on it, the port or the device. The poll itself never looks (it
    /// stays a handful of instructions): call this when completions stop coming (when
    /// [`Cq::poll_n`] comes back short, for one). A post refused with a full queue or CQ
    /// reads the events too.
    ///
    /// # Errors
    /// [`Error::AsyncEvent`](crate::Error::AsyncEvent).
    pub fn check(&self) -> Result<()> {
        let mut subjects = vec![self.handle.subject()];
        subjects.extend(
            self.handle
                .registry
                .list
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|a| Subject::Qp(a.qpn)),
        );
        self.dev.events.check(&self.dev.backend, &subjects)
    }

    /// The completion channel this CQ's events go to ([`CqOptions::channel`]).
    pub fn channel(&self) -> Option<&CompletionChannel> {
        self.handle.link.as_ref().map(|l| &l.chan)
    }

    /// Arms the CQ for one completion event: the next completion (`Notify::Any`), or the
    /// next solicited or error one (`Notify::Solicited`), raises one event on the CQ's
    /// channel; then the CQ must be armed again. Direct path: the arm doorbell as rdma-core's
    /// `mlx5_arm_cq` (a ConnectX, and the software NIC, raise the event at once when entries
    /// past the consumer index are already in the ring); verbs path: `ibv_req_notify_cq`
    /// (rxe raises it only for completions that come after the arm). Poll after arming
    /// ([`Cq::wait`] does it all): a completion that came before the arm is found by that
    /// poll on every device.
    ///
    /// # Errors
    /// [`Error::NoChannel`] for a CQ created without a channel; [`Error::Verbs`] from
    /// `ibv_req_notify_cq`; [`Error::Unsupported`] for a direct-path CQ whose UAR page
    /// `mlx5dv_init_obj` did not give.
    pub fn arm(&mut self, n: Notify) -> Result<()> {
        let Some(link) = &self.handle.link else {
            return Err(Error::NoChannel { cqn: self.cqn });
        };
        let solicited = matches!(n, Notify::Solicited);
        match &self.poller {
            Poller::Direct(p) => {
                if self.cq_uar.is_null() {
                    return Err(Error::Unsupported(
                        "arming a CQ whose UAR page mlx5dv_init_obj did not give",
                    ));
                }
                let sn = link.chan.inner.arm_sn(link.id, link.token);
                // SAFETY: `cq_uar` is this CQ's UAR page (mlx5dv_init_obj or the software
                // NIC), mapped while the CQ's handle lives.
                unsafe { p.arm(self.cq_uar, sn, solicited) };
                Ok(())
            }
            Poller::Verbs(_) => self.handle.kind.req_notify(solicited),
        }
    }

    /// Waits for completions without spinning: polls; if there is none, arms the CQ, polls
    /// again (a completion that came before the arm is found here), then sleeps on the
    /// channel until this CQ's event and starts over. Returns how many completions are in
    /// `out` (at least one), or 0 when `timeout` passed (None: no limit). Never misses a
    /// wake-up: an event read by another waiter of the channel stays queued for this CQ.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// use blueflame::{Completion, CqOptions, Device, Payload, PostFlags, PostSend, QpCaps, QueuePair, Request};
    /// use std::time::Duration;
    /// let dev = Device::sim(); // the software NIC, running in its own thread
    /// let ch = dev.create_channel()?;
    /// let mut cq = dev.create_cq_with(&CqOptions::new(16).channel(&ch))?;
    /// let pd = dev.alloc_pd()?;
    /// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    /// let me = qp.endpoint()?;
    /// qp.connect(&me)?; // loopback
    /// let mut out = [Completion::default(); 4];
    /// // Nothing posted: the wait ends at its timeout.
    /// assert_eq!(cq.wait(&mut out, Some(Duration::from_millis(10)))?, 0);
    /// let mr = pd.alloc_mr(64, blueflame::Access::LOCAL_WRITE | blueflame::Access::REMOTE_WRITE)?;
    /// qp.post(&Request::Write { remote: mr.remote(0)?, data: Payload::Inline(b"hello") },
    ///         7, PostFlags::SIGNALED)?;
    /// // The NIC's thread writes the completion; its event wakes the wait.
    /// let n = cq.wait(&mut out, Some(Duration::from_secs(10)))?;
    /// assert_eq!((n, out[0].cookie), (1, 7));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// [`Error::NoChannel`] for a CQ created without a channel; [`Error::InvalidParameter`]
    /// for an empty `out`; the errors of [`Cq::arm`] and [`CompletionChannel::wait`].
    pub fn wait(&mut self, out: &mut [Completion], timeout: Option<Duration>) -> Result<usize> {
        let Some(link) = &self.handle.link else {
            return Err(Error::NoChannel { cqn: self.cqn });
        };
        if out.is_empty() {
            return Err(Error::InvalidParameter {
                what: "completion slots (none to fill)",
                value: 0,
            });
        }
        let (inner, id) = (link.chan.inner.clone(), link.id);
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        // Before the arm: from here on this CQ's events are this wait's.
        let _waiter = inner.waiter(id);
        loop {
            self.dev.process();
            let n = self.poll(out);
            if n > 0 {
                return Ok(n);
            }
            self.arm(Notify::Any)?;
            self.dev.process();
            let n = self.poll(out);
            if n > 0 {
                return Ok(n);
            }
            if inner.wait_for(Some(id), deadline)?.is_none() {
                return Ok(0);
            }
        }
    }
}
