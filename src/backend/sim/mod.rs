//! The software mlx5 NIC as a backend: its objects, made and freed through its own calls
//! (`mlx5::sim::Nic`), and its rings handed to the direct path as a ConnectX's would be.

mod qp;

pub(crate) use qp::{create_qp, Qp};

use crate::async_event::{AsyncEvent, Subject};
use crate::error::{Error, Result};
use mlx5::request::{Access, MwType, Sge};
use mlx5::sim::{Nic, SimError};
use std::sync::Arc;

/// A short description: `software mlx5 NIC (thread mode, ...)`.
pub(super) fn describe(n: &Nic) -> String {
    let mode = if n.is_threaded() {
        "thread mode"
    } else {
        "stepped"
    };
    let order = match n.order() {
        mlx5::sim::OrderMode::Strict => "in order".to_string(),
        mlx5::sim::OrderMode::Relaxed { seed } => {
            format!("reordering seed {seed}: BLUEFLAME_SIM_ORDER={seed}")
        }
    };
    format!("software mlx5 NIC ({mode}, {order})")
}

/// The NIC's `MemoryCaps` in the bits of `ibv_query_device_ex`'s `odp_caps`.
pub(super) fn odp_caps(n: &Nic) -> crate::verbs::device::OdpCaps {
    use crate::verbs::device::OdpCaps;
    let caps = n.memory_caps();
    if caps.odp {
        OdpCaps {
            general: OdpCaps::SUPPORT,
            rc: OdpCaps::RC_BASIC
                | OdpCaps::RC_ATOMIC
                | if caps.srq_odp { OdpCaps::SRQ_RECV } else { 0 },
            // As a ConnectX (`mlx5_ib_internal_fill_odp_caps`): UD sends only.
            ud: OdpCaps::SEND,
            dc: if caps.dc_odp {
                OdpCaps::RC_BASIC | OdpCaps::RC_ATOMIC | OdpCaps::SRQ_RECV
            } else {
                0
            },
        }
    } else {
        OdpCaps::default()
    }
}

/// Reads the NIC's pending asynchronous events.
pub(super) fn read_events(n: &Nic, out: &mut Vec<(Subject, AsyncEvent)>) {
    while let Some(e) = n.take_async_event() {
        let e = AsyncEvent::from(e);
        let subject = match e {
            AsyncEvent::CqError { cqn } => Subject::Cq(cqn),
            AsyncEvent::QpFatal { qpn } | AsyncEvent::QpAccessError { qpn } => Subject::Qp(qpn),
            AsyncEvent::SrqLimitReached { srqn } => Subject::Srq(srqn as u64),
            AsyncEvent::QpLastWqeReached { qpn } => Subject::LastWqe(qpn),
            AsyncEvent::SrqError { srqn } => Subject::SrqError(srqn as u64),
            AsyncEvent::PortError { port } | AsyncEvent::PortActive { port } => Subject::Port(port),
            _ => Subject::All,
        };
        out.push((subject, e));
    }
}

/// The port's membership in a multicast group, in the NIC's subnet manager (left on drop).
#[derive(Debug)]
pub(crate) struct Membership {
    nic: Nic,
    mgid: [u8; 16],
}

impl Drop for Membership {
    fn drop(&mut self) {
        let _ = self.nic.sm_leave(self.mgid);
    }
}

/// A join of IP multicast group `group` as the connection manager makes it on an
/// InfiniBand port (`rdma_join_multicast`): the group's MGID (`cma_set_mgid`), joined in the
/// NIC's subnet manager, which hands out its multicast LID; the Q_Key is
/// [`crate::RDMA_UDP_QKEY`]. The software NIC has no IP addresses: any `local` of the
/// group's family is its port.
pub(super) fn join_multicast(
    n: &Nic,
    local: std::net::IpAddr,
    group: std::net::IpAddr,
) -> Result<(Membership, crate::address::AhAttr, u32)> {
    super::check_group(local, group)?;
    let mgid = crate::address::rdma_cm_mgid(group);
    let mlid = n.sm_join(mgid)?;
    let ah = crate::address::AhAttr {
        port: 1,
        ..crate::address::AhAttr::multicast(mgid, mlid)
    };
    Ok((
        Membership {
            nic: n.clone(),
            mgid,
        },
        ah,
        crate::RDMA_UDP_QKEY,
    ))
}

/// A protection domain of the NIC, deallocated when the domain and every registration and
/// window made in it are gone (a region whose receives outlive the domain stays registered
/// in it until its poller lets them go: `lifetime`'s `HELD`), as the rdma backend's
/// registrations keep their `ibv_pd` (the kernel refuses `dealloc_pd` while a region uses
/// it, which the NIC's `dealloc_pd` does too: the number would be lost for good).
pub(crate) struct Pd {
    pub(crate) nic: Nic,
    pub(crate) pd: u32,
    number: Arc<PdNumber>,
}

