//! Protection domains, memory regions, CQs and RC QPs over rdma-core, each freed on drop
//! after everything that depends on it (reference counts).

use super::device::Context;
use super::ex::{ApiChoice, PollOps, SendOps, UdSendOps, VerbsApi};
use super::{code, last, VerbsError};
use crate::Access;
use rdma_sys as ffi;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::Arc;

/// A protection domain.
pub struct Pd {
    pub(crate) pd: *mut ffi::ibv_pd,
    pub(crate) ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread-safe in rdma-core; the wrapper only holds the pointer.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a protection domain.
    ///
    /// # Errors
    /// The `ibv_alloc_pd` error.
    pub fn new(ctx: Arc<Context>) -> Result<Pd, VerbsError> {
        // SAFETY: live context.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(last("ibv_alloc_pd"));
        }
        Ok(Pd { pd, ctx })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; regions and QPs hold an Arc of this PD, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
    }
}

struct PageBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `Mr::alloc`, freed once, after deregistration.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// `IBV_ADVISE_MR_FLAG_FLUSH` (`verbs_api.h`: `IB_UVERBS_ADVISE_MR_FLAG_FLUSH`, `1 << 0`):
/// declared here because rdma-sys has no binding for it; the header test checks the value.
pub const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;

/// A registered memory region.
pub struct Mr {
    pub(crate) mr: *mut ffi::ibv_mr,
    // Field order: the registration goes before the memory (see Drop), the PD last.
    buf: Option<PageBuf>,
    _pd: Arc<Pd>,
}

// SAFETY: as for Pd.
unsafe impl Send for Mr {}
// SAFETY: as for Pd.
unsafe impl Sync for Mr {}

fn ibv_access(a: Access) -> i32 {
    // blueflame's Access has the values of IBV_ACCESS_* (checked by the header tests).
    a.0 as i32
}

impl Mr {
    /// Allocates `len` zeroed page-aligned bytes and registers them.
    ///
    /// # Errors
    /// The `ibv_reg_mr` error.
    pub fn alloc(pd: Arc<Pd>, len: usize, access: Access) -> Result<Mr, VerbsError> {
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|_| VerbsError {
            call: "alloc",
            source: std::io::ErrorKind::InvalidInput.into(),
        })?;
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            // The size comes from the user: an error, never an abort.
            return Err(VerbsError {
                call: "alloc",
                source: std::io::ErrorKind::OutOfMemory.into(),
            });
        }
        let buf = PageBuf { ptr, layout };
        // SAFETY: the buffer lives as long as the registration (freed after it in Drop).
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd, ptr.cast(), len, ibv_access(access)) };
        if mr.is_null() {
            return Err(last("ibv_reg_mr"));
        }
        Ok(Mr {
            mr,
            buf: Some(buf),
            _pd: pd,
        })
    }

    /// Registers memory the caller owns.
    ///
    /// # Safety
    /// `addr .. addr + len` must stay valid until the region is dropped.
    ///
    /// # Errors
    /// The `ibv_reg_mr` error.
    pub unsafe fn register(
        pd: Arc<Pd>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        // SAFETY: the caller keeps the memory valid while registered.
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd, addr.cast(), len, ibv_access(access)) };
        if mr.is_null() {
            return Err(last("ibv_reg_mr"));
        }
        Ok(Mr {
            mr,
            buf: None,
            _pd: pd,
        })
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` at device address `iova`
    /// (`ibv_reg_dmabuf_mr`). The kernel takes its own reference to the dma-buf: `fd` may be
    /// closed afterwards. No CPU mapping comes with it.
    ///
    /// # Errors
    /// The `ibv_reg_dmabuf_mr` error (`EOPNOTSUPP` from providers without it).
    pub fn register_dmabuf(
        pd: Arc<Pd>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        access: Access,
    ) -> Result<Mr, VerbsError> {
        use std::os::fd::AsRawFd;
        // SAFETY: live PD; the device reaches only the exporter's memory through the fd.
        let mr = unsafe {
            ffi::ibv_reg_dmabuf_mr(pd.pd, offset, len, iova, fd.as_raw_fd(), ibv_access(access))
        };
        if mr.is_null() {
            return Err(last("ibv_reg_dmabuf_mr"));
        }
        Ok(Mr {
            mr,
            buf: None,
            _pd: pd,
        })
    }

    /// Prefetches on-demand pages of regions of `pd` (`ibv_advise_mr`,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH` or `_PREFETCH_WRITE`; `flush` waits for the pages,
    /// `IBV_ADVISE_MR_FLAG_FLUSH`).
    ///
    /// # Errors
    /// The `ibv_advise_mr` error (`EOPNOTSUPP` without the provider call).
    pub fn advise(pd: &Pd, write: bool, flush: bool, sgl: &[crate::Sge]) -> Result<(), VerbsError> {
        use ffi::ib_uverbs_advise_mr_advice as adv;
        let mut list: Vec<ffi::ibv_sge> = sgl
            .iter()
            .map(|s| ffi::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            })
            .collect();
        let advice = if write {
            adv::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE
        } else {
            adv::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH
        };
        let flags = if flush { IBV_ADVISE_MR_FLAG_FLUSH } else { 0 };
        // SAFETY: live PD; `list` holds `list.len()` entries for the call's duration.
        let rc = unsafe {
            super::ex::advise_mr(pd.pd, advice, flags, list.as_mut_ptr(), list.len() as u32)
        };
        if rc != 0 {
            return Err(code("ibv_advise_mr", rc));
        }
        Ok(())
    }

    /// (address, length, lkey, rkey).
    pub fn info(&self) -> (u64, u64, u32, u32) {
        // SAFETY: `mr` is live while self is.
        let m = unsafe { &*self.mr };
        (m.addr as u64, m.length as u64, m.lkey, m.rkey)
    }
}

