//! Connection set-up through librdmacm (`rdma_cm`): listen / accept and resolve / connect by
//! IP address, as `rdma_server` and `rdma_client` do. The QP is created by librdmacm on the
//! connection's device; one remote buffer descriptor can travel in the connection's private
//! data each way (what `rdma_post_writev` users exchange).
//!
//! ```no_run
//! # fn main() -> blueflame::Result<()> {
//! use blueflame::{Access, QpCaps, QueuePair, cm};
//! use std::time::Duration;
//! let listener = cm::listen("10.77.0.1:7471".parse().unwrap())?;
//! let req = listener.next_request(Duration::from_secs(60))?;
//! let mr = req.pd().alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let cq = req.device().create_cq(64)?;
//! let conn = req.accept(&cq, QpCaps::default(), Some(mr.remote_buf()))?;
//! # let _ = conn; Ok(()) }
//! ```

use crate::caps::QpCaps;
use crate::connect::RemoteBuf;
use crate::error::{Error, Result};
use crate::resources::Cq;
use crate::resources::Device;
use crate::resources::Pd;
use crate::resources::Qp;
use crate::verbs::cm::CmId;
use crate::verbs::device::Context;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const MAGIC: &[u8; 4] = b"BFC1";

/// The private data of a connection request or reply offering `b`.
pub(crate) fn encode(b: Option<RemoteBuf>) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    match b {
        Some(b) => {
            v.push(1);
            v.extend_from_slice(&b.addr.to_be_bytes());
            v.extend_from_slice(&b.rkey.to_be_bytes());
            v.extend_from_slice(&b.len.to_be_bytes());
        }
        None => v.push(0),
    }
    v
}

/// The buffer a peer's private data offers (None: none, or not blueflame's).
pub(crate) fn decode(p: &[u8]) -> Option<RemoteBuf> {
    // Private data may come back padded (InfiniBand CM messages have fixed sizes).
    if p.len() < 25 || &p[..4] != MAGIC || p[4] != 1 {
        return None;
    }
    Some(RemoteBuf {
        addr: u64::from_be_bytes(p[5..13].try_into().ok()?),
        rkey: u32::from_be_bytes(p[13..17].try_into().ok()?),
        len: u64::from_be_bytes(p[17..25].try_into().ok()?),
    })
}

fn device_of(id: &Arc<CmId>) -> Result<(Device, Pd)> {
    let ctx = id.verbs();
    if ctx.is_null() {
        return Err(Error::Unsupported("rdma_cm id without a device"));
    }
    let keep: Arc<dyn Send + Sync> = id.clone();
    // SAFETY: the context belongs to librdmacm and stays valid while the id lives; the
    // context keeps the id alive.
    let dev = unsafe { device_on(ctx, keep, id.port())? };
    let pd = dev.alloc_pd()?;
    Ok((dev, pd))
}

/// A device over librdmacm's context `ctx` (kept open by `keep`), port `port`.
///
/// # Safety
/// `ctx` must stay valid while `keep` lives.
unsafe fn device_on(
    ctx: *mut rdma_sys::ibv_context,
    keep: Arc<dyn Send + Sync>,
    port: u8,
) -> Result<Device> {
    // SAFETY: the caller's contract.
    let ctx = Arc::new(unsafe { Context::borrowed(ctx, keep) });
    let events = events_of(ctx.ctx);
    Ok(Device {
        events,
        backend: crate::backend::Dev::of_context(ctx, port)?,
    })
}

/// The asynchronous-event record of librdmacm's context `ctx`: one per context, shared by
/// every connection's device on it, as they share its one event descriptor (an event one
/// of them reads is then seen by all; each looks only at its own objects' subjects).
fn events_of(ctx: *mut rdma_sys::ibv_context) -> Arc<crate::resources::events::Events> {
    use crate::resources::events::Events;
    use std::sync::{Mutex, Weak};
    static BY_CONTEXT: Mutex<Vec<(usize, Weak<Events>)>> = Mutex::new(Vec::new());
    let mut all = BY_CONTEXT.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    let key = ctx as usize;
    if let Some(e) = all
        .iter()
        .filter(|(c, _)| *c == key)
        .find_map(|(_, w)| w.upgrade())
    {
        return e;
    }
    let e = Arc::new(Events::default());
    all.push((key, Arc::downgrade(&e)));
    e
}

