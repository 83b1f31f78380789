//! rdma-core as a backend: a device opened through libibverbs, its objects made with verbs
//! calls, and on mlx5 the rings of its CQs, QPs and SRQs taken over with `mlx5dv_init_obj`
//! for the direct path (every other device runs the verbs path).

mod cq;
mod dc;
mod qp;
mod srq;

pub(crate) use cq::create_cq;
#[cfg(test)]
pub(crate) use qp::check_source_gid;
pub(crate) use qp::{create_qp, Qp};
pub(crate) use srq::create_srq;

use crate::async_event::{AsyncEvent, Subject};
use crate::data_path::DataPath;
use crate::error::{Capability, Error, Result};
use crate::verbs;
use crate::verbs::device::RawAsync;
use mlx5::request::{Access, MwType, Sge};
use rdma_sys as ffi;
use std::sync::Arc;

/// An open rdma-core device and the port and GID it uses.
#[derive(Debug)]
pub(crate) struct RdmaDev {
    pub(crate) ctx: Arc<verbs::device::Context>,
    pub(crate) port: u8,
    pub(crate) gid_index: Option<i32>,
    /// Direct on mlx5 (unless `BLUEFLAME_PATH=verbs`), verbs elsewhere.
    pub(crate) path: DataPath,
    /// rdma-core's switches as they were when the device was opened: libmlx5 reads
    /// `MLX5_SHUT_UP_BF` and `MLX5_POST_SEND_PREFER_BF` once, when it opens the context
    /// (`mlx5_set_context`), and rules every QP's register and copies by them.
    pub(crate) opened_env: crate::mlx5_env::Mlx5Env,
    /// `ibv_query_device`, read once at open.
    pub(crate) attrs: verbs::device::DeviceAttrs,
    /// What the device's atomics do, from `attrs`.
    pub(crate) atomics: mlx5::AtomicCaps,
    /// What an mlx5 device on the direct path reports of CQE compression
    /// (`mlx5dv_query_device`, read once at open); None elsewhere.
    pub(crate) cqe_comp: Option<mlx5::CqeCompCaps>,
    /// The device is an mlx5: rdma-core's provider may copy small received messages into
    /// receive buffers with the CPU (scatter-to-CQE) on the verbs path.
    pub(crate) mlx5: bool,
    /// The device stamps completions in real time (`MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS`,
    /// read at open; mlx5 only).
    pub(crate) real_time_ts: bool,
    /// The port's largest message (`max_msg_sz`, read at open; at most 2^31, and 2^31 when
    /// the port says nothing).
    pub(crate) max_msg: u32,
}

/// A multicast group joined through the connection manager: the UDP-port-space id whose
/// membership it is (the id leaves the group when destroyed, `rdma_destroy_id`).
pub(crate) struct Membership {
    _id: verbs::cm::CmId,
}

impl core::fmt::Debug for Membership {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Membership").finish_non_exhaustive()
    }
}

impl RdmaDev {
    /// `rdma_join_multicast` of `group` from `local`, on this device's port: the id is
    /// bound to `local` and must land on this device and port (else the group's packets
    /// would reach another one).
    ///
    /// # Errors
    /// [`Error::Verbs`] from librdmacm (no RDMA device on `local`, the join refused or not
    /// answered within 10 s); [`Error::InvalidParameter`] when `local` is on another device
    /// or port, or the group's family is not `local`'s.
    pub(crate) fn join_multicast(
        &self,
        local: std::net::IpAddr,
        group: std::net::IpAddr,
    ) -> Result<(Membership, crate::address::AhAttr, u32)> {
        super::check_group(local, group)?;
        let id = verbs::cm::CmId::new_udp()?;
        let (ah, qkey) = id.join_multicast(
            &std::net::SocketAddr::new(local, 0),
            &std::net::SocketAddr::new(group, 0),
            std::time::Duration::from_secs(10),
        )?;
        if id.device_name().as_deref() != Some(self.ctx.name()) || id.port() != self.port {
            return Err(Error::InvalidParameter {
                what: "local address of the multicast join: on another RDMA device or port \
                       (port number given)",
                value: id.port() as u64,
            });
        }
        // The port as this device numbers it (the event's is the id's, checked above).
        let attr = crate::address::AhAttr {
            port: self.port,
            ..ah
        };
        Ok((Membership { _id: id }, attr, qkey))
    }

