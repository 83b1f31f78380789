//! The kernel behind the device node: `ib_uverbs` and `mlx5_ib` as rdma-core's provider
//! meets them, in front of one software NIC (thread mode: it watches the doorbell records
//! of the rings the provider allocated).
//!
//! Each decision the crate depends on follows the kernel function named at its place
//! (`drivers/infiniband/hw/mlx5/`). What the model does not have it refuses as the kernel
//! refuses a missing feature (`EOPNOTSUPP`), never by pretending.

use crate::abi;
use crate::cmd::Call;
use crate::events::{self, Subject};
use crate::fds;
use crate::next::next;
use libc::c_int;
use mlx5::request::Access;
use mlx5::request::MwType;
use mlx5::sim::{CqEventSink, HostCq, HostQp, HostSrq, Nic, QpCaps, QpTiming, SrqCaps, PORT_LID};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Pages of the model's UARs (the kernel maps 4 KiB device pages).
const PAGE: usize = 4096;
/// Where the BlueFlame registers start in a UAR page (`MLX5_BF_OFFSET`).
const BF_OFFSET: usize = 0x800;
/// Bytes of one BlueFlame register (`1 << log_bf_reg_size`, 512 on ConnectX): two halves.
const BF_REG_SIZE: u32 = 512;
/// bfregs per UAR page without 4K UARs (`MLX5_NON_FP_BFREGS_PER_UAR`).
const BFREGS_PER_PAGE: u32 = 2;
/// The largest send WQE (`max_wqe_sz_sq`): 16 basic blocks.
const MAX_SQ_DESC: u16 = 1024;
/// The largest receive WQE (`max_wqe_sz_rq`): 32 scatter entries.
const MAX_RQ_DESC: u16 = 512;
/// bfregs for thread domains beyond the static ones (`num_dyn_bfregs`: 32 UAR pages).
const DYN_BFREGS: u32 = 64;
/// Work requests per queue (`1 << log_max_qp_sz`).
const MAX_WR: u32 = 1 << 15;
/// Gather / scatter entries per WQE the device reports.
const MAX_SGE: u32 = 30;

/// `enum ib_qp_type` values rdma-core sends.
const QPT_RC: u8 = 2;
/// `IB_QPT_UD`.
const QPT_UD: u8 = 4;
/// `IB_QPT_DRIVER`: a DC QP (`MLX5_QP_FLAG_TYPE_DCI` / `_DCT` in the driver data).
const QPT_DRIVER: u8 = 0xff;
/// `IB_UVERBS_QP_CREATE_BLOCK_MULTICAST_LOOPBACK` (verbs' `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`).
const BLOCK_MCAST_LOOPBACK: u32 = 1 << 1;

/// `enum ib_uverbs_qp_state` (`IB_QPS_*`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Error,
}

impl QpState {
    fn from_abi(v: u8) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Error,
            _ => return None,
        })
    }
}

/// `IB_QP_*` attribute mask bits the model reads.
mod mask {
    pub(super) const STATE: u32 = 1 << 0;
    pub(super) const QKEY: u32 = 1 << 6;
    pub(super) const ACCESS_FLAGS: u32 = 1 << 3;
    pub(super) const DEST_QPN: u32 = 1 << 20;
    pub(super) const TIMEOUT: u32 = 1 << 9;
    pub(super) const RETRY_CNT: u32 = 1 << 10;
    pub(super) const RNR_RETRY: u32 = 1 << 11;
    pub(super) const MIN_RNR_TIMER: u32 = 1 << 15;
}

/// One object of a file, by its uverbs handle.
enum Obj {
    Pd(u32),
    Mr(u32),
    Mw(u32),
    /// A completion channel (its descriptor is the user's: the user closes it).
    Channel(c_int),
    Cq(Cq),
    Qp(Box<Qp>),
    Srq(Srq),
}

/// A CQ: its number, the user's handle events name, its completion channel.
struct Cq {
    cqn: u32,
    channel: Option<c_int>,
}

/// An SRQ: its number and the user's handle.
struct Srq {
    srqn: u32,
    user: u64,
}

/// A QP as the kernel sees it: the verbs state machine in front of the NIC's QP.
struct Qp {
    qpn: u32,
    user: u64,
    state: QpState,
    dest: Option<u32>,
    timing: QpTiming,
    /// The bfreg it rings: (dynamic, index); a static one is counted in the file's classes.
    bfreg: (bool, u32),
    /// Responder scatter-to-CQE, as `configure_responder_scat_cqe` decided.
    scatter: bool,
    /// A UD QP: its Q_Key (set at INIT) and whether it receives its own multicast.
    ud: Option<Ud>,
    /// A DC QP: an initiator, or a target the NIC creates at RTR.
    dc: Option<Dc>,
}

/// The DC role of a QP (`mlx5_ib_create_qp` with `MLX5_QP_FLAG_TYPE_DCI` / `_DCT`).
#[derive(Copy, Clone)]
enum Dc {
    Initiator,
    /// A target as created (`mlx5_ib_create_dct` keeps the attributes; the device object
    /// is made at RTR, `mlx5_ib_modify_dct`, which returns its number).
    Target {
        pd: u32,
        cq: u32,
        srq: Option<u32>,
        key: u64,
        scatter: bool,
        access: u32,
        /// Made on the NIC (its number is the QP's).
        made: bool,
    },
}

/// What a UD QP is given before it runs.
#[derive(Copy, Clone)]
struct Ud {
    qkey: Option<u32>,
    mcast_loopback: bool,
}

/// The user handle of each CQ, by number (events name CQs by it).
type CqHandles = HashMap<u32, u64>;

/// An open `/dev/infiniband/uverbs0`: a ucontext once `GET_CONTEXT` ran.
#[derive(Default)]
struct File {
    ucontext: bool,
    /// The asynchronous event file (`async_fd`).
    async_fd: Option<c_int>,
    /// The user handles of the CQs (for their asynchronous events).
    cq_handles: CqHandles,
    next_handle: u32,
    objs: HashMap<u32, Obj>,
    /// UAR pages mapped: (dynamic, index) -> address. Static pages hold the context's
    /// bfregs (`MLX5_IB_MMAP_REGULAR_PAGE` and kin, by index); dynamic ones the bfregs of
    /// thread domains (`MLX5_IB_MMAP_ALLOC_WC`, by extended index).
    pages: HashMap<(bool, u32), usize>,
    /// bfregs of the static allocation (`mlx5_ib_alloc_ucontext`): total, low latency, and
    /// the QPs on each (`bfregi->count`).
    tot_bfregs: u32,
    low_lat: u32,
    bfreg_count: Vec<u32>,
}

/// The model: one NIC, the open files.
struct Kernel {
    nic: Nic,
    files: HashMap<c_int, File>,
}

