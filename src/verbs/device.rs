//! Devices, ports and GIDs.

use super::{last, VerbsError};
use rdma_sys as ffi;
use std::ffi::CStr;

/// Names of the RDMA devices rdma-core sees (empty when there are none, or no rdma-core).
pub fn list() -> Vec<String> {
    let mut n = 0i32;
    // SAFETY: ibv_get_device_list writes the count and returns an array of `n` device
    // pointers (or null), freed below with ibv_free_device_list.
    let devs = unsafe { ffi::ibv_get_device_list(&mut n) };
    if devs.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: index below the count; ibv_get_device_name returns a NUL-terminated string
        // owned by the device, valid until the list is freed.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(*devs.add(i))) };
        out.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(devs) };
    out
}

/// An open device (`ibv_context`).
pub struct Context {
    pub(crate) ctx: *mut ffi::ibv_context,
    name: String,
    /// False for a context librdmacm opened (it closes it).
    owned: bool,
    /// Keeps the rdma_cm id (and so its context) alive for a borrowed context.
    pub(crate) _keep: Option<std::sync::Arc<dyn Send + Sync>>,
}

// SAFETY: an ibv_context is thread-safe in rdma-core (every verb on it may be called from any
// thread); this wrapper only hands out the pointer.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

/// What the data path needs to know of a port.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU as the verbs enum (1 = 256 ... 5 = 4096).
    pub active_mtu: u32,
    /// Whether the port is active.
    pub active: bool,
    /// GID table length.
    pub gid_tbl_len: i32,
    /// Link layer is Ethernet (RoCE).
    pub ethernet: bool,
    /// The largest message (`max_msg_sz`: a ConnectX-6 reports 2^30, rxe 2^23).
    pub max_msg_sz: u32,
}

/// What the crate needs of `ibv_device_attr`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttrs {
    /// `atomic_cap != IBV_ATOMIC_NONE`.
    pub atomic: bool,
    /// `max_qp_rd_atom`: reads and atomics a QP may have in flight as responder (the limit
    /// of `max_dest_rd_atomic`).
    pub max_qp_rd_atom: u8,
    /// `max_qp_init_rd_atom`: the same as requester (the limit of `max_rd_atomic`).
    pub max_qp_init_rd_atom: u8,
    /// `max_cqe`: the most entries a CQ may be asked for (a ConnectX reports
    /// `(1 << log_max_cq_sz) - 1`: rdma-core asks the kernel for one more, rounded up to a
    /// power of two).
    pub max_cqe: u32,
    /// The device is rxe (Soft-RoCE): its vendor id is `RXE_VENDOR_ID` (0xffffff,
    /// `drivers/infiniband/sw/rxe/rxe_param.h`), whatever name it was given.
    pub rxe: bool,
    /// On-demand paging (`ibv_query_device_ex`, `odp_caps`; none when the device does not
    /// answer the extended query).
    pub odp: OdpCaps,
    /// The completion clock (`ibv_query_device_ex`; none when the device does not answer
    /// the extended query).
    pub clock: ClockCaps,
}

/// A device's completion clock: `ibv_query_device_ex`'s `hca_core_clock` and
/// `completion_timestamp_mask` (both 0 on a device that stamps no completion, such as rxe).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct ClockCaps {
    /// The free-running counter's frequency in kHz.
    pub khz: u64,
    /// The bits of a completion timestamp that count.
    pub mask: u64,
}

impl ClockCaps {
    /// Whether the device stamps completions.
    pub fn present(&self) -> bool {
        self.khz != 0 && self.mask != 0
    }
}

