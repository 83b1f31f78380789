//! Devices and protection domains.

use super::{Cq, MemoryRegion};
use crate::backend::{self, Dev};
use crate::clock::NicTime;
use crate::data_path::DataPath;
use crate::error::{Capability, Error, Refused, Result};
use crate::verbs;
use mlx5::request::Access;
use std::sync::Arc;

/// An RDMA device: a real one through rdma-core, or the software mlx5 NIC.
///
/// Cloning is cheap (a reference count); every object made from a device keeps it open.
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{DataPath, Device, QueuePair};
/// // BLUEFLAME_DEVICE, else the first rdma-core device, else (feature `sim`) the software NIC.
/// let dev = Device::open_default()?;
/// println!("{dev}: {:?} path", dev.data_path());
/// // The software NIC, stepped by hand: nothing runs until `process` (a no-op elsewhere).
/// let sim = Device::sim_stepped();
/// assert_eq!(sim.data_path(), DataPath::Direct);
/// assert_eq!(sim.process(), 0);
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) backend: Dev,
    /// The asynchronous events read so far (shared by the device's clones).
    pub(crate) events: Arc<super::events::Events>,
}

/// A short description: `software mlx5 NIC` or `rdma-core device rxe0 (port 1, GID 1)`.
impl core::fmt::Display for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&self.backend.describe())
    }
}

impl Device {
    /// Opens the rdma-core device `name` (e.g. `mlx5_0`, `rxe0`) on port 1, with the first
    /// RoCE v2 IPv4 GID on Ethernet ports (override with `gid_index`). mlx5 devices run the
    /// direct path, others the verbs path; `BLUEFLAME_PATH=verbs|direct|auto` overrides.
    ///
    /// # Errors
    /// [`Error::NoDevice`] (with the devices rdma-core sees) when none is called `name`;
    /// [`Error::Verbs`] when the device cannot be opened or queried;
    /// [`Error::InvalidParameter`] for a `gid_index` outside the port's GID table
    /// (`ibv_query_port`'s `gid_tbl_len`);
    /// [`Error::Unsupported`] for `BLUEFLAME_PATH=direct` on a device that is not mlx5, or on
    /// an mlx5 device with `MLX5_QP_SIGNATURE` set;
    /// [`Error::Environment`] for a `BLUEFLAME_PATH` other than `direct`, `verbs`, `auto`.
    pub fn open(name: &str, gid_index: Option<i32>) -> Result<Device> {
        Device::open_port(name, 1, gid_index)
    }

    /// [`Device::open`] on port `port` of the device (perftest's `-i`; ports count from 1).
    ///
    /// # Errors
    /// As [`Device::open`]; [`Error::InvalidParameter`] for port 0; [`Error::Verbs`] from
    /// `ibv_query_port` for a port the device does not have.
    pub fn open_port(name: &str, port: u8, gid_index: Option<i32>) -> Result<Device> {
        Ok(Device {
            events: Arc::default(),
            backend: Dev::open(name, port, gid_index)?,
        })
    }

    /// The device named by `BLUEFLAME_DEVICE` (GID index from `BLUEFLAME_GID_INDEX`), else the
    /// first rdma-core device, else the software NIC in thread mode (feature `sim`).
    ///
    /// # Errors
    /// [`Error::Environment`] for a `BLUEFLAME_GID_INDEX` that is not a number;
    /// every error of [`Device::open`] ([`Error::NoDevice`] for a `BLUEFLAME_DEVICE` rdma-core
    /// does not know, [`Error::InvalidParameter`] for a GID index past the port's table,
    /// `BLUEFLAME_PATH`'s [`Error::Environment`] and [`Error::Unsupported`], [`Error::Verbs`]);
    /// without the `sim` feature,
    /// [`Error::Unsupported`] when there is no rdma-core device.
    pub fn open_default() -> Result<Device> {
        let gid = match std::env::var("BLUEFLAME_GID_INDEX") {
            Ok(v) if v.trim().is_empty() => None,
            Ok(v) => Some(v.trim().parse::<u16>().map_err(|_| Error::Environment {
                var: "BLUEFLAME_GID_INDEX",
                value: v.as_str().into(),
            })? as i32),
            Err(_) => None,
        };
        if let Ok(name) = std::env::var("BLUEFLAME_DEVICE") {
            return Device::open(&name, gid);
        }
        match verbs::device::list().first() {
            Some(name) => Device::open(name, gid),
            #[cfg(feature = "sim")]
            None => Ok(Device::sim()),
            #[cfg(not(feature = "sim"))]
            None => Err(Error::Unsupported(
                "no rdma-core device (and no software NIC: blueflame built without `sim`)",
            )),
        }
    }