/// The device and domain of a connection on `id`: `pd`'s, when given (for several
/// connections on one CQ and one region), else new ones ([`device_of`]).
fn device_for(id: &Arc<CmId>, pd: Option<&Pd>) -> Result<(Device, Pd)> {
    let Some(pd) = pd else {
        return device_of(id);
    };
    let ctx = id.verbs();
    // librdmacm opens one context per device and hands it to every id on it; a domain of
    // another context (another device, or one opened with `Device::open`) cannot hold the
    // QP (`rdma_create_qp` refuses it).
    let same = match &pd.device().backend {
        crate::backend::Dev::Rdma(r) => !ctx.is_null() && r.ctx.ctx == ctx,
        #[cfg(feature = "sim")]
        crate::backend::Dev::Sim(_) => false,
    };
    if !same {
        return Err(Error::InvalidHandle {
            what: "protection domain of another device than the rdma_cm connection's \
                   (librdmacm picks the device from the address; use the domain of an \
                   earlier connection's request)",
            value: 0,
        });
    }
    Ok((pd.device().clone(), pd.clone()))
}

/// A listening rdma_cm id.
pub struct CmListener {
    id: CmId,
}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener").finish()
    }
}

/// Listens on `addr` (an IP address of an RDMA device, e.g. rxe0's).
///
/// # Errors
/// [`Error::Verbs`] (`rdma_bind_addr` fails when no RDMA device has that address).
pub fn listen(addr: SocketAddr) -> Result<CmListener> {
    let id = CmId::new()?;
    id.listen(&addr)?;
    Ok(CmListener { id })
}

impl CmListener {
    /// Waits for the next connect request.
    ///
    /// # Errors
    /// [`Error::Verbs`] on a timeout or another event.
    pub fn next_request(&self, timeout: Duration) -> Result<CmRequest> {
        self.request(None, timeout)
    }

    /// As [`CmListener::next_request`], the request's device and protection domain being
    /// `pd`'s (that of an earlier request's [`CmRequest::pd`]): its QP can then share a CQ
    /// and regions with the earlier connections (several QPs on one CQ).
    ///
    /// # Errors
    /// As [`CmListener::next_request`]; [`Error::InvalidHandle`] when the request arrived
    /// on another device than `pd`'s.
    pub fn next_request_on(&self, pd: &Pd, timeout: Duration) -> Result<CmRequest> {
        self.request(Some(pd), timeout)
    }

    fn request(&self, pd: Option<&Pd>, timeout: Duration) -> Result<CmRequest> {
        let ev = self.id.wait(
            rdma_sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
            timeout,
        )?;
        // SAFETY: a connect request's new id, owned by nobody else yet.
        let id = Arc::new(unsafe { CmId::adopt(ev.id)? });
        let (device, pd) = device_for(&id, pd)?;
        Ok(CmRequest {
            id,
            device,
            pd,
            peer: decode(&ev.private),
            timeout,
        })
    }
}

/// A connect request (server) or a resolved route (client): its device and a protection
/// domain on it, for regions and the CQ, before the connection is made.
pub struct CmRequest {
    id: Arc<CmId>,
    device: Device,
    pd: Pd,
    peer: Option<RemoteBuf>,
    timeout: Duration,
}

impl std::fmt::Debug for CmRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmRequest")
            .field("device", &self.device.to_string())
            .field("peer", &self.peer)
            .finish()
    }
}

/// An established connection: the QP (connected, RTS) and the peer's buffer, if it sent one.
#[derive(Debug)]
pub struct CmConnection {
    /// The connected QP.
    pub qp: Qp,
    /// The remote buffer the peer offered.
    pub peer: Option<RemoteBuf>,
}

/// Resolves `addr` (a listener's address) and its route: the client side.
///
/// # Errors
/// [`Error::Verbs`] when the address or route cannot be resolved.
pub fn resolve(addr: SocketAddr, timeout: Duration) -> Result<CmRequest> {
    resolve_with(None, addr, timeout)
}