/// The NIC's domain number, freed when the last holder drops.
struct PdNumber {
    nic: Nic,
    pd: u32,
}

impl Drop for PdNumber {
    fn drop(&mut self) {
        let _ = self.nic.dealloc_pd(self.pd);
    }
}

/// A registration (the NIC owns allocated memory and frees it when deregistered).
/// Field order: deregistered (by its owner) before its domain's number goes.
pub(crate) struct Reg {
    nic: Nic,
    lkey: u32,
    _pd: Arc<PdNumber>,
}

impl Reg {
    /// Deregisters. The NIC never refuses: as a ConnectX, it deregisters a region under a
    /// bound window too (the crate waits for its windows itself: their pins), and an
    /// unknown key means it is gone already.
    pub(super) fn deregister(&mut self) -> bool {
        let _ = self.nic.dereg_mr(self.lkey);
        true
    }
}

/// A window of the NIC, found by its key's index (any key the window had will do).
pub(crate) struct Mw {
    nic: Nic,
    rkey: u32,
    _pd: Arc<PdNumber>,
}

impl Mw {
    /// Frees the window (an unknown window is freed already).
    pub(super) fn dealloc(&mut self) -> bool {
        let _ = self.nic.dealloc_mw(self.rkey);
        true
    }
}

impl Pd {
    pub(super) fn new(nic: &Nic) -> Pd {
        let pd = nic.alloc_pd();
        Pd {
            pd,
            nic: nic.clone(),
            number: Arc::new(PdNumber {
                nic: nic.clone(),
                pd,
            }),
        }
    }

    /// The registration `i` of this domain.
    fn made(&self, i: mlx5::sim::MrInfo) -> (Reg, crate::backend::spec::MrInfo) {
        (
            Reg {
                nic: self.nic.clone(),
                lkey: i.lkey,
                _pd: self.number.clone(),
            },
            (i.addr, i.len, i.lkey, i.rkey),
        )
    }

    pub(super) fn alloc_mr(
        &self,
        len: usize,
        access: Access,
    ) -> Result<(Reg, crate::backend::spec::MrInfo)> {
        Ok(self.made(self.nic.alloc_mr(self.pd, len, access)?))
    }

    /// # Safety
    /// As [`super::Pd::register`].
    pub(super) unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(Reg, crate::backend::spec::MrInfo)> {
        // SAFETY: the caller's contract.
        let i = unsafe { self.nic.reg_mr(self.pd, ptr, len, access) }?;
        Ok(self.made(i))
    }

    /// Checks a prefetch as the kernel's `get_prefetchable_mr` (memory is resident here).
    pub(super) fn prefetch(&self, sgl: &[Sge], write: bool) -> Result<()> {
        self.nic
            .advise_mr(self.pd, write, sgl)
            .map_err(|e| match e {
                SimError::Prefetch(lkey) => Error::InvalidParameter {
                    what: "prefetch entry (lkey)",
                    value: lkey as u64,
                },
                e => e.into(),
            })
    }