    /// Whether `other` is this same device instance (the same software NIC, or the same
    /// verbs context): only then can their CQs, QPs and keys work together.
    pub(crate) fn same(&self, other: &Device) -> bool {
        self.backend.same(&other.backend)
    }

    /// The data path QPs of this device run: direct on the software NIC and on mlx5
    /// devices, verbs on other rdma-core devices (see [`Device::open`] for the override).
    pub fn data_path(&self) -> DataPath {
        self.backend.data_path()
    }

    /// Whether rdma-core's provider may copy small received messages into receive buffers
    /// with the CPU, checking no key (mlx5's scatter-to-CQE on the verbs path): such
    /// receives must name CPU-writable registered memory.
    pub(crate) fn provider_copies_receives(&self) -> bool {
        self.backend.provider_copies_receives()
    }

    /// What this device's atomics can do and the byte order of their replies: read once
    /// (`ibv_query_device` at open; the software NIC's `NicView::atomic_caps` when a QP is
    /// created). [`QueuePair::atomic_result`](crate::QueuePair::atomic_result) reads a reply with it.
    pub fn atomic_caps(&self) -> mlx5::AtomicCaps {
        self.backend.atomic_caps()
    }

    /// The longest message a request may move on this device's port (`ibv_query_port`'s
    /// `max_msg_sz`, read at open; at most 2^31): a write, read or send whose entries sum to
    /// more is refused before posting ([`Error::InvalidParameter`](crate::Error::InvalidParameter)),
    /// where the device would fail it with a local length error and move the QP to error.
    /// A ConnectX-6 reports 2^30, rxe 2^23; the software NIC 2^30.
    pub fn max_message(&self) -> u32 {
        self.backend.max_message()
    }

    /// What on-demand paging this device does: `ibv_query_device_ex`'s `odp_caps`, read
    /// once at open (none when the device does not answer the extended query); on the
    /// software NIC its `mlx5::sim::MemoryCaps` in the same bits (explicit RC on-demand
    /// paging, every operation; no implicit).
    pub fn odp_caps(&self) -> verbs::device::OdpCaps {
        self.backend.odp_caps()
    }

    /// Runs the stepped software NIC until it has nothing left to do; returns the WQEs and
    /// receives it handled. A no-op for a threaded NIC or a real device.
    pub fn process(&self) -> usize {
        self.backend.process()
    }

