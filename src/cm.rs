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

/// A new id (and its event channel), or, where librdmacm finds no RDMA device at all (its
/// `ucma_init` fails `rdma_create_event_channel` with ENODEV), an error that says so.
fn new_id() -> Result<CmId> {
    CmId::new().map_err(|e| match e.source.raw_os_error() {
        Some(libc::ENODEV) => Error::Unsupported(
            "rdma_cm: no RDMA device on this host (no RDMA hardware, or its kernel driver, \
             ib_uverbs and rdma_ucm not loaded)",
        ),
        _ => e.into(),
    })
}

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
pub(crate) unsafe fn device_on(
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
/// [`Error::Unsupported`] on a host without an RDMA device; [`Error::Verbs`]
/// (`rdma_bind_addr` fails when no RDMA device has that address).
pub fn listen(addr: SocketAddr) -> Result<CmListener> {
    let id = new_id()?;
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
/// [`Error::Unsupported`] on a host without an RDMA device; [`Error::Verbs`] when the
/// address or route cannot be resolved.
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
    let id = Arc::new(new_id()?);
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
    /// [`Error::Verbs`] when the QP cannot be created or the accept fails; as
    /// [`Pd::create_qp`] for `cq` and `caps` ([`Error::InvalidHandle`] for a CQ of another
    /// device, [`Error::InvalidParameter`] for caps the device would refuse);
    /// [`Error::Unsupported`] for [`QpCaps::rnr_retry`] below 7 (librdmacm programs the
    /// peer's count, 7) and, on mlx5, for `QpCaps::scatter_to_cqe = false`
    /// (`rdma_create_qp_ex` takes no vendor attributes).
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
    /// [`Error::Verbs`] when the QP cannot be created or the connection is refused; as
    /// [`CmRequest::accept`] for `cq` and `caps`.
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
}