    /// Opens `name` on port 1, with the first RoCE v2 IPv4 GID on Ethernet ports unless
    /// `gid_index` says which: its data path (mlx5 runs the direct path unless
    /// `BLUEFLAME_PATH` or rdma-core's `MLX5_QP_SIGNATURE` say otherwise) and its attributes,
    /// read once.
    ///
    /// # Errors
    /// [`Error::NoDevice`] (with the devices rdma-core sees) when none is called `name`;
    /// [`Error::Verbs`] when the device cannot be opened or queried;
    /// [`Error::InvalidParameter`] for a `gid_index` outside the port's GID table;
    /// [`Error::Unsupported`] for `BLUEFLAME_PATH=direct` on a device that is not mlx5, or
    /// with `MLX5_QP_SIGNATURE` set; [`Error::Environment`] for another `BLUEFLAME_PATH`.
    pub(crate) fn open(name: &str, port: u8, gid_index: Option<i32>) -> Result<RdmaDev> {
        if port == 0 {
            // Verbs numbers ports from 1.
            return Err(crate::error::Error::InvalidParameter {
                what: "port number (ports count from 1)",
                value: 0,
            });
        }
        // The devices are listed again only when the open failed: a name rdma-core does not
        // know (or no RDMA stack at all) is `NoDevice`, naming the ones it does.
        let ctx = verbs::device::Context::open(name).map_err(|e| {
            let present = verbs::device::list();
            match present.iter().any(|d| d == name) {
                true => Error::from(e),
                false => Error::NoDevice {
                    name: name.into(),
                    present: present.into(),
                },
            }
        })?;
        let ctx = Arc::new(ctx);
        let info = ctx.port(port)?;
        let gid_index = match gid_index {
            // An index past the port's table would fail only at the first endpoint
            // (`ibv_query_gid`'s ENOENT, naming neither the index nor where it came from).
            Some(i) if i < 0 || (info.gid_tbl_len > 0 && i >= info.gid_tbl_len) => {
                return Err(Error::InvalidParameter {
                    what: "GID index (Device::open's gid_index or BLUEFLAME_GID_INDEX) past \
                           the port's GID table (ibv_query_port's gid_tbl_len)",
                    value: i as u64,
                })
            }
            Some(i) => Some(i),
            None if info.ethernet => ctx.roce_v2_gid_index(port).or(Some(0)),
            None => None,
        };
        RdmaDev::new(ctx, port, gid_index)
    }

    /// The device of an open context `ctx` (rdma_cm's, for one), on `port` with
    /// `gid_index`.
    ///
    /// # Errors
    /// As [`RdmaDev::open`].
    pub(crate) fn new(
        ctx: Arc<verbs::device::Context>,
        port: u8,
        gid_index: Option<i32>,
    ) -> Result<RdmaDev> {
        // SAFETY: the context is live; its `device` field is the ibv_device it was opened on.
        let mlx5 = unsafe { crate::dv::is_mlx5((*ctx.ctx).device.cast()) };
        let var = std::env::var("BLUEFLAME_PATH").ok();
        let path = crate::dv::choose(mlx5, var.as_deref())?;
        // rdma-core's switches that rule the direct path out (WQE signatures).
        let opened_env = crate::mlx5_env::Mlx5Env::current();
        let path = if mlx5 {
            opened_env.path(path, var.as_deref() == Some("direct"))?
        } else {
            path
        };
        let mut attrs = ctx.attrs()?;
        if mlx5 {
            // SAFETY: a live context of an mlx5 device.
            attrs.odp.dc = unsafe { crate::dv::dc_odp_caps(ctx.ctx.cast()) }.unwrap_or(0);
        }
        let cqe_comp = if path == DataPath::Direct {
            // SAFETY: a live context of an mlx5 device (the direct path runs only there).
            unsafe { crate::dv::cqe_comp_caps(ctx.ctx.cast()) }
        } else {
            None
        };
        // SAFETY: a live context of an mlx5 device (when `mlx5`).
        let real_time_ts = mlx5 && unsafe { crate::dv::real_time_stamps(ctx.ctx.cast()) };
        let most = mlx5::wqe::MAX_MESSAGE_BYTES as u32;
        let max_msg = match ctx.port(port).map(|p| p.max_msg_sz) {
            Ok(0) | Err(_) => most,
            Ok(m) => m.min(most),
        };
        Ok(RdmaDev {
            max_msg,
            real_time_ts,
            mlx5,
            cqe_comp,
            atomics: attrs.atomic_caps(mlx5),
            attrs,
            ctx,
            port,
            gid_index,
            path,
            opened_env,
        })
    }