    /// A protection domain.
    ///
    /// # Errors
    /// [`Error::Verbs`] from `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd {
            inner: Arc::new(PdInner {
                dev: self.clone(),
                pd: self.backend.alloc_pd()?,
                lifetimes: Default::default(),
                regions: Default::default(),
                window_keys: Default::default(),
            }),
        })
    }

    /// A completion queue of at least `entries` entries.
    ///
    /// # Errors
    /// [`Error::CqSize`] for 0 entries or more than the device has (refused before the
    /// device is asked); [`Error::Verbs`] (`Error::Sim` on the software NIC) when the
    /// device refuses the CQ; on the verbs path, [`Error::Environment`] for a
    /// `BLUEFLAME_VERBS_API` other than `auto`, `extended`, `legacy`, and
    /// [`Error::Unsupported`] for `extended` where the provider has no `ibv_create_cq_ex`.
    pub fn create_cq(&self, entries: u32) -> Result<Cq> {
        self.create_cq_with(&super::CqOptions::new(entries))
    }

    /// A completion queue as `opts` say (size, entry size, completion channel).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a CQE size other than 64 or 128; [`Error::Unsupported`]
    /// for 128 on a verbs device (there rdma-core's `MLX5_CQE_SIZE=128` chooses it, and the
    /// poller reads the size from the CQ); [`Error::InvalidHandle`] for a channel of
    /// another device; [`Error::ChannelTaken`] for a channel an `AsyncCq` holds (feature
    /// `tokio`); [`Error::CqSize`] for 0 entries or more than the device has;
    /// [`Error::Timestamps`] for timestamps with compression or on a device without a
    /// completion clock; [`Error::CqeCompression`] for a format the device lacks (and on
    /// the verbs path); [`Error::Verbs`] when rdma-core refuses the CQ; `BLUEFLAME_VERBS_API`'s
    /// errors as [`Device::create_cq`].
    pub fn create_cq_with(&self, opts: &super::CqOptions) -> Result<Cq> {
        if opts.cqe_size != 64 && opts.cqe_size != 128 {
            return Err(Error::InvalidParameter {
                what: "CQE size (64 or 128)",
                value: opts.cqe_size as u64,
            });
        }
        if let Some(ch) = &opts.channel {
            if !ch.is_of(self) {
                return Err(Error::InvalidHandle {
                    what: "completion channel of another device",
                    value: std::os::fd::AsRawFd::as_raw_fd(ch) as u64,
                });
            }
        }
        Cq::new(self, opts)
    }

    /// A completion channel: the events of the CQs created with it
    /// ([`CqOptions::channel`](super::CqOptions::channel)) arrive there once they are armed.
    ///
    /// # Errors
    /// [`Error::Io`] when no eventfd can be had; [`Error::Verbs`] from
    /// `ibv_create_comp_channel`.
    pub fn create_channel(&self) -> Result<super::CompletionChannel> {
        super::CompletionChannel::new(self)
    }

    /// The device's completion clock (`ibv_query_device_ex`'s `hca_core_clock` and
    /// `completion_timestamp_mask`, read when the device was opened; the software NIC's
    /// `mlx5::sim::HwClock`): absent (both 0) where completions carry no time.
    pub fn clock_caps(&self) -> verbs::device::ClockCaps {
        self.backend.clock_caps()
    }

    /// The NIC's clock now: its free-running counter and that counter in nanoseconds on the
    /// clock [`Cq::poll_timed`](super::Cq::poll_timed) reports in (see [`NicTime`]). Not a
    /// hot-path call: on rdma-core it reads the counter with `ibv_query_rt_values_ex`.
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
    /// let dev = blueflame::Device::sim();
    /// let a = dev.clock()?;
    /// let b = dev.clock()?;
    /// assert!(b.ns >= a.ns && b.cycles >= a.cycles);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// # Errors
    /// [`Error::Timestamps`] on a device that stamps no completion (rxe, siw), on an
    /// rdma-core device other than mlx5 (no clock-info page converts its counter), and on
    /// an mlx5 device that stamps in real time (its clock is the PTP hardware clock);
    /// [`Error::Verbs`] from `ibv_query_rt_values_ex`.
    pub fn clock(&self) -> Result<NicTime> {
        self.backend.clock()
    }

    /// What the device reports of CQE compression (`mlx5dv_query_device`'s
    /// `cqe_comp_caps`, read when the device was opened; the software NIC's own), for
    /// [`CqOptions::compression`](super::CqOptions::compression); None where compressed CQEs
    /// cannot be used (a device that is not mlx5, or the verbs path).
    pub fn cqe_compression_caps(&self) -> Option<mlx5::CqeCompCaps> {
        self.backend.cqe_compression_caps()
    }
}

pub(crate) struct PdInner {
    pub(crate) dev: Device,
    /// The backend's domain (freed after the parked regions: field order).
    pub(crate) pd: backend::Pd,
    /// Queues of this domain and regions waiting for their work to complete.
    pub(crate) lifetimes: crate::queue::lifetime::Lifetimes,
    /// The live regions of this domain (every `MemoryRegion` is listed from creation to
    /// drop): receive buffers are checked against them, because the direct-path poller
    /// writes data that arrived inside a CQE into them with the CPU.
    pub(crate) regions: Arc<crate::queue::regions::Regions>,
    /// The last key variant of each window index whose window was dropped and whose index
    /// the device has not given to a window of this domain again (`MemoryWindow`'s drop and
    /// `Pd::alloc_mw`): a new window with that index binds on from there.
    pub(crate) window_keys: std::sync::Mutex<std::collections::HashMap<u32, u8>>,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // No QP is left (each holds the domain): every parked region can go.
        self.lifetimes.clear();
    }
}

/// A protection domain: regions and QPs in one domain can work together.
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Device, Error, QpCaps, QueuePair};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let cq = dev.create_cq(64)?;
/// let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
/// assert!(mr.pd().device().to_string().starts_with("software mlx5 NIC"));
/// // Remote write without local write is refused, as verbs does.
/// assert!(matches!(pd.alloc_mr(64, Access::REMOTE_WRITE), Err(Error::RegionRights { .. })));
/// # drop(qp);
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl core::fmt::Debug for Pd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.inner.dev.to_string())
            .finish()
    }
}