impl Mr {
    /// Deregisters the region, then frees its memory. False when rdma-core refuses (rxe
    /// refuses while a memory window is bound to the region): the registration and the
    /// memory stay; call again later.
    pub fn deregister(&mut self) -> bool {
        if self.mr.is_null() {
            return true;
        }
        // SAFETY: registered in `alloc`/`register` and not deregistered yet (null after).
        if unsafe { ffi::ibv_dereg_mr(self.mr) } != 0 {
            return false;
        }
        self.mr = std::ptr::null_mut();
        self.buf.take();
        true
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Never free memory under a live registration: when the device still refuses to
        // deregister, the memory is leaked.
        if !self.deregister() {
            if let Some(b) = self.buf.take() {
                std::mem::forget(b);
            }
        }
    }
}

/// A completion queue.
pub struct Cq {
    /// The CQ (for an extended CQ, `ibv_cq_ex_to_cq` of it: the same address).
    pub(crate) cq: *mut ffi::ibv_cq,
    /// The extended polling operations, when the CQ was created with `ibv_create_cq_ex`.
    pub(crate) poll_ops: Option<PollOps>,
    _ctx: Arc<Context>,
    /// The completion channel its events go to (destroyed after the CQ).
    _channel: Option<Arc<super::channel::CompChannel>>,
}

// SAFETY: as for Pd; polling is serialised by the owner (`&mut`).
unsafe impl Send for Cq {}
// SAFETY: as for Pd.
unsafe impl Sync for Cq {}

impl Cq {
    /// A CQ of at least `entries` entries; with `ibv_create_cq_ex` (polled with
    /// `ibv_start_poll`) when `api` wants it and the provider has it.
    ///
    /// # Errors
    /// The `ibv_create_cq` error; [`crate::Error::Unsupported`] when `api` requires the
    /// extended CQ and the provider refuses it.
    pub fn new(ctx: Arc<Context>, entries: u32, api: ApiChoice) -> crate::Result<Cq> {
        Cq::with_channel(ctx, entries, None, 0, api)
    }