    /// `rdma-core device rxe0 (port 1, GID index Some(1))`.
    pub(super) fn describe(&self) -> String {
        format!(
            "rdma-core device {} (port {}, GID index {:?})",
            self.ctx.name(),
            self.port,
            self.gid_index
        )
    }

    /// Reads the pending asynchronous events of the device (its descriptor is non-blocking).
    pub(super) fn read_events(&self, out: &mut Vec<(Subject, AsyncEvent)>) {
        while let Some(e) = self.ctx.next_async_event() {
            out.push(match e {
                RawAsync::CqError(cq, cqn) => (Subject::VerbsCq(cq), AsyncEvent::CqError { cqn }),
                RawAsync::QpFatal(qpn) => (Subject::Qp(qpn), AsyncEvent::QpFatal { qpn }),
                RawAsync::QpAccessError(qpn) => {
                    (Subject::Qp(qpn), AsyncEvent::QpAccessError { qpn })
                }
                RawAsync::PortError(port) => (Subject::Port(port), AsyncEvent::PortError { port }),
                RawAsync::PortActive(port) => {
                    (Subject::Port(port), AsyncEvent::PortActive { port })
                }
                RawAsync::DeviceFatal => (Subject::All, AsyncEvent::DeviceFatal),
                RawAsync::SrqLimitReached(srq, srqn) => (
                    Subject::Srq(srq as u64),
                    AsyncEvent::SrqLimitReached { srqn },
                ),
                RawAsync::SrqError(srq, srqn) => {
                    (Subject::SrqError(srq as u64), AsyncEvent::SrqError { srqn })
                }
                RawAsync::QpLastWqeReached(qpn) => {
                    (Subject::LastWqe(qpn), AsyncEvent::QpLastWqeReached { qpn })
                }
                _ => continue,
            });
        }
    }
}

/// A protection domain of an rdma-core device, with the device.
pub(crate) struct Pd {
    pub(crate) dev: Arc<RdmaDev>,
    pub(crate) pd: Arc<verbs::objects::Pd>,
}

/// An rdma-core registration.
pub(crate) type Mr = verbs::objects::Mr;

fn made(mr: Mr) -> (Mr, crate::backend::spec::MrInfo) {
    let i = mr.info();
    (mr, i)
}

/// An rdma-core memory window (freed by [`Mw::dealloc`], not on drop: see
/// [`super::Mw`]).
pub(crate) struct Mw(pub(crate) *mut ffi::ibv_mw);

// SAFETY: the window's pointer is used by its single owner (the `MemoryWindow`, through
// `&mut` for binds, or the parked deallocation that took it); rdma-core windows may be
// used and freed from any thread.
unsafe impl Send for Mw {}

impl Mw {
    /// `ibv_dealloc_mw`: false when rdma-core refuses (the window stays; try again later).
    pub(super) fn dealloc(&mut self) -> bool {
        if self.0.is_null() {
            return true;
        }
        // SAFETY: allocated by `alloc_mw`, freed here only, and only once (null after).
        if unsafe { ffi::ibv_dealloc_mw(self.0) } != 0 {
            return false;
        }
        self.0 = core::ptr::null_mut();
        true
    }
}

/// Whether a verbs call failed because the device cannot do it at all: `EOPNOTSUPP` (the
/// provider has no such call), `ENOTTY` (the kernel has no ioctl framework: rdma-core's
/// `ibv_cmd_reg_dmabuf_mr` and `ibv_cmd_advise_mr` have no write fallback),
/// `EPROTONOSUPPORT` (the kernel lacks the method).
fn absent(e: &verbs::VerbsError) -> bool {
    matches!(
        e.source.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EPROTONOSUPPORT)
    )
}

impl Pd {
    pub(super) fn new(dev: &Arc<RdmaDev>) -> Result<Pd> {
        Ok(Pd {
            dev: dev.clone(),
            pd: Arc::new(verbs::objects::Pd::new(dev.ctx.clone())?),
        })
    }

    pub(super) fn alloc_mr(
        &self,
        len: usize,
        access: Access,
    ) -> Result<(Mr, crate::backend::spec::MrInfo)> {
        Ok(made(Mr::alloc(self.pd.clone(), len, access)?))
    }

    /// # Safety
    /// As [`super::Pd::register`].
    pub(super) unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(Mr, crate::backend::spec::MrInfo)> {
        // SAFETY: the caller's contract.
        Ok(made(unsafe {
            Mr::register(self.pd.clone(), ptr, len, access)
        }?))
    }