impl Pd {
    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// Deregisters the dropped regions whose outstanding work has completed since (see the
    /// crate's ownership rules), and deallocates the memory windows dropped with a bind or
    /// unbind in flight once that work has completed; returns how many still wait.
    pub fn reclaim(&self) -> usize {
        self.inner.lifetimes.reclaim()
    }

    /// Allocates and registers `len` zeroed, page-aligned bytes with `access` rights.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for `len == 0` or a length no allocation can have;
    /// [`Error::RegionRights`] for rights verbs refuses (remote write or atomic without
    /// local write, unknown bits, `ZERO_BASED`, which is a window right here); an
    /// out-of-memory error ([`Error::Verbs`], or `Error::Sim` on the software NIC) when the
    /// bytes cannot be allocated; [`Error::Capability`] for [`Access::ON_DEMAND`] on a device
    /// without RC on-demand paging; the device's registration error.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        self.inner.lifetimes.reclaim();
        if len == 0 || std::alloc::Layout::from_size_align(len, 4096).is_err() {
            return Err(Error::InvalidParameter {
                what: "region length",
                value: len as u64,
            });
        }
        if let Some(why) = access.region_error() {
            return Err(Error::RegionRights { access, why });
        }
        self.check_odp(access)?;
        MemoryRegion::alloc(self.clone(), len, access)
    }

    /// The checks every registration of user memory makes before the device sees it.
    pub(crate) fn check_registration(
        &self,
        len: usize,
        access: Access,
        writable: bool,
    ) -> Result<()> {
        self.inner.lifetimes.reclaim();
        if len == 0 || len > isize::MAX as usize {
            return Err(Error::InvalidParameter {
                what: "buffer length",
                value: len as u64,
            });
        }
        if let Some(why) = access.region_error() {
            return Err(Error::RegionRights { access, why });
        }
        // The kernel pins with FOLL_WRITE for every right `ib_access_writable` names, MW_BIND
        // included (`ib_umem_get`): a read-only mapping is EFAULT from `ibv_reg_mr` then.
        if !writable && (access.0 & (Access::WRITES.0 | Access::MW_BIND.0)) != 0 {
            return Err(Error::ReadOnlyBuffer { access });
        }
        self.check_odp(access)
    }

    fn check_odp(&self, access: Access) -> Result<()> {
        if access.contains(Access::ON_DEMAND)
            && !self
                .device()
                .odp_caps()
                .rc(access.contains(Access::REMOTE_ATOMIC))
        {
            return Err(Error::Capability(Capability::OnDemandPaging));
        }
        Ok(())
    }

    /// Registers a buffer the caller owns, taking ownership of it: the region's bytes are
    /// the buffer's own (the device reads and writes them in place, no copy), and the
    /// buffer comes back through [`MemoryRegion::into_buffer`] only once no request can
    /// touch it any more; a dropped region drops its buffer at that point. Any
    /// [`RegionBuffer`](crate::resources::RegionBuffer): `Vec<u8>`, `Box<[u8]>`,
    /// `&'static [u8]` (read-only),
    /// [`HugePages`](crate::mapping::HugePages), [`MappedFile`](crate::mapping::MappedFile),
    /// [`RawBuffer`](super::RawBuffer). With [`Access::ON_DEMAND`] the registration is
    /// on-demand (not pinned).
    ///
    /// ```
    /// # #[cfg(feature = "sim")] fn main() {
    /// use blueflame::{Access, Completion, Device, PostFlags, PostSend, QpCaps, QueuePair};
    /// let dev = Device::sim_stepped();
    /// let pd = dev.alloc_pd().unwrap();
    /// let mut cq = dev.create_cq(16).unwrap();
    /// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    /// qp.connect(&qp.endpoint().unwrap()).unwrap();
    /// let src = pd.register(b"from a Vec".to_vec(), Access::NONE).unwrap();
    /// let dst = pd.register(vec![0u8; 64].into_boxed_slice(), Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    /// qp.write(&[src.sge(0, 10).unwrap()], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED).unwrap();
    /// dev.process();
    /// // The buffer comes back once the write's completion has been polled.
    /// assert_eq!(cq.poll(&mut [Completion::default(); 1]), 1);
    /// let back: Box<[u8]> = dst.into_buffer().unwrap().try_take().unwrap();
    /// assert_eq!(&back[..10], b"from a Vec");
    /// # }
    /// # #[cfg(not(feature = "sim"))] fn main() {}
    /// ```
    ///
    /// Borrowed memory (`&mut [u8]` for a scope) is not offered: a request holds plain keys,
    /// and neither a borrow nor a guard's drop can wait for the device (a guard may be
    /// leaked with `mem::forget`, and completions come only when the caller polls), so the
    /// borrow could end while the device still writes. Use [`RawBuffer`](super::RawBuffer)
    /// and its contract for memory owned elsewhere.
    ///
    /// # Errors
    /// Each gives the buffer back in [`Refused`]: [`Error::InvalidParameter`] for an empty
    /// buffer; [`Error::RegionRights`] as [`Pd::alloc_mr`]; [`Error::ReadOnlyBuffer`] for a
    /// read-only buffer with `LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_ATOMIC` or `MW_BIND`
    /// (the kernel pins it for writing then: `EFAULT`);
    /// [`Error::Capability`] for `ON_DEMAND` on a device without RC on-demand paging
    /// (with atomics when `REMOTE_ATOMIC`); the device's registration error.
    pub fn register<B: super::RegionBuffer>(
        &self,
        buf: B,
        access: Access,
    ) -> core::result::Result<MemoryRegion, Refused<B>> {
        MemoryRegion::register(self.clone(), buf, access)
    }

    /// Registers `len` bytes at `ptr` that the caller owns elsewhere: the `unsafe` form.
    /// [`MemoryRegion::into_buffer::<RawBuffer>`](MemoryRegion::into_buffer) says when the
    /// device is done with them.
    ///
    /// # Safety
    /// The contract of [`RawBuffer::new`](super::RawBuffer::new), from this call until the
    /// `RawBuffer` comes back (or, for a dropped region, until [`Pd::reclaim`] returns 0
    /// while the domain lives, or, once it is gone, until the CQs its receives completed on
    /// are dropped too).
    ///
    /// # Errors
    /// As [`Pd::register`]; a null `ptr` is [`Error::InvalidParameter`].
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        writable: bool,
        access: Access,
    ) -> Result<MemoryRegion> {
        let ptr = core::ptr::NonNull::new(ptr).ok_or(Error::InvalidParameter {
            what: "buffer address",
            value: 0,
        })?;
        // SAFETY: the caller's contract is RawBuffer::new's.
        let raw = unsafe { super::RawBuffer::new(ptr, len, writable) };
        Ok(self.register(raw, access)?)
    }

    /// Registers the whole address space on demand (implicit ODP: rdma-core's `ibv_reg_mr`
    /// with address 0, length `SIZE_MAX` and `IBV_ACCESS_ON_DEMAND`, added here). Requests
    /// name any address under its keys; the device faults pages in as it touches them. The
    /// region has no CPU view (`read`/`write` are [`Error::NoCpuMapping`]).
    ///
    /// # Safety
    /// Every address a local request or (with remote rights) a peer names through its keys
    /// must be memory the device may read (and write, with write rights) at that moment, as
    /// for [`RawBuffer::new`](super::RawBuffer::new): this key reaches the whole process.
    /// Keep remote rights off unless every peer is trusted as much as this process.
    ///
    /// # Errors
    /// [`Error::Capability`] (`ImplicitOnDemandPaging`) unless the device reports
    /// `IBV_ODP_SUPPORT_IMPLICIT` (the software NIC never does); [`Error::RegionRights`];
    /// the registration error.
    pub unsafe fn register_implicit_odp(&self, access: Access) -> Result<MemoryRegion> {
        self.inner.lifetimes.reclaim();
        let access = access | Access::ON_DEMAND;
        if let Some(why) = access.region_error() {
            return Err(Error::RegionRights { access, why });
        }
        if !self.device().odp_caps().implicit() {
            return Err(Error::Capability(Capability::ImplicitOnDemandPaging));
        }
        self.check_odp(access)?;
        // SAFETY: the caller's contract.
        unsafe { MemoryRegion::register_implicit(self.clone(), access) }
    }

    /// Registers `len` bytes at `offset` of a dma-buf (GPU or accelerator memory exported as
    /// a file descriptor) at device address `iova` (`ibv_reg_dmabuf_mr`). Requests name
    /// addresses from `iova`; the region has no CPU view (`read`/`write` are
    /// [`Error::NoCpuMapping`]). The kernel keeps its own reference to the dma-buf, so `fd`
    /// may be closed afterwards. The poller cannot copy a small send delivered inside the
    /// CQE into memory without a CPU view: receive into such a region on a QP with
    /// [`QpCaps::scatter_to_cqe`](crate::QpCaps) off (or `MLX5_SCATTER_TO_CQE=0`), else
    /// those receives complete with `LocProtErr`. The kernel registers a dma-buf through its
    /// on-demand paging: after the exporter moves the buffer the device faults on it, which
    /// the crate handles as for [`Access::ON_DEMAND`] regions (an SRQ receive is posted
    /// again: [`Srq::post_recv`](crate::Srq::post_recv)). On the software NIC, the
    /// descriptor comes from a `SimDmaBuf` (feature `sim`), whose exporter can move it.
    ///
    /// # Errors
    /// [`Error::Capability`] (`DmaBuf`) when rdma-core answers `EOPNOTSUPP` (providers
    /// without dma-buf, such as rxe before Linux 6.x) and on a software NIC without
    /// on-demand paging; as [`Pd::register`] for the length and rights, and
    /// [`Error::RegionRights`] for `MW_BIND` or `ON_DEMAND` (the kernel takes only local
    /// write and the remote rights for a dma-buf); [`Error::InvalidParameter`] when `iova +
    /// len` wraps or `iova` has not the page offset of `offset`, and on the software NIC for a
    /// descriptor no `SimDmaBuf` of it made or a range outside it; the registration error
    /// (`EBADF`, `EINVAL` for an fd that is not a dma-buf or a range outside it).
    pub fn register_dmabuf(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        self.check_registration(len, access, true)?;
        // `UVERBS_METHOD_REG_DMABUF_MR` takes these rights only (`uverbs_get_flags32`), and
        // an iova with the page offset of `offset` (EINVAL otherwise; `ibv_reg_dmabuf_mr(3)`).
        let rights = Access::LOCAL_WRITE.0
            | Access::REMOTE_WRITE.0
            | Access::REMOTE_READ.0
            | Access::REMOTE_ATOMIC.0;
        if access.0 & !rights != 0 {
            return Err(Error::RegionRights {
                access,
                why: "a dma-buf region takes only LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ and \
                      REMOTE_ATOMIC (ibv_reg_dmabuf_mr)",
            });
        }
        let page = super::buffer::os_page_size() as u64;
        if (offset ^ iova) & (page - 1) != 0 {
            return Err(Error::InvalidParameter {
                what: "dma-buf iova (its page offset differs from the offset's)",
                value: iova,
            });
        }
        // Requests name iova + offset: the range must not wrap the address space.
        if iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidParameter {
                what: "dma-buf iova (iova + length wraps)",
                value: iova,
            });
        }
        MemoryRegion::register_dmabuf(self.clone(), fd, offset, len, iova, access)
    }

    /// Prefetches on-demand pages of regions of this domain (`ibv_advise_mr` with
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`, or `_PREFETCH_WRITE` when `write`), waiting until
    /// they are mapped when `flush` (`IBV_ADVISE_MR_FLAG_FLUSH`), otherwise in the
    /// background. Each entry names an on-demand region by its lkey.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for no entries; [`Error::Capability`]
    /// (`OnDemandPaging`) when the device has none, (`Prefetch`) when rdma-core has no
    /// `ibv_advise_mr` for it; [`Error::InvalidParameter`] naming the lkey on the software
    /// NIC for an entry the kernel would refuse (not an on-demand region of this domain,
    /// out of range, or a write prefetch of a region without local write); the
    /// `ibv_advise_mr` error.
    pub fn prefetch(&self, sgl: &[mlx5::request::Sge], write: bool, flush: bool) -> Result<()> {
        if sgl.is_empty() {
            return Err(Error::InvalidParameter {
                what: "prefetch entries",
                value: 0,
            });
        }
        if !self.device().odp_caps().rc(false) {
            return Err(Error::Capability(Capability::OnDemandPaging));
        }
        self.inner.pd.prefetch(sgl, write, flush)
    }
}