/// As [`resolve`], the connection's device and protection domain being `pd`'s (that of an
/// earlier [`resolve`]'s [`CmRequest::pd`]): its QP can then share a CQ and regions with
/// the earlier connections (several QPs on one CQ, as perftest's `-q` with `-R`).
///
/// # Errors
/// As [`resolve`]; [`Error::InvalidHandle`] when the route runs through another device
/// than `pd`'s.
pub fn resolve_on(pd: &Pd, addr: SocketAddr, timeout: Duration) -> Result<CmRequest> {
    resolve_with(Some(pd), addr, timeout)
}

fn resolve_with(pd: Option<&Pd>, addr: SocketAddr, timeout: Duration) -> Result<CmRequest> {
    let id = Arc::new(CmId::new()?);
    id.resolve(&addr, timeout)?;
    let (device, pd) = device_for(&id, pd)?;
    Ok(CmRequest {
        id,
        device,
        pd,
        peer: None,
        timeout,
    })
}

impl CmRequest {
    /// The device the connection runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// A protection domain on it (regions for the connection go here).
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
    /// The buffer the client offered in its request (server side).
    pub fn peer(&self) -> Option<RemoteBuf> {
        self.peer
    }

    fn qp(&self, cq: &Cq, caps: QpCaps) -> Result<Qp> {
        self.pd.create_qp_with(cq, cq, caps, Some(self.id.clone()))
    }

    /// Server: creates the QP on `cq` and accepts, offering `offer`.
    ///
    /// # Errors
    /// [`Error::Verbs`] when the QP cannot be created or the accept fails.
    pub fn accept(self, cq: &Cq, caps: QpCaps, offer: Option<RemoteBuf>) -> Result<CmConnection> {
        let mut qp = self.qp(cq, caps)?;
        self.id.accept(&encode(offer), self.timeout)?;
        qp.mark_connected();
        Ok(CmConnection {
            qp,
            peer: self.peer,
        })
    }