    /// Registers a dma-buf of an exporter beside the NIC ([`crate::SimDmaBuf`]), found by
    /// the identity of the file `fd` is open on.
    pub(super) fn register_dmabuf(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<(Reg, crate::backend::spec::MrInfo)> {
        use std::os::fd::AsRawFd;
        let handle = crate::verbs::fd::identity(fd).map_err(|_| Error::InvalidParameter {
            what: "dma-buf file descriptor (not open)",
            value: fd.as_raw_fd() as u64,
        })?;
        match self
            .nic
            .reg_dmabuf_mr(self.pd, handle, offset, len as u64, iova, access)
        {
            Ok(i) => Ok(self.made(i)),
            Err(SimError::NoCapability(_)) => {
                Err(Error::Capability(crate::error::Capability::DmaBuf))
            }
            Err(SimError::DmaBuf { .. }) => Err(Error::InvalidParameter {
                what: "dma-buf (fd not exported beside this NIC, or range outside it)",
                value: fd.as_raw_fd() as u64,
            }),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn alloc_mw(&self, mw_type: MwType) -> Result<(Mw, u32)> {
        let rkey = self.nic.alloc_mw(self.pd, mw_type)?;
        Ok((
            Mw {
                nic: self.nic.clone(),
                rkey,
                _pd: self.number.clone(),
            },
            rkey,
        ))
    }
}

/// The most receives a software-NIC SRQ holds (`max_srq_wr`).
const MAX_SRQ_WR: u32 = (1 << 15) - 1;

/// The most entries a software-NIC CQ may be asked for: a ConnectX's `max_cqe`,
/// `(1 << log_max_cq_sz) - 1` with `log_max_cq_sz` 22 (`mlx5_ib_query_device`): rdma-core's
/// `mlx5_create_cq` asks the kernel for `cqe + 1` rounded up to a power of two, which must
/// not pass `1 << 22`.
pub(super) const MAX_CQE: u32 = (1 << 22) - 1;

/// A CQ of the NIC (destroyed on drop, its event sink removed first).
pub(crate) struct Cq {
    nic: Nic,
    pub(crate) cqn: u32,
}

impl Drop for Cq {
    fn drop(&mut self) {
        let _ = self.nic.set_cq_event_sink(self.cqn, None);
        let _ = self.nic.destroy_cq(self.cqn);
    }
}

/// The NIC's sink of a CQ's events: the channel's [`crate::backend::spec::EventSink`].
struct Sink {
    to: std::sync::Weak<dyn crate::backend::spec::EventSink>,
    id: u32,
    token: u64,
}

impl mlx5::sim::CqEventSink for Sink {
    fn cq_event(&self, _cqn: u32) {
        if let Some(s) = self.to.upgrade() {
            s.cq_event(self.id, self.token);
        }
    }
}

impl Cq {
    pub(super) fn link(
        &self,
        id: u32,
        token: u64,
        to: std::sync::Weak<dyn crate::backend::spec::EventSink>,
    ) {
        let sink = Sink { to, id, token };
        let _ = self
            .nic
            .set_cq_event_sink(self.cqn, Some(std::sync::Arc::new(sink)));
    }

    pub(super) fn unlink(&self) {
        let _ = self.nic.set_cq_event_sink(self.cqn, None);
    }
}

/// A CQ of the NIC: a ring of at least `entries` entries (a power of two).
pub(super) fn create_cq(
    n: &Nic,
    spec: &crate::backend::spec::CqSpec<'_>,
) -> Result<(Cq, crate::backend::spec::CqRings, u32)> {
    let cnt = spec.entries.max(2).next_power_of_two();
    let clock = n.hw_clock();
    if spec.timestamps && clock.khz == 0 {
        return Err(crate::Error::Timestamps {
            why: "the device has no completion clock (hca_core_clock 0)",
        });
    }
    let raw = match spec.zip {
        Some(f) => n.create_cq_compressed(cnt, spec.cqe_size, f)?,
        None => n.create_cq(cnt, spec.cqe_size)?,
    };
    let cq = Cq {
        nic: n.clone(),
        cqn: raw.cqn,
    };
    let rings = crate::backend::spec::CqRings::Direct {
        promised: raw.cqe_cnt,
        compressed: spec.zip.is_some(),
        stamps: spec
            .timestamps
            .then_some(crate::backend::spec::Stamps::Cqe(clock.format)),
        raw,
    };
    Ok((cq, rings, raw.cqn))
}

/// An SRQ of the NIC (destroyed on drop).
pub(crate) struct Srq {
    nic: Nic,
    pub(crate) srqn: u32,
}

impl Drop for Srq {
    fn drop(&mut self) {
        let _ = self.nic.destroy_srq(self.srqn);
    }
}

impl Srq {
    pub(super) fn set_limit(&self, limit: u32) -> Result<()> {
        Ok(self.nic.arm_srq_limit(self.srqn, limit)?)
    }
}

impl Pd {
    pub(super) fn create_srq(
        &self,
        entries: u32,
        max_sge: u32,
    ) -> Result<(Srq, crate::backend::spec::SrqRings, u32)> {
        // As rdma-core's `mlx5_alloc_srq_buf`: a ring of `2 * entries + 1` WQEs rounded up,
        // whose first `entries + 1` (rounded up) are the list and the rest the wait queue
        // of page-faulted WQEs; the list alone when the device's limit is smaller.
        let list = mlx5::srq::srq_entries(entries);
        let max_wr = match 2 * entries + 1 {
            wq if wq <= MAX_SRQ_WR => wq.next_power_of_two() - 1,
            _ => entries,
        };
        let mut raw = self
            .nic
            .create_srq(self.pd, mlx5::sim::SrqCaps { max_wr, max_sge })?;
        raw.tail = list - 1;
        let srq = Srq {
            nic: self.nic.clone(),
            srqn: raw.srqn,
        };
        Ok((srq, crate::backend::spec::SrqRings::Direct(raw), raw.srqn))
    }
}

/// The mlx5 AV of an InfiniBand address (`mlx5_create_ah`), after its checks.
pub(super) fn ib_av(attr: &crate::address::AhAttr) -> Result<mlx5::av::Av> {
    use mlx5::av::{Av, AvAttr, AvLink};
    if attr.port != 1 {
        return Err(Error::InvalidParameter {
            what: "port number of the address handle (the device has port 1)",
            value: attr.port as u64,
        });
    }
    Ok(Av::from_attr(&AvAttr {
        link: AvLink::Ib {
            dlid: attr.dlid,
            src_path_bits: attr.src_path_bits,
            grh: attr.grh,
        },
        sl: attr.sl,
        static_rate: mlx5::av::mlx5_rate(attr.static_rate),
    }))
}
