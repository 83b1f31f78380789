//! librdmacm: event channels, ids and the connection events, for `crate::cm`.

use super::{last, VerbsError};
use rdma_sys as ffi;
use std::net::SocketAddr;
use std::time::Duration;

/// An rdma_cm id with its own event channel; destroyed (id, then channel) on drop.
pub struct CmId {
    pub(crate) id: *mut ffi::rdma_cm_id,
    ch: *mut ffi::rdma_event_channel,
}

// SAFETY: librdmacm ids and channels may be used from any thread; the wrapper serialises its
// own use (`&self` methods only read the pointers; events are awaited by one caller).
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

/// One connection-manager event, acknowledged, with a copy of its private data.
pub struct Event {
    /// The id the event is for (a new id for a connect request).
    pub id: *mut ffi::rdma_cm_id,
    /// The private data the peer sent.
    pub private: Vec<u8>,
    /// A multicast join's address vector and Q_Key (`param.ud`), for that event only.
    pub ud: Option<(ffi::ibv_ah_attr, u32)>,
}

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is valid; the matching family is filled below.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Makes an event channel's descriptor non-blocking: `rdma_get_cm_event` then fails with
/// `EAGAIN` instead of sleeping past the caller's timeout when another thread took the
/// event `poll` announced.
///
/// # Safety
/// `fd` must be an open descriptor.
unsafe fn nonblocking(fd: libc::c_int) {
    // SAFETY: the caller's contract; only the blocking mode changes.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

fn timed_out(what: &'static str) -> VerbsError {
    VerbsError {
        call: what,
        source: std::io::ErrorKind::TimedOut.into(),
    }
}

impl CmId {
    /// A new TCP-port-space id on a new event channel.
    ///
    /// # Errors
    /// The `rdma_create_event_channel` / `rdma_create_id` error.
    pub fn new() -> Result<CmId, VerbsError> {
        CmId::in_space(ffi::rdma_port_space::RDMA_PS_TCP)
    }

    /// A new UDP-port-space id (datagrams and multicast) on a new event channel.
    ///
    /// # Errors
    /// As [`CmId::new`].
    pub fn new_udp() -> Result<CmId, VerbsError> {
        CmId::in_space(ffi::rdma_port_space::RDMA_PS_UDP)
    }

    fn in_space(space: ffi::rdma_port_space::Type) -> Result<CmId, VerbsError> {
        // SAFETY: creates a channel; freed in Drop (or below on error).
        let ch = unsafe { ffi::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(last("rdma_create_event_channel"));
        }
        let mut id = std::ptr::null_mut();
        // SAFETY: live channel; `id` is an out-parameter.
        if unsafe { ffi::rdma_create_id(ch, &mut id, std::ptr::null_mut(), space) } != 0 {
            let e = last("rdma_create_id");
            // SAFETY: created above, no id on it.
            unsafe { ffi::rdma_destroy_event_channel(ch) };
            return Err(e);
        }
        // SAFETY: the channel just created; its descriptor is open.
        unsafe { nonblocking((*ch).fd) };
        Ok(CmId { id, ch })
    }

    /// Takes ownership of an id a connect request created, moving it to its own channel.
    ///
    /// # Safety
    /// `id` must be the new id of a connect-request event, owned by nobody else.
    ///
    /// # Errors
    /// The `rdma_migrate_id` error.
    pub unsafe fn adopt(id: *mut ffi::rdma_cm_id) -> Result<CmId, VerbsError> {
        // SAFETY: creates a channel.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        if ch.is_null() {
            let e = last("rdma_create_event_channel");
            // SAFETY: the id is ours (caller contract): destroyed, the request rejected.
            unsafe { ffi::rdma_destroy_id(id) };
            return Err(e);
        }
        // SAFETY: the caller hands over a live id.
        if unsafe { ffi::rdma_migrate_id(id, ch) } != 0 {
            let e = last("rdma_migrate_id");
            // SAFETY: the id is ours (still on the listener's channel); the channel was
            // created above and holds no id.
            unsafe {
                ffi::rdma_destroy_id(id);
                ffi::rdma_destroy_event_channel(ch);
            }
            return Err(e);
        }
        // SAFETY: the channel just created; its descriptor is open.
        unsafe { nonblocking((*ch).fd) };
        Ok(CmId { id, ch })
    }

    /// Binds to `addr` and listens.
    ///
    /// # Errors
    /// The `rdma_bind_addr` / `rdma_listen` error (no RDMA device on that address).
    pub fn listen(&self, addr: &SocketAddr) -> Result<(), VerbsError> {
        let (mut ss, _) = sockaddr(addr);
        // SAFETY: live id; `ss` holds a sockaddr of the right family.
        if unsafe { ffi::rdma_bind_addr(self.id, &mut ss as *mut _ as *mut _) } != 0 {
            return Err(last("rdma_bind_addr"));
        }
        // SAFETY: live, bound id.
        if unsafe { ffi::rdma_listen(self.id, 8) } != 0 {
            return Err(last("rdma_listen"));
        }
        Ok(())
    }

    /// Resolves the address and route of `addr`.
    ///
    /// # Errors
    /// The `rdma_resolve_addr` / `rdma_resolve_route` error, or the failure event.
    pub fn resolve(&self, addr: &SocketAddr, timeout: Duration) -> Result<(), VerbsError> {
        let (mut ss, _) = sockaddr(addr);
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: live id; `ss` holds a sockaddr; no source address.
        if unsafe {
            ffi::rdma_resolve_addr(
                self.id,
                std::ptr::null_mut(),
                &mut ss as *mut _ as *mut _,
                ms,
            )
        } != 0
        {
            return Err(last("rdma_resolve_addr"));
        }
        self.wait(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            timeout,
        )?;
        // SAFETY: live id with a resolved address.
        if unsafe { ffi::rdma_resolve_route(self.id, ms) } != 0 {
            return Err(last("rdma_resolve_route"));
        }
        self.wait(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            timeout,
        )?;
        Ok(())
    }

    fn conn_param(&self, private: &[u8]) -> ffi::rdma_conn_param {
        // SAFETY: an all-zero rdma_conn_param is valid.
        let mut p: ffi::rdma_conn_param = unsafe { std::mem::zeroed() };
        p.private_data = private.as_ptr().cast();
        p.private_data_len = private.len() as u8;
        // RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH: librdmacm takes the device's limits on
        // connect and, on accept, the smaller of the device's and the request's (`cma.c`
        // rdma_connect / rdma_accept); a fixed 16 is EINVAL on a device of fewer
        // (`ucma_valid_param`) and, on accept, may exceed what the peer offered.
        p.responder_resources = 0xff;
        p.initiator_depth = 0xff;
        // 7 retries, except on rxe, which takes 7 as "for ever" (see
        // `DeviceAttrs::retry_cnt_for`).
        let ctx = self.verbs();
        // SAFETY: a non-null `verbs` of a live id is its live context.
        p.retry_count = if !ctx.is_null() && unsafe { super::device::is_rxe(ctx) } {
            6
        } else {
            7
        };
        p.rnr_retry_count = 7;
        p
    }

    /// Connects (client), sending `private`; returns the server's private data.
    ///
    /// # Errors
    /// The `rdma_connect` error, or the failure event (rejected, unreachable).
    pub fn connect(&self, private: &[u8], timeout: Duration) -> Result<Vec<u8>, VerbsError> {
        let mut p = self.conn_param(private);
        // SAFETY: live id with a QP; `p` and the private data live across the call.
        if unsafe { ffi::rdma_connect(self.id, &mut p) } != 0 {
            return Err(last("rdma_connect"));
        }
        Ok(self
            .wait(ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED, timeout)?
            .private)
    }

    /// Accepts (server), sending `private`, and waits for the connection to be established.
    ///
    /// # Errors
    /// The `rdma_accept` error, or the failure event.
    pub fn accept(&self, private: &[u8], timeout: Duration) -> Result<(), VerbsError> {
        let mut p = self.conn_param(private);
        // SAFETY: live id with a QP; `p` lives across the call.
        if unsafe { ffi::rdma_accept(self.id, &mut p) } != 0 {
            return Err(last("rdma_accept"));
        }
        self.wait(ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED, timeout)?;
        Ok(())
    }

    /// Waits for the next event on this id's channel, which must be `want`.
    ///
    /// # Errors
    /// A timeout, or an event of another type (its name and status in the error).
    pub fn wait(
        &self,
        want: ffi::rdma_cm_event_type::Type,
        timeout: Duration,
    ) -> Result<Event, VerbsError> {
        // SAFETY: live channel: `fd` is its file descriptor.
        let fd = unsafe { (*self.ch).fd };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut ev = std::ptr::null_mut();
        loop {
            let left = deadline.map_or(timeout, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(last("poll on the rdma_cm event channel"));
            }
            if n == 0 {
                return Err(timed_out("rdma_get_cm_event (timed out)"));
            }
            // SAFETY: live channel, non-blocking; acknowledged below.
            if unsafe { ffi::rdma_get_cm_event(self.ch, &mut ev) } == 0 {
                break;
            }
            let e = last("rdma_get_cm_event");
            // Another thread waiting on the same channel took the event.
            if e.source.kind() != std::io::ErrorKind::WouldBlock {
                return Err(e);
            }
        }
        // SAFETY: a live event until acknowledged; the private data is copied out first.
        let (kind, status, id, private, ud) = unsafe {
            let e = &*ev;
            let conn = &e.param.conn;
            let private = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data as *const u8,
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            // The union's `ud` member, read (as plain bytes) only for a join.
            let ud = (e.event == ffi::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_JOIN)
                .then_some(e.param.ud)
                .map(|u| (u.ah_attr, u.qkey));
            (e.event, e.status, e.id, private, ud)
        };
        // SAFETY: acknowledged once.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        if kind != want || status != 0 {
            // SAFETY: rdma_event_str returns a static string.
            let name = unsafe { std::ffi::CStr::from_ptr(ffi::rdma_event_str(kind)) };
            let msg = format!("rdma_cm event {} (status {status})", name.to_string_lossy());
            return Err(VerbsError {
                call: "rdma_get_cm_event",
                source: std::io::Error::other(msg),
            });
        }
        Ok(Event { id, private, ud })
    }

    /// Binds the id to `local` (the address of the RDMA device's port) and joins the
    /// multicast group `group` (`rdma_join_multicast`: on InfiniBand the subnet manager's
    /// join, `ib_sa_join_multicast`; on RoCE the kernel's `cma_iboe_join_multicast`, with
    /// the IGMP/MLD join of RoCE v2). Returns the group's address vector and Q_Key from the
    /// `RDMA_CM_EVENT_MULTICAST_JOIN` event. The id leaves the group when destroyed.
    ///
    /// # Errors
    /// The `rdma_bind_addr` / `rdma_join_multicast` error, a timeout, or the failure event
    /// (`RDMA_CM_EVENT_MULTICAST_ERROR`).
    pub fn join_multicast(
        &self,
        local: &SocketAddr,
        group: &SocketAddr,
        timeout: Duration,
    ) -> Result<(crate::address::AhAttr, u32), VerbsError> {
        let (mut ss, _) = sockaddr(local);
        // SAFETY: live id; `ss` holds a sockaddr of the right family.
        if unsafe { ffi::rdma_bind_addr(self.id, &mut ss as *mut _ as *mut _) } != 0 {
            return Err(last("rdma_bind_addr"));
        }
        let (mut g, _) = sockaddr(group);
        // SAFETY: live, bound id; `g` holds a sockaddr; no user context.
        if unsafe {
            ffi::rdma_join_multicast(self.id, &mut g as *mut _ as *mut _, std::ptr::null_mut())
        } != 0
        {
            return Err(last("rdma_join_multicast"));
        }
        let e = self.wait(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_JOIN,
            timeout,
        )?;
        e.ud.map(|(ah, qkey)| (super::objects::attr_of(&ah), qkey))
            .ok_or_else(|| timed_out("rdma_cm multicast join (no address vector)"))
    }

    /// The name of the device the id is bound to (None before a bind, route or request).
    pub fn device_name(&self) -> Option<String> {
        let ctx = self.verbs();
        if ctx.is_null() {
            return None;
        }
        // SAFETY: a live context of a live id; the name is a NUL-terminated string of the
        // device.
        let name = unsafe { std::ffi::CStr::from_ptr(ffi::ibv_get_device_name((*ctx).device)) };
        Some(name.to_string_lossy().into_owned())
    }

    /// The device context the id is bound to (null before a route or request).
    pub fn verbs(&self) -> *mut ffi::ibv_context {
        // SAFETY: live id.
        unsafe { (*self.id).verbs }
    }

    /// The port the id uses.
    pub fn port(&self) -> u8 {
        // SAFETY: live id.
        unsafe { (*self.id).port_num }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP on the id was destroyed first (the connection drops it before the id);
        // the id and channel are destroyed once, id first.
        unsafe {
            ffi::rdma_disconnect(self.id);
            ffi::rdma_destroy_id(self.id);
            ffi::rdma_destroy_event_channel(self.ch);
        }
    }
}