    /// Client: creates the QP on `cq` and connects, offering `offer`; the connection carries
    /// the server's offer.
    ///
    /// # Errors
    /// [`Error::Verbs`] when the QP cannot be created or the connection is refused.
    pub fn connect(self, cq: &Cq, caps: QpCaps, offer: Option<RemoteBuf>) -> Result<CmConnection> {
        let mut qp = self.qp(cq, caps)?;
        let back = self.id.connect(&encode(offer), self.timeout)?;
        qp.mark_connected();
        Ok(CmConnection {
            qp,
            peer: decode(&back),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_round_trip_and_padding() {
        let b = RemoteBuf {
            addr: 0x7f00_1234_5678,
            rkey: 0xabcd,
            len: 4096,
        };
        let mut p = encode(Some(b));
        assert_eq!(decode(&p), Some(b));
        p.resize(56, 0); // IB CM pads private data
        assert_eq!(decode(&p), Some(b));
        assert_eq!(decode(&encode(None)), None);
        assert_eq!(decode(b"junk"), None);
    }

    /// A context's `post_send` (`ibv_context_ops`), which the tests below wrap.
    type PostSendFn = unsafe extern "C" fn(
        *mut rdma_sys::ibv_qp,
        *mut rdma_sys::ibv_send_wr,
        *mut *mut rdma_sys::ibv_send_wr,
    ) -> std::os::raw::c_int;

    /// Two RC QPs of `dev` on one CQ, connected to each other.
    fn pair(dev: &Device) -> (crate::Pd, crate::Cq, crate::Qp, crate::Qp) {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let mut q1 = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        let mut q2 = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        let (e1, e2) = (q1.endpoint().unwrap(), q2.endpoint().unwrap());
        q1.connect(e2).unwrap();
        q2.connect(e1).unwrap();
        (pd, cq, q1, q2)
    }

    /// rdma-core's siw provider (`providers/siw/siw.c`, `siw_post_send`) sets `*bad_wr` at
    /// the first request it refuses (`push_send_wqe`: `IBV_WR_RDMA_WRITE_WITH_IMM`,
    /// `IBV_WR_SEND_WITH_IMM`, `IBV_WR_LOCAL_INV`, ... map to an unsupported opcode and
    /// return -EINVAL), then, when it pushed some before it and the SQ was idle, rings the
    /// doorbell with `rv = siw_db(qp)`, which overwrites the refusal: it returns 0 with
    /// `*bad_wr` set and the requests from it on not posted. With nothing pushed it returns
    /// the negative errno. Emulated here over libmlx5's own `post_send` (the kernel model's
    /// mlx5_0, verbs path, classic API): the batch must not be reported posted whole, and
    /// every signaled request reported posted must complete.
    #[test]
    #[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
    fn a_provider_that_refuses_midway_with_zero_loses_no_request() {
        use crate::{Access, Completion, Payload, PostFlags, PostSend, QueuePair, Request};
        use rdma_sys as ffi;
        use std::os::raw::c_int;
        use std::sync::OnceLock;
        static REAL: OnceLock<PostSendFn> = OnceLock::new();
        unsafe extern "C" fn siw_like(
            qp: *mut ffi::ibv_qp,
            wr: *mut ffi::ibv_send_wr,
            bad: *mut *mut ffi::ibv_send_wr,
        ) -> c_int {
            let real = *REAL.get().unwrap();
            // SAFETY: the list libibverbs' caller built; `bad` is valid.
            unsafe {
                *bad = std::ptr::null_mut();
                let refused = |w: *mut ffi::ibv_send_wr| {
                    matches!(
                        (*w).opcode,
                        ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                            | ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
                    )
                };
                let (mut prev, mut w) = (std::ptr::null_mut::<ffi::ibv_send_wr>(), wr);
                while !w.is_null() && !refused(w) {
                    prev = w;
                    w = (*w).next;
                }
                if w.is_null() {
                    return real(qp, wr, bad);
                }
                if prev.is_null() {
                    *bad = w;
                    return -libc::EINVAL;
                }
                (*prev).next = std::ptr::null_mut();
                let rc = real(qp, wr, bad);
                (*prev).next = w;
                *bad = w;
                rc // siw: the doorbell's result
            }
        }
        std::env::set_var("BLUEFLAME_PATH", "verbs");
        std::env::set_var("BLUEFLAME_VERBS_API", "legacy");
        let owner = Arc::new(Context::open("mlx5_0").expect("mlx5_0 (kernel model)"));
        let raw = owner.ctx;
        // SAFETY: the context is open; nothing posts on it yet.
        unsafe {
            let _ = REAL.set((*raw).ops.post_send.unwrap());
            (*raw).ops.post_send = Some(siw_like);
        }
        // SAFETY: `owner` keeps `raw` open.
        let dev = unsafe { device_on(raw, owner.clone(), 1) }.unwrap();
        let (pd, mut cq, mut q1, _q2) = pair(&dev);
        assert_eq!(q1.data_path(), crate::DataPath::Verbs);
        let mr = pd
            .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let remote = mr.remote(0).unwrap();
        // One request siw refuses alone: its error should be the errno, not its negation.
        let alone = Request::WriteImm {
            remote,
            data: Payload::Inline(&[2]),
            imm: 5,
        };
        let err = q1.post(&alone, 9, PostFlags::SIGNALED).unwrap_err();
        eprintln!("a refused request alone: {err} ({err:?})");
        // A batch: a write siw posts, then a write with immediate it refuses.
        let mut b = q1.batch();
        let write = Request::Write {
            remote,
            data: Payload::Inline(&[1]),
        };
        b.push(&write, 1, PostFlags::SIGNALED).unwrap();
        b.push(&alone, 2, PostFlags::SIGNALED).unwrap();
        let rung = b.ring();
        let mut out = [Completion::default(); 4];
        let mut got = Vec::new();
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            let n = cq.poll(&mut out);
            got.extend(out[..n].iter().map(|c| (c.cookie, c.status)));
        }
        eprintln!("ring: {rung:?}; completions: {got:?}");
        assert!(
            matches!(err, Error::Verbs(ref v) if v.source.raw_os_error() == Some(libc::EINVAL)),
            "siw's negative errno reported as is: {err:?}"
        );
        assert!(
            rung.is_err() || got.iter().any(|&(c, _)| c == 2),
            "the batch was reported posted ({rung:?}) and request 2 never completed: {got:?}"
        );
    }

    /// On an iWARP device (siw, irdma in iWARP mode) a send or write posted after an RDMA
    /// read completes before it (siw completes the read at its response, the others once
    /// sent), while the verbs queue retires everything before a completed position: every
    /// request there carries `IBV_SEND_FENCE` (siw's read fence), so completions come in
    /// order. The kernel model's mlx5_0 is made to say iWARP, and its `post_send` records the
    /// flags it is given (verbs path, classic API).
    #[test]
    #[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
    fn on_iwarp_a_request_after_a_read_is_fenced() {
        use crate::{Access, Completion, PostFlags, PostSend};
        use rdma_sys as ffi;
        use std::os::raw::c_int;
        use std::sync::{Mutex, OnceLock};
        static REAL: OnceLock<PostSendFn> = OnceLock::new();
        static SEEN: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());
        unsafe extern "C" fn recording(
            qp: *mut ffi::ibv_qp,
            wr: *mut ffi::ibv_send_wr,
            bad: *mut *mut ffi::ibv_send_wr,
        ) -> c_int {
            // SAFETY: the list libibverbs' caller built.
            unsafe {
                let mut w = wr;
                while !w.is_null() {
                    SEEN.lock().unwrap().push(((*w).opcode, (*w).send_flags));
                    w = (*w).next;
                }
                (REAL.get().unwrap())(qp, wr, bad)
            }
        }
        std::env::set_var("BLUEFLAME_PATH", "verbs");
        std::env::set_var("BLUEFLAME_VERBS_API", "legacy");
        let owner = Arc::new(Context::open("mlx5_0").expect("mlx5_0 (kernel model)"));
        let raw = owner.ctx;
        // SAFETY: the context is open; nothing posts on it yet; the device struct is
        // libibverbs' own, read by the crate when a send queue is made.
        unsafe {
            let _ = REAL.set((*raw).ops.post_send.unwrap());
            (*raw).ops.post_send = Some(recording);
            (*(*raw).device).transport_type = ffi::ibv_transport_type::IBV_TRANSPORT_IWARP;
        }
        // SAFETY: `owner` keeps `raw` open.
        let dev = unsafe { device_on(raw, owner.clone(), 1) }.unwrap();
        let (pd, mut cq, mut q1, _q2) = pair(&dev);
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = pd.alloc_mr(4096, rights).unwrap();
        q1.read(
            &[mr.sge(0, 8).unwrap()],
            mr.remote(1024).unwrap(),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        q1.write_inline(&[7; 8], mr.remote(2048).unwrap(), 2, PostFlags::SIGNALED)
            .unwrap();
        let mut out = [Completion::default(); 4];
        assert_eq!(cq.poll_n(&mut out, 2, 1 << 34), 2);
        let seen = SEEN.lock().unwrap().clone();
        let fence = ffi::ibv_send_flags::IBV_SEND_FENCE.0;
        let after_read = seen
            .iter()
            .skip_while(|(op, _)| *op != ffi::ibv_wr_opcode::IBV_WR_RDMA_READ)
            .nth(1)
            .copied();
        assert!(
            matches!(after_read, Some((_, f)) if f & fence != 0),
            "the request after the read was not fenced: {seen:?}"
        );
    }

    /// A type-1 bind on the verbs path carries the fence asked for and the one armed by the
    /// bind before it, as every other request does (`ibv_bind_mw`'s `send_flags`; it had
    /// only SIGNALED). The kernel model's `bind_mw` records the flags it is given.
    #[test]
    #[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
    fn a_type1_bind_on_the_verbs_path_is_fenced_as_asked() {
        use crate::{Access, Completion, Fence, MwType, PostFlags};
        use rdma_sys as ffi;
        use std::os::raw::c_int;
        use std::sync::{Mutex, OnceLock};
        type BindFn = unsafe extern "C" fn(
            *mut ffi::ibv_qp,
            *mut ffi::ibv_mw,
            *mut ffi::ibv_mw_bind,
        ) -> c_int;
        static REAL: OnceLock<BindFn> = OnceLock::new();
        static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
        unsafe extern "C" fn recording(
            qp: *mut ffi::ibv_qp,
            mw: *mut ffi::ibv_mw,
            bind: *mut ffi::ibv_mw_bind,
        ) -> c_int {
            // SAFETY: the bind libibverbs' caller gave.
            unsafe {
                SEEN.lock().unwrap().push((*bind).send_flags);
                (REAL.get().unwrap())(qp, mw, bind)
            }
        }
        std::env::set_var("BLUEFLAME_PATH", "verbs");
        let owner = Arc::new(Context::open("mlx5_0").expect("mlx5_0 (kernel model)"));
        let raw = owner.ctx;
        // SAFETY: the context is open; nothing binds on it yet.
        unsafe {
            let _ = REAL.set((*raw).ops.bind_mw.unwrap());
            (*raw).ops.bind_mw = Some(recording);
        }
        // SAFETY: `owner` keeps `raw` open.
        let dev = unsafe { device_on(raw, owner.clone(), 1) }.unwrap();
        let pd = dev.alloc_pd().unwrap();
        let mut cq = dev.create_cq(64).unwrap();
        let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        let me = qp.endpoint().unwrap();
        qp.connect(me).unwrap();
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
        let mr = pd.alloc_mr(4096, rights).unwrap();
        let mut mw = pd.alloc_mw(MwType::One).unwrap();
        let w = Access::REMOTE_WRITE;
        let fenced = PostFlags::SIGNALED.fence(Fence::SmallAndFence);
        qp.bind_mw(&mut mw, &mr, 0, 64, w, 1, fenced).unwrap();
        qp.bind_mw(&mut mw, &mr, 0, 128, w, 2, PostFlags::SIGNALED)
            .unwrap();
        let mut out = [Completion::default(); 4];
        assert_eq!(cq.poll_n(&mut out, 2, 1 << 34), 2);
        let fence = ffi::ibv_send_flags::IBV_SEND_FENCE.0;
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(
            seen.iter().map(|f| f & fence != 0).collect::<Vec<_>>(),
            [true, true],
            "asked for, then armed by the bind before: {seen:?}"
        );
    }

    /// librdmacm opens one `ibv_context` per device and hands it to every id on it, so two
    /// connections made without `_on` (`device_of` each time) are two `Device`s over one
    /// context, one asynchronous event descriptor. What one of them reads must reach the
    /// other (each had a record of its own, and an event one read was lost to the other).
    /// This builds the two devices as `device_of` does, over the kernel model's mlx5_0 (no
    /// rdma_cm here); the provider stage runs it with the model preloaded.
    #[test]
    #[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
    fn connections_on_one_context_share_their_async_events() {
        use crate::{Access, Completion, PostFlags, PostSend, QueuePair, WcStatus};
        let owner = Arc::new(Context::open("mlx5_0").expect("mlx5_0 (kernel model)"));
        let raw = owner.ctx;
        // As `device_of` makes them, one per rdma_cm request.
        // SAFETY: `keep` (the owning context) keeps `raw` open.
        let dev = |keep: Arc<dyn Send + Sync>| unsafe { device_on(raw, keep, 1) }.unwrap();
        let (a, b) = (dev(owner.clone()), dev(owner.clone()));
        // On connection b's device: a write to a region without remote write; the
        // responder has no completion to say so, only the QP access error event.
        let refused = |check_a_first: bool| {
            let (pd, mut cq, mut q1, q2) = pair(&b);
            let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
            q1.write_inline(&[1], mr.remote(0).unwrap(), 7, PostFlags::SIGNALED)
                .unwrap();
            let mut out = [Completion::default(); 4];
            assert_eq!(cq.poll_n(&mut out, 1, 1 << 34), 1);
            assert_eq!(out[0].status, WcStatus::RemAccessErr);
            // The model forwards events every 0.5 ms.
            std::thread::sleep(Duration::from_millis(100));
            if check_a_first {
                // Connection a checks its own objects (a refused post of its, Qp::check).
                let _ = a.events.check(&a.backend, &[]);
            }
            q2.check()
        };
        let control = refused(false);
        assert!(
            matches!(control, Err(Error::AsyncEvent(_))),
            "control: {control:?}"
        );
        let lost = refused(true);
        assert!(
            matches!(lost, Err(Error::AsyncEvent(_))),
            "the responder's access error, read by the other connection's device: {lost:?}"
        );
    }
}