/// What a device's on-demand paging does: `ibv_query_device_ex`'s `odp_caps` (the software
/// NIC reports its `mlx5::sim::MemoryCaps` in the same bits).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct OdpCaps {
    /// `general_caps`: `IBV_ODP_SUPPORT` (1), `IBV_ODP_SUPPORT_IMPLICIT` (2).
    pub general: u64,
    /// `per_transport_caps.rc_odp_caps`: `IBV_ODP_SUPPORT_SEND` (1), `_RECV` (2),
    /// `_WRITE` (4), `_READ` (8), `_ATOMIC` (16), `_SRQ_RECV` (32).
    pub rc: u32,
    /// `per_transport_caps.ud_odp_caps`, the same bits for UD QPs (the kernel's
    /// `mlx5_ib_internal_fill_odp_caps` gives a ConnectX's as SEND, and SRQ_RECV where the
    /// firmware has it: never RECV).
    pub ud: u32,
    /// The same bits for DC (mlx5 only: `mlx5dv_query_device`'s `dc_odp_caps`, which the
    /// kernel fills from the device's DC ODP capabilities; 0 where the device reports none).
    pub dc: u32,
}

impl OdpCaps {
    /// `IBV_ODP_SUPPORT`.
    pub const SUPPORT: u64 = ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT.0 as u64;
    /// `IBV_ODP_SUPPORT_IMPLICIT`.
    pub const IMPLICIT: u64 = ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT_IMPLICIT.0 as u64;
    /// What an RC QP of this crate does with a region: send, receive, write, read
    /// (`IBV_ODP_SUPPORT_SEND | _RECV | _WRITE | _READ`).
    pub const RC_BASIC: u32 = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SEND.0
        | ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_RECV.0
        | ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_WRITE.0
        | ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_READ.0;
    /// `IBV_ODP_SUPPORT_ATOMIC`.
    pub const RC_ATOMIC: u32 = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_ATOMIC.0;

    /// Whether an on-demand region can serve RC sends, receives, writes and reads (and
    /// atomics when `atomic`).
    pub fn rc(&self, atomic: bool) -> bool {
        let need = OdpCaps::RC_BASIC | if atomic { OdpCaps::RC_ATOMIC } else { 0 };
        self.general & OdpCaps::SUPPORT != 0 && self.rc & need == need
    }

    /// `IBV_ODP_SUPPORT_SEND`.
    pub const SEND: u32 = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SEND.0;
    /// `IBV_ODP_SUPPORT_RECV`.
    pub const RECV: u32 = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_RECV.0;

    /// `IBV_ODP_SUPPORT_SRQ_RECV`.
    pub const SRQ_RECV: u32 = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_SRQ_RECV.0;
    /// `IBV_ODP_SUPPORT_WRITE`.
    pub const WRITE: u32 = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_WRITE.0;
    /// `IBV_ODP_SUPPORT_READ`.
    pub const READ: u32 = ffi::ibv_odp_transport_cap_bits::IBV_ODP_SUPPORT_READ.0;

    /// Whether a DC initiator's requests of `need` (the `IBV_ODP_SUPPORT_*` bit of their
    /// operation: SEND, WRITE, READ, ATOMIC) may name on-demand regions locally.
    pub fn dc(&self, need: u32) -> bool {
        self.general & OdpCaps::SUPPORT != 0 && self.dc & need == need
    }

    /// Whether an SRQ whose receivers are RC QPs may take receives into an on-demand (or
    /// dma-buf) region: `IBV_ODP_SUPPORT_SRQ_RECV` in the RC bits (the kernel's
    /// `mlx5_ib_internal_fill_odp_caps`, from the firmware's `rc_odp_caps.srq_receive`).
    pub fn srq_recv(&self) -> bool {
        self.general & OdpCaps::SUPPORT != 0 && self.rc & OdpCaps::SRQ_RECV != 0
    }

    /// Whether a UD QP's receive queue may take receives into an on-demand region.
    pub fn ud_recv(&self) -> bool {
        self.general & OdpCaps::SUPPORT != 0 && self.ud & OdpCaps::RECV != 0
    }

    /// Whether the whole address space can be registered on demand (implicit ODP).
    pub fn implicit(&self) -> bool {
        self.general & (OdpCaps::SUPPORT | OdpCaps::IMPLICIT)
            == (OdpCaps::SUPPORT | OdpCaps::IMPLICIT)
    }
}