    /// A CQ of at least `entries` entries whose events go to `channel` with `context` as
    /// their `cq_context`; with `ibv_create_cq_ex` (polled with `ibv_start_poll`) when `api`
    /// wants it and the provider has it.
    ///
    /// # Errors
    /// The `ibv_create_cq` error; [`crate::Error::Unsupported`] when `api` requires the
    /// extended CQ and the provider refuses it.
    pub fn with_channel(
        ctx: Arc<Context>,
        entries: u32,
        channel: Option<Arc<super::channel::CompChannel>>,
        context: usize,
        api: ApiChoice,
    ) -> crate::Result<Cq> {
        let ch = channel.as_ref().map_or(std::ptr::null_mut(), |c| c.ch);
        if api.wants_extended() {
            // SAFETY: a zeroed attribute is valid (vector 0, no optional field).
            let mut attr: ffi::ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
            attr.cqe = entries;
            attr.cq_context = context as *mut _;
            attr.channel = ch;
            attr.wc_flags = super::ex::wc_flags();
            // SAFETY: live context; `ch` is null or a live channel of it (kept alive by the
            // CQ); `attr` is valid for the call.
            let cqx = unsafe { super::ex::create_cq_ex(ctx.ctx, &mut attr) };
            if !cqx.is_null() {
                // SAFETY: created just above; the ops are used while the Cq lives.
                match unsafe { PollOps::of(cqx) } {
                    Some(ops) => {
                        return Ok(Cq {
                            // `ibv_cq_ex_to_cq`: the extended CQ begins with the ibv_cq.
                            cq: cqx.cast(),
                            poll_ops: Some(ops),
                            _ctx: ctx,
                            _channel: channel,
                        });
                    }
                    // SAFETY: created above, used by nothing.
                    None => unsafe {
                        ffi::ibv_destroy_cq(cqx.cast());
                    },
                }
            }
            api.unavailable("BLUEFLAME_VERBS_API=extended: the provider has no ibv_create_cq_ex")?;
        }
        // SAFETY: live context; `ch` is null or a live channel of it (kept alive by the CQ);
        // vector 0.
        let cq = unsafe { ffi::ibv_create_cq(ctx.ctx, entries as i32, context as *mut _, ch, 0) };
        if cq.is_null() {
            return Err(crate::Error::Verbs(last("ibv_create_cq")));
        }
        Ok(Cq {
            cq,
            poll_ops: None,
            _ctx: ctx,
            _channel: channel,
        })
    }

    /// The API the verbs data path polls this CQ with.
    pub fn api(&self) -> VerbsApi {
        if self.poll_ops.is_some() {
            VerbsApi::Extended
        } else {
            VerbsApi::Legacy
        }
    }

    /// A CQ of at least `entries` entries whose CQEs an mlx5 device compresses with
    /// mini-CQEs of `format` (`crate::dv::create_cq_compressed`), its events on `channel`.
    ///
    /// # Errors
    /// As `crate::dv::create_cq_compressed`.
    pub(crate) fn new_compressed(
        ctx: Arc<Context>,
        entries: u32,
        format: mlx5::MiniCqeFormat,
        channel: Option<Arc<super::channel::CompChannel>>,
    ) -> crate::Result<Cq> {
        let ch = channel.as_ref().map_or(std::ptr::null_mut(), |c| c.ch);
        // SAFETY: live context of an mlx5 device (the direct path runs only there); `ch` is
        // null or a live channel of it (kept alive by the CQ).
        let cq =
            unsafe { crate::dv::create_cq_compressed(ctx.ctx.cast(), entries, format, ch.cast())? };
        Ok(Cq {
            cq: cq.cast(),
            poll_ops: None,
            _ctx: ctx,
            _channel: channel,
        })
    }

    /// Entries the CQ really has.
    pub fn capacity(&self) -> u32 {
        // SAFETY: live CQ.
        unsafe { (*self.cq).cqe as u32 }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created in `new`; QPs on it hold an Arc, so none is left.
        unsafe { ffi::ibv_destroy_cq(self.cq) };
    }
}

/// Sizes of an RC QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Send work requests.
    pub max_send_wr: u32,
    /// Receive work requests.
    pub max_recv_wr: u32,
    /// Gather entries per send.
    pub max_send_sge: u32,
    /// Scatter entries per receive.
    pub max_recv_sge: u32,
    /// Inline bytes per send.
    pub max_inline: u32,
}