fn kernel() -> MutexGuard<'static, Kernel> {
    static K: OnceLock<Mutex<Kernel>> = OnceLock::new();
    K.get_or_init(|| {
        let nic = Nic::new();
        nic.start();
        let events = nic.clone();
        std::thread::Builder::new()
            .name("kernel-model events".into())
            .spawn(move || forward_events(&events))
            .expect("the event thread");
        Mutex::new(Kernel {
            nic,
            files: HashMap::new(),
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

/// The device's event queue read as `mlx5_ib_event` / `mlx5_ib_qp_event` do: each event
/// goes to the asynchronous event file of the context owning its object, naming the user's
/// handle (`ib_uverbs_async_handler`).
fn forward_events(nic: &Nic) {
    use mlx5::sim::AsyncEvent as E;
    loop {
        std::thread::sleep(std::time::Duration::from_micros(500));
        while let Some(e) = nic.take_async_event() {
            if crate::cmd::trace() {
                eprintln!("kernel-model: async event {e:?}");
            }
            // enum ib_event_type
            let (subject, kind) = match e {
                E::CqError { cqn } => (Subject::Cq(cqn), 0),
                E::QpFatal { qpn } => (Subject::Qp(qpn), 1),
                E::QpAccessError { qpn } => (Subject::Qp(qpn), 3),
                E::DeviceFatal => (Subject::Device, 8),
                E::PortError { .. } => (Subject::Device, 10),
                E::SrqLimitReached { srqn } => (Subject::Srq(srqn), 15),
                E::QpLastWqeReached { qpn } => (Subject::Qp(qpn), 16),
                _ => continue,
            };
            let k = kernel();
            for f in k.files.values() {
                let Some(fd) = f.async_fd else { continue };
                let element = match subject {
                    Subject::Device => Some(1),
                    Subject::Cq(n) => f.cq_handles.get(&n).copied(),
                    Subject::Qp(n) => f.objs.values().find_map(|o| match o {
                        Obj::Qp(q) if q.qpn == n => Some(q.user),
                        _ => None,
                    }),
                    Subject::Srq(n) => f.objs.values().find_map(|o| match o {
                        Obj::Srq(q) if q.srqn == n => Some(q.user),
                        _ => None,
                    }),
                };
                if let Some(element) = element {
                    let desc = abi::ib_uverbs_async_event_desc {
                        element,
                        event_type: kind,
                        reserved: 0,
                    };
                    // SAFETY: a plain ABI struct.
                    events::push(fd, subject, unsafe { crate::cmd::bytes(&desc) });
                }
            }
        }
    }
}

/// Where a CQ's completion events go: its channel, naming the user's handle.
struct ChannelSink {
    fd: c_int,
    user: u64,
}

impl CqEventSink for ChannelSink {
    fn cq_event(&self, cqn: u32) {
        events::push(self.fd, Subject::Cq(cqn), &self.user.to_ne_bytes());
    }
}

/// Opens a uverbs file: a descriptor the user polls and closes like the kernel's.
pub(crate) fn open_file() -> c_int {
    // SAFETY: eventfd(2) with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return fd;
    }
    if !fds::DEVICES.add(fd) {
        // SAFETY: closing the descriptor just made.
        unsafe { (next().close)(fd) };
        crate::intercept::set_errno(libc::EMFILE);
        return -1;
    }
    kernel().files.insert(fd, File::default());
    fd
}

/// Closes a uverbs file: its objects are destroyed, QPs first, then CQs, regions and
/// domains (`uverbs_destroy_ufile_hw` destroys by dependency).
pub(crate) fn close_file(fd: c_int) {
    fds::DEVICES.remove(fd);
    let mut k = kernel();
    let Some(mut f) = k.files.remove(&fd) else {
        return;
    };
    let nic = k.nic.clone();
    drop(k);
    let mut objs: Vec<(u32, Obj)> = f.objs.drain().collect();
    objs.sort_by_key(|(_, o)| match o {
        Obj::Qp(_) => 0,
        Obj::Mw(_) => 1,
        Obj::Srq(_) => 2,
        Obj::Cq(_) => 3,
        Obj::Mr(_) => 4,
        Obj::Pd(_) => 5,
        Obj::Channel(_) => 6,
    });
    for (_, o) in objs {
        match o {
            Obj::Qp(q) => drop(nic.destroy_qp(q.qpn)),
            Obj::Mw(r) => drop(nic.dealloc_mw(r)),
            Obj::Srq(s) => drop(nic.destroy_srq(s.srqn)),
            Obj::Cq(c) => drop(nic.destroy_cq(c.cqn)),
            Obj::Mr(l) => drop(nic.dereg_mr(l)),
            Obj::Pd(p) => drop(nic.dealloc_pd(p)),
            Obj::Channel(_) => {}
        }
    }
}

/// `mmap` of the device file: a UAR page (`mlx5_ib_mmap` -> `uar_mmap`). The page is plain
/// memory the NIC reads doorbells from.
pub(crate) fn mmap(fd: c_int, len: usize, off: libc::off_t) -> *mut libc::c_void {
    let fail = |e| {
        crate::intercept::set_errno(e);
        libc::MAP_FAILED
    };
    if len != PAGE || off < 0 || off as usize % PAGE != 0 {
        return fail(libc::EINVAL);
    }
    let pgoff = off as u64 / PAGE as u64;
    let cmd = (pgoff >> 8) & 0xff;
    // MLX5_IB_MMAP_REGULAR_PAGE, _WC_PAGE, _NC_PAGE, _ALLOC_WC: UAR pages. The core clock
    // and clock info pages are not offered (the context's comp_mask does not name them).
    if !matches!(cmd, 0 | 2 | 3 | 6) {
        return fail(libc::EINVAL);
    }
    let mut k = kernel();
    let Some(f) = k.files.get_mut(&fd) else {
        return fail(libc::EBADF);
    };
    if !f.ucontext {
        return fail(libc::EINVAL);
    }
    // `get_index` / `get_extended_index` of the kernel's `uar_mmap`.
    let dynamic = cmd == 6;
    let idx = if dynamic {
        (pgoff & 0xff | (pgoff >> 16) << 8) as u32
    } else {
        (pgoff & 0xff) as u32
    };
    let pages = if dynamic { DYN_BFREGS } else { f.tot_bfregs } / BFREGS_PER_PAGE;
    if idx >= pages {
        return fail(libc::EINVAL);
    }
    // SAFETY: an anonymous shared mapping of one page.
    let p = unsafe {
        (next().mmap)(
            core::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        f.pages.insert((dynamic, idx), p as usize);
    }
    p
}

/// Runs one command of file `fd`.
pub(crate) fn command(fd: c_int, mut call: Call<'_>) -> Result<(), c_int> {
    use abi::*;
    let mut k = kernel();
    let Kernel { nic, files } = &mut *k;
    // Every QP of every file (a connection may join QPs of two contexts of the process).
    let qps: Vec<(u32, Option<u32>, QpState)> = if call.op == IB_USER_VERBS_CMD_MODIFY_QP {
        files
            .values()
            .flat_map(|f| f.objs.values())
            .filter_map(|o| match o {
                Obj::Qp(q) => Some((q.qpn, q.dest, q.state)),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let f = files.get_mut(&fd).ok_or(libc::EBADF)?;
    if !f.ucontext && (call.op != IB_USER_VERBS_CMD_GET_CONTEXT || call.ex) {
        return Err(libc::EINVAL);
    }
    // SAFETY: every `request` / `respond` below reads and writes bindgen's structs of the
    // ABI; the response pointers are the caller's, as write(2) on uverbs promises.
    unsafe {
        match (call.ex, call.op) {
            (false, IB_USER_VERBS_CMD_GET_CONTEXT) => get_context(f, &mut call),
            (false, IB_USER_VERBS_CMD_QUERY_DEVICE) => {
                let _ = call.request::<ib_uverbs_query_device>();
                call.respond::<_, ()>(&device_attr(), None)
            }
            (true, IB_USER_VERBS_EX_CMD_QUERY_DEVICE) => query_device_ex(nic, &mut call),
            (false, IB_USER_VERBS_CMD_QUERY_PORT) => query_port(nic, &mut call),
            (false, IB_USER_VERBS_CMD_ALLOC_PD) => {
                let _ = call.request::<ib_uverbs_alloc_pd>();
                let pdn = nic.alloc_pd();
                let h = f.add(Obj::Pd(pdn));
                let resp = ib_uverbs_alloc_pd_resp {
                    pd_handle: h,
                    ..Default::default()
                };
                call.respond(&resp, Some(&mlx5_ib_alloc_pd_resp { pdn }))
            }
            (false, IB_USER_VERBS_CMD_DEALLOC_PD) => {
                let (c, _) = call.request::<ib_uverbs_dealloc_pd>();
                let Some(Obj::Pd(pdn)) = f.objs.get(&c.pd_handle) else {
                    return Err(libc::EINVAL);
                };
                nic.dealloc_pd(*pdn).map_err(|_| libc::EBUSY)?;
                f.objs.remove(&c.pd_handle);
                Ok(())
            }
            (false, IB_USER_VERBS_CMD_REG_MR) => reg_mr(nic, f, &mut call),
            (false, IB_USER_VERBS_CMD_DEREG_MR) => {
                let (c, _) = call.request::<ib_uverbs_dereg_mr>();
                let Some(Obj::Mr(lkey)) = f.objs.get(&c.mr_handle) else {
                    return Err(libc::EINVAL);
                };
                nic.dereg_mr(*lkey).map_err(|_| libc::EBUSY)?;
                f.objs.remove(&c.mr_handle);
                Ok(())
            }
            (false, IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL) => {
                let _ = call.request::<ib_uverbs_create_comp_channel>();
                let fd = events::create(8)?;
                f.add(Obj::Channel(fd));
                call.respond::<_, ()>(&ib_uverbs_create_comp_channel_resp { fd: fd as u32 }, None)
            }
            (false, IB_USER_VERBS_CMD_CREATE_CQ) => {
                let (c, udata) = call.request::<ib_uverbs_create_cq>();
                let spec = (c.cqe, c.comp_channel, c.user_handle);
                create_cq(nic, f, &call, spec, udata)
            }
            (true, IB_USER_VERBS_EX_CMD_CREATE_CQ) => {
                let (c, udata) = call.request::<ib_uverbs_ex_create_cq>();
                if c.flags != 0 {
                    // Completion timestamps and the like: not modelled.
                    return Err(libc::EOPNOTSUPP);
                }
                let spec = (c.cqe, c.comp_channel, c.user_handle);
                create_cq(nic, f, &call, spec, udata)
            }
            (false, IB_USER_VERBS_CMD_DESTROY_CQ) => {
                let (c, _) = call.request::<ib_uverbs_destroy_cq>();
                let Some(Obj::Cq(cq)) = f.objs.get(&c.cq_handle) else {
                    return Err(libc::EINVAL);
                };
                let (cqn, channel) = (cq.cqn, cq.channel);
                nic.destroy_cq(cqn).map_err(|_| libc::EBUSY)?;
                f.objs.remove(&c.cq_handle);
                f.cq_handles.remove(&cqn);
                let resp = ib_uverbs_destroy_cq_resp {
                    comp_events_reported: channel
                        .map_or(0, |fd| events::reported(fd, Subject::Cq(cqn))),
                    async_events_reported: f
                        .async_fd
                        .map_or(0, |fd| events::reported(fd, Subject::Cq(cqn))),
                };
                call.respond::<_, ()>(&resp, None)
            }
            (false, IB_USER_VERBS_CMD_ALLOC_MW) => {
                let (c, _) = call.request::<ib_uverbs_alloc_mw>();
                let Some(Obj::Pd(pdn)) = f.objs.get(&c.pd_handle) else {
                    return Err(libc::EINVAL);
                };
                let kind = match c.mw_type {
                    1 => MwType::One,
                    2 => MwType::Two,
                    _ => return Err(libc::EINVAL),
                };
                let rkey = nic.alloc_mw(*pdn, kind).map_err(|_| libc::ENOMEM)?;
                let h = f.add(Obj::Mw(rkey));
                let resp = ib_uverbs_alloc_mw_resp {
                    mw_handle: h,
                    rkey,
                    ..Default::default()
                };
                call.respond::<_, ()>(&resp, None)
            }
            (false, IB_USER_VERBS_CMD_DEALLOC_MW) => {
                let (c, _) = call.request::<ib_uverbs_dealloc_mw>();
                let Some(Obj::Mw(rkey)) = f.objs.get(&c.mw_handle) else {
                    return Err(libc::EINVAL);
                };
                nic.dealloc_mw(*rkey).map_err(|_| libc::EBUSY)?;
                f.objs.remove(&c.mw_handle);
                Ok(())
            }
            (false, IB_USER_VERBS_CMD_ATTACH_MCAST) => {
                let (c, _) = call.request::<ib_uverbs_attach_mcast>();
                let Some(Obj::Qp(q)) = f.objs.get(&c.qp_handle) else {
                    return Err(libc::EINVAL);
                };
                nic.attach_mcast(q.qpn, c.gid, c.mlid)
                    .map_err(|_| libc::EINVAL)
            }
            (false, IB_USER_VERBS_CMD_DETACH_MCAST) => {
                let (c, _) = call.request::<ib_uverbs_detach_mcast>();
                let Some(Obj::Qp(q)) = f.objs.get(&c.qp_handle) else {
                    return Err(libc::EINVAL);
                };
                nic.detach_mcast(q.qpn, c.gid, c.mlid)
                    .map_err(|_| libc::EINVAL)
            }
            (false, IB_USER_VERBS_CMD_CREATE_SRQ) => create_srq(nic, f, &mut call),
            (false, IB_USER_VERBS_CMD_MODIFY_SRQ) => {
                let (c, _) = call.request::<ib_uverbs_modify_srq>();
                let Some(Obj::Srq(s)) = f.objs.get(&c.srq_handle) else {
                    return Err(libc::EINVAL);
                };
                // IB_SRQ_LIMIT only (`mlx5_ib_modify_srq` refuses resizing: EINVAL).
                if c.attr_mask != 1 << 1 {
                    return Err(libc::EINVAL);
                }
                nic.arm_srq_limit(s.srqn, c.srq_limit)
                    .map_err(|_| libc::EINVAL)
            }
            (false, IB_USER_VERBS_CMD_DESTROY_SRQ) => {
                let (c, _) = call.request::<ib_uverbs_destroy_srq>();
                let Some(Obj::Srq(s)) = f.objs.get(&c.srq_handle) else {
                    return Err(libc::EINVAL);
                };
                let srqn = s.srqn;
                nic.destroy_srq(srqn).map_err(|_| libc::EBUSY)?;
                f.objs.remove(&c.srq_handle);
                let resp = ib_uverbs_destroy_srq_resp {
                    events_reported: f
                        .async_fd
                        .map_or(0, |fd| events::reported(fd, Subject::Srq(srqn))),
                };
                call.respond::<_, ()>(&resp, None)
            }
            (false, IB_USER_VERBS_CMD_CREATE_QP) => {
                let (c, udata) = call.request::<ib_uverbs_create_qp>();
                let spec = qp_spec!(c, 0);
                create_qp(nic, f, &call, spec, udata)
            }
            (true, IB_USER_VERBS_EX_CMD_CREATE_QP) => {
                let (c, udata) = call.request::<ib_uverbs_ex_create_qp>();
                if c.create_flags & !BLOCK_MCAST_LOOPBACK != 0 || c.comp_mask != 0 {
                    return Err(libc::EOPNOTSUPP);
                }
                let spec = qp_spec!(c, c.create_flags);
                create_qp(nic, f, &call, spec, udata)
            }
            (false, IB_USER_VERBS_CMD_MODIFY_QP) => {
                let (c, _) = call.request::<ib_uverbs_modify_qp>();
                modify_qp(nic, f, &qps, &c).map(drop)
            }
            (true, IB_USER_VERBS_EX_CMD_MODIFY_QP) => {
                let (c, _) = call.request::<ib_uverbs_ex_modify_qp>();
                let dctn = modify_qp(nic, f, &qps, &c.base)?;
                let resp = ib_uverbs_ex_modify_qp_resp {
                    response_length: core::mem::size_of::<ib_uverbs_ex_modify_qp_resp>() as u32,
                    ..Default::default()
                };
                let drv = mlx5_ib_modify_qp_resp {
                    response_length: core::mem::size_of::<mlx5_ib_modify_qp_resp>() as u32,
                    dctn: dctn.unwrap_or(0),
                    ..Default::default()
                };
                call.respond(&resp, Some(&drv))
            }
            (false, IB_USER_VERBS_CMD_DESTROY_QP) => {
                let (c, _) = call.request::<ib_uverbs_destroy_qp>();
                let Some(Obj::Qp(q)) = f.objs.get(&c.qp_handle) else {
                    return Err(libc::EINVAL);
                };
                let (qpn, bfreg) = (q.qpn, q.bfreg);
                if crate::cmd::trace() {
                    eprintln!(
                        "kernel-model: destroying QP {qpn:#x} ({:?}, peer {:?}): {:?} {:?}",
                        q.state,
                        q.dest,
                        nic.qp_state(qpn),
                        nic.qp_stats(qpn)
                    );
                }
                let unmade = matches!(q.dc, Some(Dc::Target { made: false, .. }));
                if !unmade {
                    nic.destroy_qp(qpn).map_err(|_| libc::EINVAL)?;
                }
                if let (false, b) = bfreg {
                    f.bfreg_count[b as usize] -= 1;
                }
                let qpn = if unmade { u32::MAX } else { qpn };
                f.objs.remove(&c.qp_handle);
                let resp = ib_uverbs_destroy_qp_resp {
                    events_reported: f
                        .async_fd
                        .map_or(0, |fd| events::reported(fd, Subject::Qp(qpn))),
                };
                call.respond::<_, ()>(&resp, None)
            }
            _ => Err(libc::EOPNOTSUPP),
        }
    }
}

impl File {
    fn add(&mut self, o: Obj) -> u32 {
        let h = self.next_handle;
        self.next_handle += 1;
        self.objs.insert(h, o);
        h
    }
}

/// `GET_CONTEXT`: `mlx5_ib_alloc_ucontext`. The model is a kernel without dynamic UARs
/// (`MLX5_LIB_CAP_DYN_UAR` not honoured): the bfregs are allocated with the context
/// (`calc_total_bfregs` rounds them to whole UAR pages) and the provider maps their pages
/// (`mlx5_set_context` -> `mlx5_mmap`); without 4K UARs, one bfreg pair per page.
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn get_context(f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    if f.ucontext {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    let (_, udata) = unsafe { call.request::<ib_uverbs_get_context>() };
    // SAFETY: a plain ABI struct.
    let req: mlx5_ib_alloc_ucontext_req_v2 = unsafe { crate::cmd::read(udata) };
    // `calc_total_bfregs`: whole pages, at most MLX5_MAX_BFREGS; low latency ones leave
    // at least one medium bfreg besides bfreg 0.
    let tot = req.total_num_bfregs.div_ceil(BFREGS_PER_PAGE) * BFREGS_PER_PAGE;
    if tot == 0 || tot > 512 || req.num_low_latency_bfregs > tot - 1 {
        return Err(libc::EINVAL);
    }
    let fd = events::create(core::mem::size_of::<ib_uverbs_async_event_desc>())?;
    f.async_fd = Some(fd);
    f.tot_bfregs = tot;
    f.low_lat = req.num_low_latency_bfregs;
    f.bfreg_count = vec![0; tot as usize];
    f.ucontext = true;
    let resp = ib_uverbs_get_context_resp {
        async_fd: fd as u32,
        num_comp_vectors: 1,
        ..Default::default()
    };
    let drv = mlx5_ib_alloc_ucontext_resp {
        qp_tab_size: 1 << 18,
        bf_reg_size: BF_REG_SIZE,
        tot_bfregs: tot,
        cache_line_size: 64,
        max_sq_desc_sz: MAX_SQ_DESC,
        max_rq_desc_sz: MAX_RQ_DESC,
        max_send_wqebb: MAX_WR,
        max_recv_wr: MAX_WR,
        max_srq_recv_wr: MAX_WR,
        num_ports: 1,
        response_length: core::mem::size_of::<mlx5_ib_alloc_ucontext_resp>() as u32,
        // CQE version 0: completions name their QP by number, not by user index.
        cqe_version: 0,
        // The driver data `mlx5_ib` takes in QUERY_DEVICE and CREATE_AH.
        cmds_supp_uhw: (MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE | MLX5_USER_CMDS_SUPP_UHW_CREATE_AH)
            as u8,
        log_uar_size: 12,
        num_uars_per_page: 1,
        num_dyn_bfregs: DYN_BFREGS,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// The device's attributes (`mlx5_ib_query_device`), a ConnectX-6 as the NIC models it.
fn device_attr() -> abi::ib_uverbs_query_device_resp {
    abi::ib_uverbs_query_device_resp {
        fw_ver: (20 << 32) | (39 << 16) | 1002,
        node_guid: crate::sysfs::NODE_GUID.to_be(),
        sys_image_guid: crate::sysfs::NODE_GUID.to_be(),
        max_mr_size: u64::MAX,
        page_size_cap: !0xfff,
        vendor_id: 0x02c9,
        vendor_part_id: 0x101b,
        hw_ver: 0,
        max_qp: 1 << 18,
        max_qp_wr: MAX_WR,
        // RESIZE_MAX_WR | BAD_PKEY_CNTR | BAD_QKEY_CNTR | CHANGE_PHY_PORT | RC_RNR_NAK_GEN
        // | PORT_ACTIVE_EVENT | SYS_IMAGE_GUID | MEM_WINDOW | MEM_MGT_EXTENSIONS
        device_cap_flags: 1
            | 1 << 1
            | 1 << 2
            | 1 << 5
            | 1 << 12
            | 1 << 14
            | 1 << 11
            | 1 << 17
            | 1 << 21,
        max_sge: MAX_SGE,
        max_sge_rd: MAX_SGE,
        max_cq: 1 << 24,
        max_cqe: (1 << 22) - 1,
        max_mr: 1 << 24,
        max_pd: 1 << 24,
        max_qp_rd_atom: 16,
        max_res_rd_atom: 16 << 18,
        max_qp_init_rd_atom: 16,
        // IBV_ATOMIC_HCA
        atomic_cap: 1,
        max_mw: 1 << 24,
        max_mcast_grp: 1 << 21,
        max_mcast_qp_attach: 240,
        max_total_mcast_qp_attach: 240 << 21,
        max_ah: i32::MAX as u32,
        max_srq: 1 << 23,
        max_srq_wr: MAX_WR - 1,
        max_srq_sge: 31,
        max_pkeys: 128,
        local_ca_ack_delay: 16,
        phys_port_cnt: 1,
        ..Default::default()
    }
}

/// `EX_QUERY_DEVICE`: the attributes, no on-demand paging (the model has no page faults),
/// no timestamps; the mlx5 part names CQE compression as the NIC offers it.
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn query_device_ex(nic: &Nic, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let _ = unsafe { call.request::<ib_uverbs_ex_query_device>() };
    let base = device_attr();
    let resp = ib_uverbs_ex_query_device_resp {
        device_cap_flags_ex: base.device_cap_flags as u64,
        base,
        response_length: core::mem::size_of::<ib_uverbs_ex_query_device_resp>() as u32,
        ..Default::default()
    };
    let caps = nic.cqe_comp_caps();
    let drv = mlx5_ib_query_device_resp {
        response_length: core::mem::size_of::<mlx5_ib_query_device_resp>() as u32,
        comp_mask: 1, // MLX5_IB_QUERY_DEV_RESP_MASK_CQE_COMP
        cqe_comp_caps: mlx5_ib_cqe_comp_caps {
            max_num: caps.max_num,
            supported_format: caps.supported_format,
        },
        // MLX5_IB_QUERY_DEV_RESP_FLAGS_CQE_128B_COMP as the NIC compresses, and
        // _SCAT2CQE_DCT: DC targets take the provider's scatter-to-CQE flag.
        flags: u32::from(caps.cqe_128) | MLX5_IB_QUERY_DEV_RESP_FLAGS_SCAT2CQE_DCT,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// `QUERY_PORT`: one active InfiniBand port with the NIC's LID and MTU.
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn query_port(nic: &Nic, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_query_port>() };
    if c.port_num != 1 {
        return Err(libc::EINVAL);
    }
    let mtu = match nic.port_attr().mtu {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    };
    let resp = ib_uverbs_query_port_resp {
        port_cap_flags: 0x2651_e848,
        max_msg_sz: 1 << 30,
        gid_tbl_len: 1,
        pkey_tbl_len: 128,
        lid: PORT_LID,
        sm_lid: PORT_LID,
        state: 4, // IBV_PORT_ACTIVE
        max_mtu: 5,
        active_mtu: mtu,
        max_vl_num: 4,
        active_width: 2,
        active_speed: 64,
        phys_state: 5,
        link_layer: 1, // IBV_LINK_LAYER_INFINIBAND
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}

/// `REG_MR`: the user's memory, registered where it is (`mlx5_ib_reg_user_mr`; the model
/// needs iova = address, what `ibv_reg_mr` asks).
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn reg_mr(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let (c, _) = unsafe { call.request::<ib_uverbs_reg_mr>() };
    let Some(Obj::Pd(pdn)) = f.objs.get(&c.pd_handle) else {
        return Err(libc::EINVAL);
    };
    if c.hca_va != c.start {
        return Err(libc::EOPNOTSUPP);
    }
    let access = Access(c.access_flags);
    if access.0 & 0x40 != 0 {
        // IBV_ACCESS_ON_DEMAND: the model takes no page faults.
        return Err(libc::EOPNOTSUPP);
    }
    let len = usize::try_from(c.length).map_err(|_| libc::EINVAL)?;
    // SAFETY: the user's memory: the kernel pins it (`ib_umem_get`); here the process keeps
    // it mapped until it deregisters the region, as `ibv_reg_mr`'s contract asks.
    let mr =
        unsafe { nic.reg_mr(*pdn, c.start as *mut u8, len, access) }.map_err(|_| libc::EINVAL)?;
    let h = f.add(Obj::Mr(mr.lkey));
    let resp = ib_uverbs_reg_mr_resp {
        mr_handle: h,
        lkey: mr.lkey,
        rkey: mr.rkey,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond::<_, ()>(&resp, None) }
}

/// `CREATE_CQ`: `mlx5_ib_create_cq` -> `create_cq_user`: the provider's ring and record
/// (`buf_addr`, `db_addr`), `entries = roundup_pow_of_two(cqe + 1)`, the CQE size and
/// compression it asks for, armed through the UAR page it names (`uar_page_index`).
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn create_cq(
    nic: &Nic,
    f: &mut File,
    call: &Call<'_>,
    (cqe, channel, user): (u32, i32, u64),
    udata: &[u8],
) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: a plain ABI struct.
    let u: mlx5_ib_create_cq = unsafe { crate::cmd::read(udata) };
    if udata.len() < core::mem::size_of::<mlx5_ib_create_cq>() || u.flags != 0 {
        return Err(libc::EINVAL);
    }
    let entries = cqe
        .checked_add(1)
        .and_then(u32::checked_next_power_of_two)
        .ok_or(libc::EINVAL)?;
    if entries > 1 << 22 || !(u.cqe_size == 64 || u.cqe_size == 128) {
        return Err(libc::EINVAL);
    }
    let page = f
        .pages
        .get(&(false, u32::from(u.uar_page_index)))
        .copied()
        .ok_or(libc::EINVAL)?;
    let mem = HostCq {
        buf: u.buf_addr as *mut u8,
        dbrec: u.db_addr as *mut u32,
        uar: page as *mut u8,
    };
    // SAFETY: the provider's ring of entries * cqe_size bytes and its record, which it
    // frees only after DESTROY_CQ; the UAR page is mapped for the file's life.
    let raw = unsafe { nic.create_cq_at(entries, u.cqe_size, mem) }.map_err(|_| libc::EINVAL)?;
    if u.cqe_comp_en != 0 {
        let format = match u.cqe_comp_res_format {
            1 => mlx5::cqe::MiniCqeFormat::Hash,
            2 => mlx5::cqe::MiniCqeFormat::Csum,
            4 => mlx5::cqe::MiniCqeFormat::CsumStridx,
            _ => {
                let _ = nic.destroy_cq(raw.cqn);
                return Err(libc::EINVAL);
            }
        };
        if nic.compress_cq(raw.cqn, format).is_err() {
            let _ = nic.destroy_cq(raw.cqn);
            return Err(libc::EOPNOTSUPP);
        }
    }
    let channel = if channel >= 0 {
        if !f
            .objs
            .values()
            .any(|o| matches!(o, Obj::Channel(c) if *c == channel))
        {
            let _ = nic.destroy_cq(raw.cqn);
            return Err(libc::EINVAL);
        }
        let sink = std::sync::Arc::new(ChannelSink { fd: channel, user });
        let _ = nic.set_cq_event_sink(raw.cqn, Some(sink));
        Some(channel)
    } else {
        None
    };
    f.cq_handles.insert(raw.cqn, user);
    let h = f.add(Obj::Cq(Cq {
        cqn: raw.cqn,
        channel,
    }));
    let resp = ib_uverbs_create_cq_resp {
        cq_handle: h,
        cqe: entries - 1,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe {
        call.respond(
            &resp,
            Some(&mlx5_ib_create_cq_resp {
                cqn: raw.cqn,
                reserved: 0,
            }),
        )
    }
}

/// `CREATE_SRQ`: `mlx5_ib_create_srq` -> `create_srq_user`: the provider's ring and
/// record, `max = roundup_pow_of_two(max_wr + 1)` entries of
/// `roundup_pow_of_two(16 + 16 * max_sge)` bytes (at least 32), as the provider sized them.
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn create_srq(nic: &Nic, f: &mut File, call: &mut Call<'_>) -> Result<(), c_int> {
    use abi::*;
    // SAFETY: the caller's contract.
    let (c, udata) = unsafe { call.request::<ib_uverbs_create_srq>() };
    // SAFETY: a plain ABI struct.
    let u: mlx5_ib_create_srq = unsafe { crate::cmd::read(udata) };
    if udata.len() < core::mem::size_of::<mlx5_ib_create_srq>() || u.flags != 0 {
        return Err(libc::EINVAL);
    }
    let Some(Obj::Pd(pdn)) = f.objs.get(&c.pd_handle) else {
        return Err(libc::EINVAL);
    };
    let caps = SrqCaps {
        max_wr: c.max_wr,
        max_sge: c.max_sge,
    };
    let mem = HostSrq {
        buf: u.buf_addr as *mut u8,
        dbrec: u.db_addr as *mut u32,
    };
    // SAFETY: the provider's ring and record, freed only after DESTROY_SRQ.
    let raw = unsafe { nic.create_srq_at(*pdn, caps, mem) }.map_err(|_| libc::EINVAL)?;
    if c.srq_limit != 0 && nic.arm_srq_limit(raw.srqn, c.srq_limit).is_err() {
        let _ = nic.destroy_srq(raw.srqn);
        return Err(libc::EINVAL);
    }
    let h = f.add(Obj::Srq(Srq {
        srqn: raw.srqn,
        user: c.user_handle,
    }));
    let resp = ib_uverbs_create_srq_resp {
        srq_handle: h,
        max_wr: raw.wqe_cnt - 1,
        max_sge: raw.max_sge,
        srqn: raw.srqn,
        ..Default::default()
    };
    let drv = mlx5_ib_create_srq_resp {
        srqn: raw.srqn,
        reserved: 0,
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// The [`QpSpec`] of a `CREATE_QP` or `EX_CREATE_QP` command struct (their fields share
/// names), with `create_flags`.
macro_rules! qp_spec {
    ($c:expr, $flags:expr) => {
        QpSpec {
            create_flags: $flags,
            user: $c.user_handle,
            pd: $c.pd_handle,
            send_cq: $c.send_cq_handle,
            recv_cq: $c.recv_cq_handle,
            srq: ($c.is_srq != 0).then_some($c.srq_handle),
            max_send_sge: $c.max_send_sge,
            max_inline: $c.max_inline_data,
            qp_type: $c.qp_type,
        }
    };
}
use qp_spec;

/// What `CREATE_QP` and its extended form share.
struct QpSpec {
    create_flags: u32,
    user: u64,
    pd: u32,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    max_send_sge: u32,
    max_inline: u32,
    qp_type: u8,
}

/// `CREATE_QP`: `mlx5_ib_create_qp` -> `create_user_qp`: the provider's buffer (receive
/// ring at 0, send ring after `rq_wqe_count << rq_wqe_shift` bytes), its record, a bfreg
/// from the context's classes (`alloc_bfreg`: a free low-latency one, else the least used
/// medium one; bfreg 0 has no BlueFlame), and responder scatter-to-CQE when the provider
/// asks (`MLX5_QP_FLAG_SCATTER_CQE`; `configure_responder_scat_cqe`: RC only here).
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn create_qp(
    nic: &Nic,
    f: &mut File,
    call: &Call<'_>,
    s: QpSpec,
    udata: &[u8],
) -> Result<(), c_int> {
    use abi::*;
    if ![QPT_RC, QPT_UD, QPT_DRIVER].contains(&s.qp_type) {
        return Err(libc::EOPNOTSUPP);
    }
    let ud = (s.qp_type == QPT_UD).then_some(Ud {
        qkey: None,
        mcast_loopback: s.create_flags & BLOCK_MCAST_LOOPBACK == 0,
    });
    // SAFETY: a plain ABI struct.
    let u: mlx5_ib_create_qp = unsafe { crate::cmd::read(udata) };
    if udata.len() < 48 {
        return Err(libc::EINVAL);
    }
    let dc_flags = MLX5_QP_FLAG_TYPE_DCI | MLX5_QP_FLAG_TYPE_DCT;
    let known = MLX5_QP_FLAG_SCATTER_CQE | MLX5_QP_FLAG_BFREG_INDEX | dc_flags;
    if u.flags & !known != 0 || (s.qp_type == QPT_DRIVER) != (u.flags & dc_flags != 0) {
        return Err(libc::EOPNOTSUPP);
    }
    if u.flags & MLX5_QP_FLAG_TYPE_DCT != 0 {
        // SAFETY: the caller's contract.
        return unsafe { create_dct(f, call, &s, &u) };
    }
    let dci = u.flags & MLX5_QP_FLAG_TYPE_DCI != 0;
    let pow2 = |n: u32| n == 0 || n.is_power_of_two();
    if !pow2(u.sq_wqe_count)
        || !pow2(u.rq_wqe_count)
        || u.sq_wqe_count == 0
        || u.sq_wqe_count > MAX_WR
        || u.rq_wqe_count > MAX_WR
        || (u.rq_wqe_count != 0 && !(4..=9).contains(&u.rq_wqe_shift))
    {
        return Err(libc::EINVAL);
    }
    let Some(Obj::Pd(pd)) = f.objs.get(&s.pd) else {
        return Err(libc::EINVAL);
    };
    let (Some(Obj::Cq(scq)), Some(Obj::Cq(rcq))) = (f.objs.get(&s.send_cq), f.objs.get(&s.recv_cq))
    else {
        return Err(libc::EINVAL);
    };
    let (pd, scq, rcq) = (*pd, scq.cqn, rcq.cqn);
    let srqn = match s.srq.map(|h| f.objs.get(&h)) {
        None => None,
        Some(Some(Obj::Srq(q))) if u.rq_wqe_count == 0 => Some(q.srqn),
        Some(_) => return Err(libc::EINVAL),
    };
    // The QP's bfreg: the provider's dynamic one (a thread domain's: `bfregn_to_uar_index`
    // with `dyn_bfreg`), else one of the context's (`alloc_bfreg`).
    let (dynamic, bfreg) = if u.flags & MLX5_QP_FLAG_BFREG_INDEX != 0 {
        if u.bfreg_index >= DYN_BFREGS {
            return Err(libc::EINVAL);
        }
        (true, u.bfreg_index)
    } else {
        (false, alloc_bfreg(f))
    };
    let release = |f: &mut File| {
        if !dynamic {
            f.bfreg_count[bfreg as usize] -= 1;
        }
    };
    let Some(page) = f.pages.get(&(dynamic, bfreg / BFREGS_PER_PAGE)).copied() else {
        release(f);
        return Err(libc::EINVAL);
    };
    let bf_reg = page + BF_OFFSET + (bfreg % BFREGS_PER_PAGE) as usize * BF_REG_SIZE as usize;
    let caps = QpCaps {
        sq_blocks: u.sq_wqe_count,
        rq_entries: u.rq_wqe_count,
        max_send_sge: s.max_send_sge.min(60),
        max_recv_sge: if u.rq_wqe_count == 0 {
            0
        } else {
            (1 << u.rq_wqe_shift) / 16
        },
        max_inline: s.max_inline.min(960),
        bf_size: if !dynamic && bfreg == 0 {
            0
        } else {
            BF_REG_SIZE / 2
        },
        // `configure_responder_scat_cqe`: RC only (UD receives carry a GRH).
        scatter_to_cqe: ud.is_none() && u.flags & MLX5_QP_FLAG_SCATTER_CQE != 0,
        ..QpCaps::default()
    };
    let rq_bytes = if u.rq_wqe_count == 0 {
        0
    } else {
        (u.rq_wqe_count as usize) << u.rq_wqe_shift
    };
    let mem = HostQp {
        sq: (u.buf_addr as usize + rq_bytes) as *mut u8,
        rq: u.buf_addr as *mut u8,
        dbrec: u.db_addr as *mut u32,
        bf_reg: bf_reg as *mut u8,
    };
    // SAFETY: the provider's buffer of both rings and its record, freed only after
    // DESTROY_QP; the register lies in a UAR page mapped for the file's life.
    let made = unsafe {
        if dci {
            nic.create_dci_at(pd, scq, caps, mem)
        } else {
            nic.create_qp_at(pd, scq, rcq, caps, mem)
        }
    };
    let raw = match made {
        Ok(r) => r,
        Err(_) => {
            release(f);
            return Err(libc::EINVAL);
        }
    };
    if let Some(srqn) = srqn {
        if nic.attach_qp_srq(raw.qpn, srqn).is_err() {
            let _ = nic.destroy_qp(raw.qpn);
            release(f);
            return Err(libc::EINVAL);
        }
    }
    let h = f.add(Obj::Qp(Box::new(Qp {
        qpn: raw.qpn,
        user: s.user,
        state: QpState::Reset,
        dest: None,
        timing: QpTiming::default(),
        bfreg: (dynamic, bfreg),
        scatter: caps.scatter_to_cqe && !dci,
        ud,
        dc: dci.then_some(Dc::Initiator),
    })));
    let resp = ib_uverbs_create_qp_resp {
        qp_handle: h,
        qpn: raw.qpn,
        max_send_wr: u.sq_wqe_count,
        max_recv_wr: u.rq_wqe_count,
        max_send_sge: s.max_send_sge,
        max_recv_sge: caps.max_recv_sge,
        max_inline_data: s.max_inline,
        ..Default::default()
    };
    let drv = mlx5_ib_create_qp_resp {
        bfreg_index: bfreg,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&drv)) }
}

/// `CREATE_QP` of a DC target (`mlx5_ib_create_dct`): nothing on the device yet, its
/// attributes kept for RTR; no rings (the provider allocates none), number 0 until then.
///
/// # Safety
/// As [`command`]'s calls.
unsafe fn create_dct(
    f: &mut File,
    call: &Call<'_>,
    s: &QpSpec,
    u: &abi::mlx5_ib_create_qp,
) -> Result<(), c_int> {
    use abi::*;
    let Some(Obj::Pd(pd)) = f.objs.get(&s.pd) else {
        return Err(libc::EINVAL);
    };
    let Some(Obj::Cq(cq)) = f.objs.get(&s.recv_cq) else {
        return Err(libc::EINVAL);
    };
    let srq = match s.srq.map(|h| f.objs.get(&h)) {
        None => None,
        Some(Some(Obj::Srq(q))) => Some(q.srqn),
        Some(_) => return Err(libc::EINVAL),
    };
    // SAFETY: `access_key` is the union's member for a DCT.
    let key = unsafe { u.__bindgen_anon_1.access_key };
    let dc = Dc::Target {
        pd: *pd,
        cq: cq.cqn,
        srq,
        key,
        scatter: u.flags & MLX5_QP_FLAG_SCATTER_CQE != 0,
        access: 0,
        made: false,
    };
    let h = f.add(Obj::Qp(Box::new(Qp {
        qpn: 0,
        user: s.user,
        state: QpState::Reset,
        dest: None,
        timing: QpTiming::default(),
        bfreg: (true, u32::MAX),
        scatter: false,
        ud: None,
        dc: Some(dc),
    })));
    let resp = ib_uverbs_create_qp_resp {
        qp_handle: h,
        ..Default::default()
    };
    // SAFETY: the caller's contract.
    unsafe { call.respond(&resp, Some(&mlx5_ib_create_qp_resp::default())) }
}

/// `alloc_bfreg` (`qp.c`): a free low-latency bfreg (the last `low_lat` of the non-zero
/// ones, one QP each), else the least used medium one (bfregs 1 .. first low-latency),
/// else bfreg 0.
fn alloc_bfreg(f: &mut File) -> u32 {
    let tot = f.tot_bfregs;
    let first_hi = tot - f.low_lat;
    let hi = (first_hi..tot).find(|&i| f.bfreg_count[i as usize] == 0);
    let med = || (1..first_hi).min_by_key(|&i| f.bfreg_count[i as usize]);
    let b = hi.or_else(med).unwrap_or(0);
    f.bfreg_count[b as usize] += 1;
    b
}

/// `MODIFY_QP`: the verbs state machine (`ib_modify_qp_is_ok`), the transport timers at
/// RTR/RTS, and the connection: when both ends of an RC pair have named each other (the
/// second reaching RTR), the NIC connects them.
fn modify_qp(
    nic: &Nic,
    f: &mut File,
    qps: &[(u32, Option<u32>, QpState)],
    c: &abi::ib_uverbs_modify_qp,
) -> Result<Option<u32>, c_int> {
    let Some(Obj::Qp(q)) = f.objs.get_mut(&c.qp_handle) else {
        return Err(libc::EINVAL);
    };
    let m = c.attr_mask;
    let to = if m & mask::STATE != 0 {
        QpState::from_abi(c.qp_state).ok_or(libc::EINVAL)?
    } else {
        q.state
    };
    use QpState::*;
    let ok = matches!(
        (q.state, to),
        (_, Reset | Error)
            | (Reset, Init)
            | (Init, Init | Rtr)
            | (Rtr, Rts)
            | (Rts, Rts | Sqd)
            | (Sqd, Sqd | Rts)
            | (Sqe, Rts)
    );
    if !ok {
        return Err(libc::EINVAL);
    }
    if m & mask::TIMEOUT != 0 {
        q.timing.timeout = c.timeout;
    }
    if m & mask::RETRY_CNT != 0 {
        q.timing.retry_cnt = c.retry_cnt;
    }
    if m & mask::RNR_RETRY != 0 {
        q.timing.rnr_retry = c.rnr_retry;
    }
    if m & mask::MIN_RNR_TIMER != 0 {
        q.timing.min_rnr_timer = c.min_rnr_timer;
    }
    if let Some(dc) = &mut q.dc {
        // DC: no destination; a target's rights at INIT, the target made at RTR, an
        // initiator ready at RTS (`mlx5_ib_modify_dct`, `modify_qp` of a DCI).
        if let Dc::Target { access, .. } = dc {
            if m & mask::ACCESS_FLAGS != 0 {
                *access = c.qp_access_flags;
            }
        }
        let from = std::mem::replace(&mut q.state, to);
        return match (*dc, from, to) {
            (
                Dc::Target {
                    pd,
                    cq,
                    srq,
                    key,
                    scatter,
                    access,
                    made: false,
                },
                Init,
                Rtr,
            ) => {
                let made = nic.create_dct(pd, cq, srq, key, Access(access));
                let dctn = made.map_err(|_| {
                    q.state = from;
                    libc::EINVAL
                })?;
                let _ = nic.set_dct_scatter_to_cqe(dctn, scatter);
                q.qpn = dctn;
                if let Some(Dc::Target { made, .. }) = &mut q.dc {
                    *made = true;
                }
                Ok(Some(dctn))
            }
            (Dc::Initiator, Rtr, Rts) => {
                nic.dci_ready(q.qpn, q.timing).map_err(|_| {
                    q.state = from;
                    libc::EINVAL
                })?;
                Ok(None)
            }
            (_, _, Error) if q.qpn != 0 => {
                nic.set_error(q.qpn).map_err(|_| libc::EINVAL)?;
                Ok(None)
            }
            _ => Ok(None),
        };
    }
    if let Some(ud) = &mut q.ud {
        // UD: the Q_Key at INIT (or later), no destination (`ib_modify_qp_is_ok`'s
        // attribute table for IB_QPT_UD).
        if m & mask::QKEY != 0 {
            ud.qkey = Some(c.qkey);
        }
        if to == Init && ud.qkey.is_none() {
            return Err(libc::EINVAL);
        }
    } else if to == Rtr {
        if m & mask::DEST_QPN == 0 {
            return Err(libc::EINVAL);
        }
        q.dest = Some(c.dest_qp_num & 0xff_ffff);
    }
    let (qpn, dest, timing, ud) = (q.qpn, q.dest, q.timing, q.ud);
    match to {
        Error => nic.set_error(qpn).map_err(|_| libc::EINVAL)?,
        Reset if q.state != Reset => return Err(libc::EOPNOTSUPP),
        Rtr | Rts => {
            nic.set_timing(qpn, timing).map_err(|_| libc::EINVAL)?;
        }
        _ => {}
    }
    let from = std::mem::replace(&mut q.state, to);
    if let Some(ud) = ud {
        // The NIC runs a UD QP from RTR on (it receives there; its sends wait for RTS in
        // the provider, whose send path is an error stub until then).
        if to == Rtr && from == Init {
            let qkey = ud.qkey.ok_or(libc::EINVAL)?;
            nic.make_ud(qpn, qkey, ud.mcast_loopback)
                .map_err(|_| libc::EINVAL)?;
        }
        return Ok(None);
    }
    if to == Rtr {
        let dest = dest.expect("set above");
        // The peer is ready when it reached RTR naming this QP (or it is this QP).
        let peer_ready = dest == qpn
            || qps
                .iter()
                .any(|&(n, d, state)| n == dest && d == Some(qpn) && matches!(state, Rtr | Rts));
        if peer_ready {
            nic.connect(qpn, dest).map_err(|_| libc::EINVAL)?;
        }
    }
    Ok(None)
}

/// What the model decided for QP `qpn`: its bfreg (dynamic, index) and responder
/// scatter-to-CQE; None for a QP no file has.
pub(crate) fn qp_view(qpn: u32) -> Option<((bool, u32), bool)> {
    let k = kernel();
    k.files.values().find_map(|f| {
        f.objs.values().find_map(|o| match o {
            Obj::Qp(q) if q.qpn == qpn => Some((q.bfreg, q.scatter)),
            _ => None,
        })
    })
}

/// The mini-CQE format CQ `cqn` compresses with (its bit), 0 without compression; None for
/// a CQ the NIC does not have.
pub(crate) fn cq_view(cqn: u32) -> Option<u32> {
    let k = kernel();
    k.nic.cq_arm_stats(cqn)?;
    Some(k.nic.cq_compression(cqn).map_or(0, |f| f.bit()))
}

/// Compressed sessions written to CQ `cqn` (None for a CQ the NIC does not have).
pub(crate) fn cq_sessions(cqn: u32) -> Option<u64> {
    let k = kernel();
    k.nic.cq_arm_stats(cqn)?;
    Some(k.nic.cq_sessions(cqn).0)
}