impl DeviceAttrs {
    /// The transport retry count to program for `want`: rxe (every kernel to date,
    /// `rxe_comp.c`, `COMPST_ERROR_RETRY`: `if (qp->comp.retry_cnt != 7) retry_cnt--`) takes
    /// 7 as "retry for ever", which the InfiniBand specification gives only to the RNR retry
    /// count: a request to a dead peer would never complete. On rxe 7 becomes 6, the
    /// longest finite count; elsewhere `want` is kept.
    pub fn retry_cnt_for(&self, want: u8) -> u8 {
        if want >= 7 && self.rxe {
            6
        } else {
            want
        }
    }

    /// The atomics of a device with these attributes, as the crate drives them: standard
    /// atomics as `atomic_cap` says; masked ones never (`struct ibv_device_attr` has no
    /// masked-atomic capability and the verbs path cannot post them); 8-byte replies in host
    /// order (Linux's mlx5 reports atomics only in host-endianness mode, rxe and the others
    /// reply in host order); 4-byte replies big-endian on mlx5.
    pub fn atomic_caps(&self, mlx5: bool) -> mlx5::AtomicCaps {
        mlx5::AtomicCaps {
            standard: self.atomic,
            masked: false,
            reply8_be: false,
            reply4_be: mlx5,
        }
    }
}

/// An asynchronous event of a verbs context, by what it is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RawAsync {
    /// `IBV_EVENT_CQ_ERR` on this `ibv_cq`, whose `cq_context` holds its number (the
    /// crate's CQ number, which the rdma backend writes there).
    CqError(usize, u32),
    /// `IBV_EVENT_QP_FATAL` / `IBV_EVENT_QP_REQ_ERR` on this QP number.
    QpFatal(u32),
    /// `IBV_EVENT_QP_ACCESS_ERR` on this QP number.
    QpAccessError(u32),
    /// `IBV_EVENT_PORT_ERR` on this port.
    PortError(u8),
    /// `IBV_EVENT_PORT_ACTIVE` on this port (its error, if any, is over).
    PortActive(u8),
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` on this `ibv_srq`, and the number in its
    /// `srq_context` (as for CQs).
    SrqLimitReached(usize, u32),
    /// `IBV_EVENT_SRQ_ERR`, the SRQ by its `ibv_srq` address, and its number.
    SrqError(usize, u32),
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` on this QP number.
    QpLastWqeReached(u32),
    /// Anything else (path migration, LID or P_Key change, ...): nothing to report.
    Other,
}