/// What a peer needs to connect to a QP (exchanged out of band).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct PathInfo {
    /// QP number.
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// GID (RoCE: the IPv4-mapped RoCE v2 GID).
    pub gid: [u8; 16],
    /// LID (InfiniBand).
    pub lid: u16,
    /// Path MTU (verbs enum).
    pub mtu: u32,
}

/// The device limits a connection must stay within (rdma-core's `mlx5_modify_qp` passes the
/// attributes to the kernel, which refuses values above the device's).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// The local port's active MTU (verbs enum: 1 = 256 ... 5 = 4096).
    pub local_mtu: u32,
    /// `max_qp_rd_atom` of the device: the responder's limit.
    pub max_qp_rd_atom: u8,
    /// `max_qp_init_rd_atom` of the device: the requester's limit.
    pub max_qp_init_rd_atom: u8,
}

impl ConnLimits {
    /// Reads and atomics in flight the crate asks for, in each direction.
    pub const RD_ATOMIC: u8 = 16;

    /// The path MTU: the smaller of the two ports' active MTUs (the verbs enum grows with
    /// the size); a peer that sent none (0) gets the local one.
    pub fn path_mtu(&self, remote_mtu: u32) -> u32 {
        match (self.local_mtu, remote_mtu) {
            (0, r) => r,
            (l, 0) => l,
            (l, r) => l.min(r),
        }
    }

    /// `max_dest_rd_atomic` (RTR): at most the device's `max_qp_rd_atom`.
    pub fn max_dest_rd_atomic(&self) -> u8 {
        Self::RD_ATOMIC.min(self.max_qp_rd_atom)
    }

    /// `max_rd_atomic` (RTS): at most the device's `max_qp_init_rd_atom`.
    pub fn max_rd_atomic(&self) -> u8 {
        Self::RD_ATOMIC.min(self.max_qp_init_rd_atom)
    }
}

/// Timeouts and retries of a connection (`ibv_modify_qp` RTR/RTS attributes).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Local ACK timeout exponent (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: for ever).
    pub rnr_retry: u8,
    /// Minimal RNR NAK timer (verbs encoding).
    pub min_rnr_timer: u8,
}

