//! Completion queues.

use super::device::Backend;
use super::events::Subject;
use super::Device;
use crate::direct::{CompletionQueue, Registry};
use crate::error::{Error, Result};

/// The most entries a software-NIC CQ has (a ConnectX's `log_max_cq_sz` of 22).
#[cfg(feature = "sim")]
const SIM_MAX_CQE: u32 = 1 << 22;
use crate::verbs;
use crate::verbs::path::VerbsCompletionQueue;
use crate::Completion;
use std::sync::Arc;

pub(crate) enum CqKind {
    #[cfg(feature = "sim")]
    Sim {
        dev: Device,
        cqn: u32,
    },
    Verbs(Arc<verbs::objects::Cq>),
}

/// Keeps a CQ alive; the last owner (the poller or a QP) destroys it.
pub(crate) struct CqHandle {
    pub(crate) kind: CqKind,
    pub(crate) registry: Arc<Registry>,
}

impl CqHandle {
    /// What the device's events call this CQ.
    pub(crate) fn subject(&self) -> Subject {
        match &self.kind {
            #[cfg(feature = "sim")]
            CqKind::Sim { cqn, .. } => Subject::Cq(*cqn),
            CqKind::Verbs(c) => Subject::VerbsCq(c.cq as usize),
        }
    }
}

impl Drop for CqHandle {
    fn drop(&mut self) {
        #[cfg(feature = "sim")]
        if let CqKind::Sim { dev, cqn } = &self.kind {
            // Its number may come back with another CQ.
            dev.events.forget(Subject::Cq(*cqn));
            if let Some(n) = dev.sim_nic() {
                let _ = n.destroy_cq(*cqn);
            }
        }
    }
}

enum Poller {
    Direct(CompletionQueue),
    Verbs(VerbsCompletionQueue),
}

/// A completion queue and its poller.
pub struct Cq {
    // Field order: the poller goes before the handle that frees its ring.
    poller: Poller,
    pub(crate) handle: Arc<CqHandle>,
    cqn: u32,
    capacity: u32,
    pub(crate) dev: Device,
}

impl core::fmt::Debug for Cq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cq")
            .field("cqn", &self.cqn)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Cq {
    pub(crate) fn new(dev: &Device, entries: u32, cqe_size: u32) -> Result<Cq> {
        let max = match &dev.backend {
            #[cfg(feature = "sim")]
            Backend::Sim(_) => SIM_MAX_CQE,
            // `ibv_create_cq` takes an int.
            Backend::Verbs(_) => i32::MAX as u32,
        };
        if entries == 0 || entries > max {
            // rdma-core refuses 0 (EINVAL); more than the device has is refused too.
            return Err(Error::CqSize { entries, max });
        }
        match &dev.backend {
            Backend::Verbs(_) if cqe_size != 64 => Err(crate::Error::Unsupported(
                "128-byte CQEs on a verbs device: set MLX5_CQE_SIZE=128 for rdma-core",
            )),
            #[cfg(feature = "sim")]
            Backend::Sim(nic) => {
                let raw = nic.create_cq(entries.max(2).next_power_of_two(), cqe_size)?;
                let kind = CqKind::Sim {
                    dev: dev.clone(),
                    cqn: raw.cqn,
                };
                // SAFETY: the ring and record belong to the CQ just created, kept alive by the
                // handle built from `kind`.
                unsafe { Cq::new_direct(dev, &raw, kind, raw.cqe_cnt) }
            }
            Backend::Verbs(v) if v.path == crate::DataPath::Direct => {
                // mlx5: poll the CQ's ring directly.
                let cq = Arc::new(verbs::objects::Cq::new(v.ctx.clone(), entries)?);
                // SAFETY: a live CQ of an mlx5 device (the path is Direct only on mlx5).
                let raw = crate::dv::raw_cq(&unsafe { crate::dv::init_cq(cq.cq.cast())? })?;
                // rdma-core promises `ncqe - 1` entries of a ring of `ncqe` (`mlx5_create_cq`):
                // the CQ accounting shares out what it promises.
                let promised = cq.capacity();
                // SAFETY: the ring belongs to `cq`, kept alive by the handle; rdma-core is
                // never asked to poll it.
                unsafe { Cq::new_direct(dev, &raw, CqKind::Verbs(cq), promised) }
            }
            Backend::Verbs(v) => {
                let cq = Arc::new(verbs::objects::Cq::new(v.ctx.clone(), entries)?);
                let capacity = cq.capacity();
                let poller = VerbsCompletionQueue::new(cq.clone());
                let handle = Arc::new(CqHandle {
                    kind: CqKind::Verbs(cq),
                    registry: poller.registry.clone(),
                });
                Ok(Cq {
                    poller: Poller::Verbs(poller),
                    handle,
                    cqn: 0,
                    capacity,
                    dev: dev.clone(),
                })
            }
        }
    }

    /// A direct-path poller over `raw`, whose memory `kind` keeps alive.
    ///
    /// # Safety
    /// `raw` must describe the live ring of the CQ that `kind` owns, polled by nobody else.
    /// `promised`: the entries the device guarantees, shared out among the queues.
    unsafe fn new_direct(
        dev: &Device,
        raw: &mlx5::RawCq,
        kind: CqKind,
        promised: u32,
    ) -> Result<Cq> {
        // SAFETY: the caller's contract; the handle (which owns `kind`) outlives the poller
        // (field order of Cq).
        let mut poller = unsafe { CompletionQueue::new(raw)? };
        poller.guarantee(promised);
        let handle = Arc::new(CqHandle {
            kind,
            registry: poller.registry.clone(),
        });
        Ok(Cq {
            poller: Poller::Direct(poller),
            handle,
            cqn: raw.cqn,
            capacity: raw.cqe_cnt,
            dev: dev.clone(),
        })
    }

    /// The CQ number (0 on the verbs path, where rdma-core does not expose it).
    pub fn cqn(&self) -> u32 {
        self.cqn
    }

    /// Entries in the ring.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Entries no queue holds now. Each QP's send queue and receive queue hold entries of
    /// the CQ they complete on, one per outstanding request or posted receive (one per
    /// 64-byte block of a direct-path send), taken as they post and given back as they come
    /// back for more; a post that could overrun the CQ is refused with
    /// [`Error::CqFull`](crate::Error::CqFull).
    pub fn unreserved(&self) -> u32 {
        self.handle.registry.slots.free()
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
            Poller::Verbs(p) => p.poll(out),
        }
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

    /// The direct-path poller, when this CQ runs the direct path.
    pub fn direct(&mut self) -> Option<&mut CompletionQueue> {
        match &mut self.poller {
            Poller::Direct(p) => Some(p),
            Poller::Verbs(_) => None,
        }
    }
}