impl Context {
    /// Makes the context's asynchronous-event descriptor non-blocking (once, when the
    /// context is taken: as UCX does before it polls it), so that
    /// [`Context::next_async_event`] never blocks.
    ///
    /// # Safety
    /// `ctx` must be a live context.
    unsafe fn async_nonblocking(ctx: *mut ffi::ibv_context) {
        // SAFETY: live context (caller contract); `async_fd` is its event descriptor, owned
        // by rdma-core; the flags change only its blocking mode.
        unsafe {
            let fd = (*ctx).async_fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl >= 0 && fl & libc::O_NONBLOCK == 0 {
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
    }

    /// The next asynchronous event of the context, without blocking (the descriptor was made
    /// non-blocking when the context was taken): `ibv_get_async_event`, then
    /// `ibv_ack_async_event`. None when there is none.
    pub(crate) fn next_async_event(&self) -> Option<RawAsync> {
        use ffi::ibv_event_type as T;
        // SAFETY: an all-zero event is a valid out-parameter.
        let mut ev: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: live context, `ev` is written by the call.
        if unsafe { ffi::ibv_get_async_event(self.ctx, &mut ev) } != 0 {
            return None;
        }
        let qpn = || {
            // SAFETY: for QP events the element is the live `ibv_qp` (not destroyed before
            // the event is acknowledged, below).
            unsafe { (*ev.element.qp).qp_num }
        };
        // The number the crate keeps in a CQ's or SRQ's context field (live, as the QP).
        // SAFETY: a CQ event: the union holds the live CQ.
        let cq = || unsafe {
            (
                ev.element.cq as usize,
                (*ev.element.cq).cq_context as usize as u32,
            )
        };
        // SAFETY: an SRQ event: the union holds the live SRQ.
        let srq = || unsafe {
            (
                ev.element.srq as usize,
                (*ev.element.srq).srq_context as usize as u32,
            )
        };
        let out = match ev.event_type {
            T::IBV_EVENT_CQ_ERR => {
                let (at, n) = cq();
                RawAsync::CqError(at, n)
            }
            T::IBV_EVENT_QP_FATAL | T::IBV_EVENT_QP_REQ_ERR => RawAsync::QpFatal(qpn()),
            T::IBV_EVENT_QP_ACCESS_ERR => RawAsync::QpAccessError(qpn()),
            T::IBV_EVENT_PORT_ERR => {
                // SAFETY: a port event: the union holds the port number.
                RawAsync::PortError(unsafe { ev.element.port_num } as u8)
            }
            T::IBV_EVENT_PORT_ACTIVE => {
                // SAFETY: a port event: the union holds the port number.
                RawAsync::PortActive(unsafe { ev.element.port_num } as u8)
            }
            T::IBV_EVENT_DEVICE_FATAL => RawAsync::DeviceFatal,
            T::IBV_EVENT_SRQ_LIMIT_REACHED => {
                let (at, n) = srq();
                RawAsync::SrqLimitReached(at, n)
            }
            T::IBV_EVENT_QP_LAST_WQE_REACHED => RawAsync::QpLastWqeReached(qpn()),
            T::IBV_EVENT_SRQ_ERR => {
                let (at, n) = srq();
                RawAsync::SrqError(at, n)
            }
            _ => RawAsync::Other,
        };
        // SAFETY: the event `ibv_get_async_event` returned, acknowledged once.
        unsafe { ffi::ibv_ack_async_event(&mut ev) };
        Some(out)
    }
    /// Opens the device called `name`.
    ///
    /// # Errors
    /// `ENODEV` when no such device exists; the `ibv_open_device` error otherwise.
    pub fn open(name: &str) -> Result<Context, VerbsError> {
        let mut n = 0i32;
        // SAFETY: as in `list`.
        let devs = unsafe { ffi::ibv_get_device_list(&mut n) };
        if devs.is_null() {
            return Err(last("ibv_get_device_list"));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: as in `list`.
            let dev = unsafe { *devs.add(i) };
            // SAFETY: as in `list`.
            let dn = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) };
            if dn.to_bytes() == name.as_bytes() {
                // SAFETY: `dev` is a live device of the list; the context outlives the list.
                ctx = unsafe { ffi::ibv_open_device(dev) };
                if ctx.is_null() {
                    let e = last("ibv_open_device");
                    // SAFETY: freed once.
                    unsafe { ffi::ibv_free_device_list(devs) };
                    return Err(e);
                }
                break;
            }
        }
        // SAFETY: freed once; the opened context stays valid.
        unsafe { ffi::ibv_free_device_list(devs) };
        if ctx.is_null() {
            return Err(VerbsError {
                call: "ibv_open_device",
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        // SAFETY: the context just opened.
        unsafe { Self::async_nonblocking(ctx) };
        Ok(Context {
            ctx,
            name: name.to_owned(),
            owned: true,
            _keep: None,
        })
    }

    /// A context owned by librdmacm (an `rdma_cm_id`'s `verbs`), kept alive by `keep`.
    ///
    /// # Safety
    /// `ctx` must stay valid while `keep` lives.
    pub(crate) unsafe fn borrowed(
        ctx: *mut ffi::ibv_context,
        keep: std::sync::Arc<dyn Send + Sync>,
    ) -> Context {
        // SAFETY: the caller's contract; the device name is owned by the device.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name((*ctx).device)) };
        // SAFETY: the caller's contract.
        unsafe { Self::async_nonblocking(ctx) };
        Context {
            ctx,
            name: name.to_string_lossy().into_owned(),
            owned: false,
            _keep: Some(keep),
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Port attributes.
    ///
    /// # Errors
    /// The `ibv_query_port` error.
    pub fn port(&self, port: u8) -> Result<PortInfo, VerbsError> {
        // SAFETY: a zeroed ibv_port_attr is a valid out-parameter.
        let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, out-parameter of the right type and size.
        let rc = unsafe { ffi::___ibv_query_port(self.ctx, port, &mut attr) };
        if rc != 0 {
            return Err(super::code("ibv_query_port", rc));
        }
        Ok(PortInfo {
            lid: attr.lid,
            active_mtu: attr.active_mtu,
            active: attr.state == ffi::ibv_port_state::IBV_PORT_ACTIVE,
            gid_tbl_len: attr.gid_tbl_len,
            // IBV_LINK_LAYER_ETHERNET is 2 in verbs.h (an anonymous enum rdma-sys does not bind).
            ethernet: attr.link_layer == 2,
            max_msg_sz: attr.max_msg_sz,
        })
    }

    /// Whether the device has standard atomics (`atomic_cap` not `IBV_ATOMIC_NONE`, as
    /// rdma-core's providers read it when the context is opened); true when it cannot be
    /// queried (the provider then decides).
    pub(crate) fn has_atomics(&self) -> bool {
        // SAFETY: a zeroed ibv_device_attr is a valid out-parameter.
        let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, out-parameter of the right type and size.
        let rc = unsafe { ffi::ibv_query_device(self.ctx, &mut a) };
        rc != 0 || a.atomic_cap != ffi::ibv_atomic_cap::IBV_ATOMIC_NONE
    }

    /// The device attributes the crate uses (`ibv_query_device`), read once at open.
    ///
    /// # Errors
    /// The `ibv_query_device` error.
    pub fn attrs(&self) -> Result<DeviceAttrs, VerbsError> {
        // SAFETY: a zeroed ibv_device_attr is a valid out-parameter.
        let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context, out-parameter of the right type and size.
        let rc = unsafe { ffi::ibv_query_device(self.ctx, &mut a) };
        if rc != 0 {
            return Err(super::code("ibv_query_device", rc));
        }
        let (odp, clock) = self.ex_attrs();
        Ok(DeviceAttrs {
            odp,
            clock,
            atomic: a.atomic_cap != ffi::ibv_atomic_cap::IBV_ATOMIC_NONE,
            max_qp_rd_atom: a.max_qp_rd_atom.clamp(0, 255) as u8,
            max_qp_init_rd_atom: a.max_qp_init_rd_atom.clamp(0, 255) as u8,
            // `ibv_create_cq` takes an int.
            max_cqe: a.max_cqe.clamp(0, i32::MAX) as u32,
            rxe: a.vendor_id == RXE_VENDOR_ID,
        })
    }

    /// On-demand paging capabilities and the completion clock (`ibv_query_device_ex`); none
    /// when the extended query fails (a provider without it).
    fn ex_attrs(&self) -> (OdpCaps, ClockCaps) {
        // SAFETY: zeroed plain-data structs are valid input and output (rdma-core reads
        // `comp_mask` 0 from the input; rdma-sys's wrapper does not clear the output).
        let (input, mut out): (ffi::ibv_query_device_ex_input, ffi::ibv_device_attr_ex) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: live context; pointers to the two structs above.
        let rc = unsafe { super::ex::query_device_ex(self.ctx, &input, &mut out) };
        if rc != 0 {
            return Default::default();
        }
        let odp = OdpCaps {
            general: out.odp_caps.general_caps,
            rc: out.odp_caps.per_transport_caps.rc_odp_caps,
            ud: out.odp_caps.per_transport_caps.ud_odp_caps,
            // Not in verbs: the mlx5 device's own query fills it (`crate::dv::dc_odp_caps`).
            dc: 0,
        };
        let clock = ClockCaps {
            khz: out.hca_core_clock,
            mask: out.completion_timestamp_mask,
        };
        (odp, clock)
    }

    /// The GID at `index` of `port`.
    ///
    /// # Errors
    /// The `ibv_query_gid` error.
    pub fn gid(&self, port: u8, index: i32) -> Result<[u8; 16], VerbsError> {
        // SAFETY: a zeroed union of bytes is valid.
        let mut gid: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `gid` is a 16-byte out-parameter.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx, port, index, &mut gid) };
        if rc != 0 {
            return Err(last("ibv_query_gid"));
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(unsafe { gid.raw })
    }

    /// The first RoCE v2 GID index of `port` with an IPv4-mapped address (what perftest's
    /// `-x` picks by hand), read from sysfs; `None` on InfiniBand or when there is none.
    pub fn roce_v2_gid_index(&self, port: u8) -> Option<i32> {
        let base = format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types",
            self.name
        );
        let len = self.port(port).ok()?.gid_tbl_len;
        (0..len).find(|&i| {
            let ty = std::fs::read_to_string(format!("{base}/{i}")).unwrap_or_default();
            ty.trim() == "RoCE v2"
                && self
                    .gid(port, i)
                    .is_ok_and(|g| g[..10] == [0; 10] && g[10..12] == [0xff, 0xff])
        })
    }
}

/// rxe's vendor id (`RXE_VENDOR_ID`).
const RXE_VENDOR_ID: u32 = 0xff_ffff;

/// Whether the device of `ctx` is rxe (see [`DeviceAttrs::rxe`]).
///
/// # Safety
/// `ctx` must be a live context.
pub(crate) unsafe fn is_rxe(ctx: *mut ffi::ibv_context) -> bool {
    // SAFETY: a zeroed ibv_device_attr is a valid out-parameter.
    let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's contract; out-parameter of the right type and size.
    let rc = unsafe { ffi::ibv_query_device(ctx, &mut attr) };
    rc == 0 && attr.vendor_id == RXE_VENDOR_ID
}

impl Context {
    /// No context (tests of objects whose rdma-core calls never reach one): closes nothing.
    #[cfg(all(test, feature = "sim"))]
    pub(crate) fn none() -> Context {
        Context {
            ctx: std::ptr::null_mut(),
            name: String::new(),
            owned: false,
            _keep: None,
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: opened in `open`, closed once; every object created on it holds an Arc
            // of this context and is destroyed first.
            unsafe { ffi::ibv_close_device(self.ctx) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeviceAttrs;

    #[test]
    fn atomic_caps_from_device_attributes() {
        let mut a = DeviceAttrs {
            atomic: true,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_cqe: (1 << 22) - 1,
            rxe: false,
            odp: Default::default(),
            clock: Default::default(),
        };
        let mlx5 = a.atomic_caps(true);
        assert!(mlx5.standard && !mlx5.masked && !mlx5.reply8_be && mlx5.reply4_be);
        let rxe = a.atomic_caps(false);
        assert_eq!(rxe, mlx5::AtomicCaps::HOST_ORDER);
        a.atomic = false;
        assert!(!a.atomic_caps(true).standard, "IBV_ATOMIC_NONE");
    }

    #[test]
    fn odp_caps_need_the_general_bit_and_every_rc_operation() {
        use super::OdpCaps;
        let all = OdpCaps::RC_BASIC | OdpCaps::RC_ATOMIC;
        let full = OdpCaps {
            general: OdpCaps::SUPPORT | OdpCaps::IMPLICIT,
            rc: all,
            ud: OdpCaps::SEND | OdpCaps::RECV,
            dc: OdpCaps::SEND | OdpCaps::WRITE,
        };
        assert!(full.rc(true) && full.implicit());
        // rc bits without the general bit (or the reverse) are no support.
        assert!(!OdpCaps {
            general: 0,
            rc: all,
            ud: 0,
            dc: all,
        }
        .rc(false));
        let no_atomic = OdpCaps {
            general: OdpCaps::SUPPORT,
            rc: OdpCaps::RC_BASIC,
            ud: OdpCaps::SEND,
            dc: 0,
        };
        assert!(no_atomic.rc(false) && !no_atomic.rc(true) && !no_atomic.implicit());
        assert!(!OdpCaps::default().rc(false));
        // UD receives need the UD receive bit (a ConnectX reports UD sends only).
        assert!(full.ud_recv() && !no_atomic.ud_recv());
        // DC: each operation its own bit, and the general bit.
        assert!(full.dc(OdpCaps::SEND) && full.dc(OdpCaps::WRITE) && !full.dc(OdpCaps::READ));
        assert!(!no_atomic.dc(OdpCaps::SEND));
    }
}