impl Timing {
    /// Checks the values verbs encodes in 3 bits (`retry_cnt`, `rnr_retry`: at most 7) and
    /// 5 bits (`timeout`, `min_rnr_timer`: at most 31); the kernel would silently keep only
    /// the low bits (`rnr_retry` 8 would become 0: no retry at all).
    ///
    /// # Errors
    /// [`crate::Error::InvalidParameter`] naming the field.
    pub fn check(&self) -> crate::Result<()> {
        for (what, v, max) in [
            ("timing: rnr_retry (at most 7)", self.rnr_retry, 7),
            ("timing: retry_cnt (at most 7)", self.retry_cnt, 7),
            ("timing: timeout (at most 31)", self.timeout, 31),
            ("timing: min_rnr_timer (at most 31)", self.min_rnr_timer, 31),
        ] {
            if v > max {
                return Err(crate::Error::InvalidParameter {
                    what,
                    value: v as u64,
                });
            }
        }
        Ok(())
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

/// A thread domain and the parent domain that joins it to a PD. A QP created on the parent
/// domain rings the thread domain's BlueFlame register, which rdma-core gives no other QP
/// (mlx5 `mlx5_alloc_td` -> `mlx5_attach_dedicated_uar`; `create_qp` takes `mtd->bf` for a
/// QP on a parent domain with a thread domain). UCX does the same per worker
/// (`uct_ib_mlx5_res_domain_init`).
///
/// Drop order: the QP first (it holds the parent domain), then the parent domain, then the
/// thread domain (rdma-core refuses to free a domain still referenced: `EBUSY`).
pub struct ThreadDomain {
    parent: *mut ffi::ibv_pd,
    td: *mut ffi::ibv_td,
    _pd: Arc<Pd>,
}

// SAFETY: as for Pd: the wrapper only holds the pointers; rdma-core's calls on them are
// thread-safe.
unsafe impl Send for ThreadDomain {}
// SAFETY: as above.
unsafe impl Sync for ThreadDomain {}

impl ThreadDomain {
    /// A thread domain on `pd`'s context and its parent domain over `pd`.
    ///
    /// # Errors
    /// The `ibv_alloc_td` error (`EOPNOTSUPP` on providers without thread domains, `ENOMEM`
    /// when the device has no register left) or the `ibv_alloc_parent_domain` error.
    pub fn new(pd: Arc<Pd>) -> Result<ThreadDomain, VerbsError> {
        let mut td_attr = ffi::ibv_td_init_attr { comp_mask: 0 };
        // SAFETY: live context; a valid init attribute (no optional fields).
        let td = unsafe { super::ex::alloc_td(pd.ctx.ctx, &mut td_attr) };
        if td.is_null() {
            return Err(last("ibv_alloc_td"));
        }
        // SAFETY: a zeroed init attribute is valid (no allocators, no optional fields).
        let mut attr: ffi::ibv_parent_domain_init_attr = unsafe { std::mem::zeroed() };
        attr.pd = pd.pd;
        attr.td = td;
        // SAFETY: live context, PD and thread domain.
        let parent = unsafe { super::ex::alloc_parent_domain(pd.ctx.ctx, &mut attr) };
        if parent.is_null() {
            let e = last("ibv_alloc_parent_domain");
            // SAFETY: allocated above, used by nothing.
            unsafe { super::ex::dealloc_td(td) };
            return Err(e);
        }
        Ok(ThreadDomain {
            parent,
            td,
            _pd: pd,
        })
    }
}

impl Drop for ThreadDomain {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`; the QP created on the parent domain is destroyed first
        // (it owns this value and drops it after `ibv_destroy_qp`).
        unsafe {
            ffi::ibv_dealloc_pd(self.parent);
            super::ex::dealloc_td(self.td);
        }
    }
}

/// An RC queue pair.
pub struct Qp {
    pub(crate) qp: *mut ffi::ibv_qp,
    pub(crate) caps: Caps,
    /// The extended send operations (`ibv_wr_*`), when the QP was created with them.
    pub(crate) send_ops: Option<SendOps>,
    /// The extended send operations of a UD QP (`ibv_wr_send` + `ibv_wr_set_ud_addr`),
    /// when it was created with them (see [`super::ud`]); None for an RC QP.
    pub(crate) ud_ops: Option<UdSendOps>,
    /// The rdma_cm id that created the QP (it is destroyed through it).
    pub(super) cm_id: Option<*mut ffi::rdma_cm_id>,
    /// The QP's thread domain, when it was created on one: freed after the QP (Drop).
    pub(super) td: Option<ThreadDomain>,
    pub(super) pd: Arc<Pd>,
    pub(super) _cqs: [Arc<Cq>; 2],
    /// The SRQ the QP takes its receives from (destroyed after the QP).
    pub(super) _srq: Option<Arc<super::srq::Srq>>,
    /// The scatter lists of the QP's receive queue (set by its
    /// [`VerbsRecvQueue`](super::path::VerbsRecvQueue)): dropped only after the QP is
    /// destroyed (Drop below), so the regions its outstanding receives pin stay registered
    /// while the device may still write them, whoever holds the QP last.
    pub(crate) recv_targets: std::sync::OnceLock<Arc<crate::queue::scatter::ScatterTable>>,
}

// SAFETY: as for Pd; posting is serialised by the owner (`&mut`).
unsafe impl Send for Qp {}
// SAFETY: as for Pd.
unsafe impl Sync for Qp {}

/// The creation attributes every QP starts from: its CQs, type, sizes and PD (signaled
/// requests only as asked, `sq_sig_all` 0).
pub(super) fn base_init_attr(
    send_cq: &Cq,
    recv_cq: &Cq,
    caps: &Caps,
    pd: *mut ffi::ibv_pd,
    qp_type: ffi::ibv_qp_type::Type,
) -> ffi::ibv_qp_init_attr_ex {
    // SAFETY: a zeroed init attr is valid; the fields that matter are set below.
    let mut attr: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    attr.send_cq = send_cq.cq;
    attr.recv_cq = recv_cq.cq;
    attr.qp_type = qp_type;
    attr.sq_sig_all = 0;
    attr.cap.max_send_wr = caps.max_send_wr;
    attr.cap.max_recv_wr = caps.max_recv_wr;
    attr.cap.max_send_sge = caps.max_send_sge;
    attr.cap.max_recv_sge = caps.max_recv_sge;
    attr.cap.max_inline_data = caps.max_inline;
    attr.comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
    attr.pd = pd;
    attr
}

/// The creation attributes of an RC QP on these CQs with these sizes, on `pd` (a PD or a
/// thread domain's parent domain); with `extended`, asking for the `ibv_wr_*` opcodes the
/// verbs path posts (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`).
fn init_attr_ex(
    send_cq: &Cq,
    recv_cq: &Cq,
    caps: &Caps,
    pd: *mut ffi::ibv_pd,
    extended: bool,
    srq: Option<&super::srq::Srq>,
) -> ffi::ibv_qp_init_attr_ex {
    let mut attr = base_init_attr(send_cq, recv_cq, caps, pd, ffi::ibv_qp_type::IBV_QPT_RC);
    if let Some(srq) = srq {
        // Receives come from the SRQ: the QP has no receive queue.
        attr.srq = srq.srq;
        attr.cap.max_recv_wr = 0;
        attr.cap.max_recv_sge = 0;
    }
    if extended {
        attr.comp_mask |= ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
        attr.send_ops_flags = super::ex::send_ops_flags();
    }
    attr
}

/// The sizes the device really gave (written back into the attributes).
fn caps_of(attr: &ffi::ibv_qp_init_attr_ex) -> Caps {
    Caps {
        max_send_wr: attr.cap.max_send_wr,
        max_recv_wr: attr.cap.max_recv_wr,
        max_send_sge: attr.cap.max_send_sge,
        max_recv_sge: attr.cap.max_recv_sge,
        max_inline: attr.cap.max_inline_data,
    }
}

/// Creates a QP with `create` (which returns the QP or null with `errno` set): with the
/// extended send operations first when `api` wants them, then, when the provider refuses
/// them (or leaves a pointer unset) and `api` allows it, without. Returns the QP, its real
/// sizes and its extended operations.
fn create_with(
    api: ApiChoice,
    call: &'static str,
    attr_of: impl Fn(bool) -> ffi::ibv_qp_init_attr_ex,
    create: impl Fn(&mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp,
    destroy: impl Fn(*mut ffi::ibv_qp),
) -> crate::Result<(*mut ffi::ibv_qp, Caps, Option<SendOps>)> {
    if api.wants_extended() {
        let mut attr = attr_of(true);
        let qp = create(&mut attr);
        if !qp.is_null() {
            // SAFETY: the QP was just created, and lives while the result is used.
            if let Some(ops) = unsafe { SendOps::of(qp) } {
                return Ok((qp, caps_of(&attr), Some(ops)));
            }
            destroy(qp);
        }
        api.unavailable(
            "BLUEFLAME_VERBS_API=extended: the provider refused the extended send operations",
        )?;
    }
    let mut attr = attr_of(false);
    let qp = create(&mut attr);
    if qp.is_null() {
        return Err(crate::Error::Verbs(last(call)));
    }
    Ok((qp, caps_of(&attr), None))
}

/// A thread domain for a new QP when `want`, or None when the device has none to give
/// (then the QP gets rdma-core's shared registers, as UCX falls back to the plain PD).
pub(super) fn thread_domain(pd: &Arc<Pd>, want: bool) -> Option<ThreadDomain> {
    if want {
        ThreadDomain::new(pd.clone()).ok()
    } else {
        None
    }
}

/// The PD a QP is created on: the thread domain's parent domain, else the PD.
pub(super) fn qp_pd(pd: &Pd, td: &Option<ThreadDomain>) -> *mut ffi::ibv_pd {
    td.as_ref().map_or(pd.pd, |t| t.parent)
}

impl Qp {
    /// Creates an RC QP in RESET; with `thread_domain`, on a thread domain of its own (when
    /// the device gives one), so that its BlueFlame register is its own. With the extended
    /// send operations (`ibv_wr_*`) when `api` wants them and the provider has them.
    ///
    /// # Errors
    /// The `ibv_create_qp_ex` error (e.g. `EINVAL` for an inline size the device refuses);
    /// [`crate::Error::Unsupported`] when `api` requires the extended operations and the
    /// provider refuses them.
    pub fn new(
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        thread_domain: bool,
        api: ApiChoice,
    ) -> crate::Result<Qp> {
        Qp::with_srq(pd, send_cq, recv_cq, caps, thread_domain, api, None)
    }

    /// As [`Qp::new`]; with `srq`, the QP takes its receives from it (`srq` in the
    /// creation attributes: no receive queue of its own).
    ///
    /// # Errors
    /// As [`Qp::new`].
    pub fn with_srq(
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        thread_domain: bool,
        api: ApiChoice,
        srq: Option<Arc<super::srq::Srq>>,
    ) -> crate::Result<Qp> {
        let td = self::thread_domain(&pd, thread_domain);
        let on = qp_pd(&pd, &td);
        let (qp, real, send_ops) = create_with(
            api,
            "ibv_create_qp_ex",
            |ex| init_attr_ex(&send_cq, &recv_cq, &caps, on, ex, srq.as_deref()),
            // SAFETY: live context, (parent) PD, CQs and SRQ; `attr` is a valid in/out
            // parameter.
            |attr| unsafe { super::ex::create_qp_ex(pd.ctx.ctx, attr) },
            // SAFETY: created just before, used by nothing.
            |qp| unsafe {
                ffi::ibv_destroy_qp(qp);
            },
        )?;
        Ok(Qp {
            qp,
            caps: real,
            send_ops,
            ud_ops: None,
            cm_id: None,
            td,
            pd,
            _cqs: [send_cq, recv_cq],
            _srq: srq,
            recv_targets: Default::default(),
        })
    }

    /// Creates an RC QP through librdmacm on `id` (connected by rdma_cm, not by
    /// `ibv_modify_qp`) with `rdma_create_qp_ex`; with `thread_domain` and `api` as in
    /// [`Qp::new`].
    ///
    /// # Safety
    /// `id` must be a live rdma_cm id on the PD's context that outlives the QP.
    ///
    /// # Errors
    /// The `rdma_create_qp_ex` error; as [`Qp::new`] for `api`.
    pub unsafe fn on_cm(
        id: *mut ffi::rdma_cm_id,
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        thread_domain: bool,
        api: ApiChoice,
    ) -> crate::Result<Qp> {
        let td = self::thread_domain(&pd, thread_domain);
        let on = qp_pd(&pd, &td);
        let (qp, real, send_ops) = create_with(
            api,
            "rdma_create_qp_ex",
            |ex| init_attr_ex(&send_cq, &recv_cq, &caps, on, ex, None),
            |attr| {
                // SAFETY: the caller's contract; `attr` is a valid in/out parameter; the
                // parent domain is on the id's context.
                if unsafe { ffi::rdma_create_qp_ex(id, attr) } != 0 {
                    return std::ptr::null_mut();
                }
                // SAFETY: rdma_create_qp_ex succeeded: `id->qp` is the new QP.
                unsafe { (*id).qp }
            },
            // SAFETY: created just before on this id, used by nothing; the id can take
            // another QP afterwards (rdma_destroy_qp clears `id->qp`).
            |_| unsafe { ffi::rdma_destroy_qp(id) },
        )?;
        Ok(Qp {
            qp,
            caps: real,
            send_ops,
            ud_ops: None,
            cm_id: Some(id),
            td,
            pd,
            _cqs: [send_cq, recv_cq],
            _srq: None,
            recv_targets: Default::default(),
        })
    }

    /// The API the verbs data path posts to this QP with.
    pub fn api(&self) -> VerbsApi {
        if self.send_ops.is_some() || self.ud_ops.is_some() {
            VerbsApi::Extended
        } else {
            VerbsApi::Legacy
        }
    }

    /// Whether the QP was created on a thread domain of its own: its BlueFlame register is
    /// rung by this QP only.
    pub fn has_thread_domain(&self) -> bool {
        self.td.is_some()
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.qp).qp_num }
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.pd.ctx
    }

    pub(super) fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: u32) -> Result<(), VerbsError> {
        // SAFETY: live QP; `attr` is a valid attribute block for `mask`.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(code("ibv_modify_qp", rc));
        }
        Ok(())
    }

    /// RESET -> INIT with remote read/write/atomic access.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_init(&self, port: u8) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: zeroed attributes are valid; the masked ones are set.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = (Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC)
            .0;
        self.modify(
            &mut a,
            M::IBV_QP_STATE.0
                | M::IBV_QP_PKEY_INDEX.0
                | M::IBV_QP_PORT.0
                | M::IBV_QP_ACCESS_FLAGS.0,
        )
    }

    /// INIT -> RTR towards `remote`, through `port` and source GID `gid_index` (RoCE), with
    /// the path MTU and responder depth within `lim`.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_rtr(
        &self,
        remote: &PathInfo,
        port: u8,
        gid_index: Option<i32>,
        t: &Timing,
        lim: &ConnLimits,
    ) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: as in to_init.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = lim.path_mtu(remote.mtu);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn & 0xff_ffff;
        a.max_dest_rd_atomic = lim.max_dest_rd_atomic();
        a.min_rnr_timer = t.min_rnr_timer;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.port_num = port;
        if let Some(idx) = gid_index {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = idx as u8;
            a.ah_attr.grh.hop_limit = 64;
        }
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_AV.0
            | M::IBV_QP_PATH_MTU.0
            | M::IBV_QP_DEST_QPN.0
            | M::IBV_QP_RQ_PSN.0
            | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | M::IBV_QP_MIN_RNR_TIMER.0;
        self.modify(&mut a, mask)
    }

    /// RTR -> RTS with send PSN `psn`.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_rts(&self, psn: u32, t: &Timing, lim: &ConnLimits) -> Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: as in to_init.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = psn & 0xff_ffff;
        a.timeout = t.timeout;
        a.retry_cnt = t.retry_cnt;
        a.rnr_retry = t.rnr_retry;
        a.max_rd_atomic = lim.max_rd_atomic();
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_SQ_PSN.0
            | M::IBV_QP_TIMEOUT.0
            | M::IBV_QP_RETRY_CNT.0
            | M::IBV_QP_RNR_RETRY.0
            | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut a, mask)
    }

    /// Any state -> ERROR: outstanding work is flushed.
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn to_error(&self) -> Result<(), VerbsError> {
        // SAFETY: as in to_init.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut a, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        match self.cm_id {
            // SAFETY: created by rdma_create_qp on this id, which outlives it (the connection
            // holds the id and drops it after the QP).
            Some(id) => unsafe { ffi::rdma_destroy_qp(id) },
            // SAFETY: created in `new`, destroyed once; its CQs and PD are kept alive.
            None => unsafe {
                ffi::ibv_destroy_qp(self.qp);
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ConnLimits;

    /// A ConnectX-like device (16 / 16) and a small one (4 responder, 2 requester) on a
    /// 1024-byte port: the depths never exceed the device's, the MTU is the smaller one.
    #[test]
    fn connection_attributes_stay_within_the_device() {
        let cx = ConnLimits {
            local_mtu: 5,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
        };
        assert_eq!((cx.max_dest_rd_atomic(), cx.max_rd_atomic()), (16, 16));
        let small = ConnLimits {
            local_mtu: 3,
            max_qp_rd_atom: 4,
            max_qp_init_rd_atom: 2,
        };
        assert_eq!((small.max_dest_rd_atomic(), small.max_rd_atomic()), (4, 2));
        let big = ConnLimits {
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            ..small
        };
        assert_eq!((big.max_dest_rd_atomic(), big.max_rd_atomic()), (16, 16));
        // Path MTU: min(local, remote); a remote that sent none gets the local one.
        assert_eq!(small.path_mtu(5), 3, "remote 4096, local 1024");
        assert_eq!(cx.path_mtu(3), 3, "remote 1024, local 4096");
        assert_eq!(small.path_mtu(0), 3);
    }
}