    /// # Safety
    /// As [`super::Pd::register_implicit`].
    pub(super) unsafe fn register_implicit(
        &self,
        access: Access,
    ) -> Result<(Mr, crate::backend::spec::MrInfo)> {
        // SAFETY: addr 0, length SIZE_MAX with ON_DEMAND is rdma-core's implicit on-demand
        // registration; the caller vouched for every address a request will name through it.
        Ok(made(unsafe {
            Mr::register(self.pd.clone(), core::ptr::null_mut(), usize::MAX, access)
        }?))
    }

    pub(super) fn register_dmabuf(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<(Mr, crate::backend::spec::MrInfo)> {
        match Mr::register_dmabuf(self.pd.clone(), offset, len, iova, fd, access) {
            // rdma-core sets `mr->addr` to the dma-buf offset (libibverbs `ibv_reg_dmabuf_mr`,
            // `ibv_cmd_reg_dmabuf_mr`); the device reaches the region at `iova`.
            Ok(mr) => {
                let (_, len, lkey, rkey) = mr.info();
                Ok((mr, (iova, len, lkey, rkey)))
            }
            Err(e) if absent(&e) => Err(Error::Capability(Capability::DmaBuf)),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn prefetch(&self, sgl: &[Sge], write: bool, flush: bool) -> Result<()> {
        match Mr::advise(&self.pd, write, flush, sgl) {
            Ok(()) => Ok(()),
            Err(e) if absent(&e) => Err(Error::Capability(Capability::Prefetch)),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn alloc_mw(&self, mw_type: MwType) -> Result<(Mw, u32)> {
        let t = match mw_type {
            MwType::One => ffi::ibv_mw_type::IBV_MW_TYPE_1,
            MwType::Two => ffi::ibv_mw_type::IBV_MW_TYPE_2,
        };
        // SAFETY: live PD; the window is freed by `Mw::dealloc`.
        let mw = unsafe { ffi::ibv_alloc_mw(self.pd.pd, t) };
        let mw = match mw {
            Some(p) if !p.is_null() => p,
            _ => return Err(crate::verbs::last("ibv_alloc_mw").into()),
        };
        // SAFETY: just allocated.
        Ok((Mw(mw), unsafe { (*mw).rkey }))
    }
}

impl Pd {
    /// `ibv_create_ah` with `attr` (a global route's `sgid_index` 0 stands for the device's
    /// GID index in use); on mlx5's direct path the provider's own address vector too
    /// (`mlx5dv_init_obj(MLX5DV_OBJ_AH)`, the `mah->av` that rdma-core's `set_datagram_seg`
    /// / `mlx5_send_wr_set_ud_addr` and UCX's `uct_ib_mlx5_get_av` copy into every UD WQE),
    /// copied once here.
    pub(super) fn create_ah(
        &self,
        attr: &crate::address::AhAttr,
    ) -> Result<(mlx5::av::Av, Option<Arc<verbs::ud::Ah>>)> {
        // The port's link layer, as `mlx5_create_ah` reads it (`ibv_query_port`): an
        // address without a LID on InfiniBand, or without a GID where global, is refused
        // before rdma-core makes a handle of it.
        attr.check_destination(self.dev.ctx.port(attr.port)?.ethernet)?;
        let grh = attr.grh.map(|g| crate::address::GlobalRoute {
            sgid_index: match (g.sgid_index, self.dev.gid_index) {
                (0, Some(i)) => i as u8,
                (i, _) => i,
            },
            ..g
        });
        let ah = verbs::ud::Ah::new(self.pd.clone(), &crate::address::AhAttr { grh, ..*attr })?;
        let av = if self.dev.path == DataPath::Direct {
            // SAFETY: `ah.ah` is a live AH of this mlx5 device (the direct path runs only on
            // mlx5), kept alive by `ah` during the calls; `av_of` reads the 48 bytes
            // `init_ah` points to, inside that AH.
            unsafe {
                let dv = crate::dv::init_ah(ah.ah.cast())?;
                crate::dv::av_of(&dv)?
            }
        } else {
            mlx5::av::Av::default()
        };
        Ok((av, Some(Arc::new(ah))))
    }
}

#[cfg(test)]
mod tests {
    /// Ports count from 1: port 0 is refused, typed, before any device is opened.
    #[test]
    fn port_zero_is_refused_before_the_device_is_opened() {
        match super::RdmaDev::open("no-such-device", 0, None) {
            Err(crate::Error::InvalidParameter { value: 0, .. }) => {}
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
