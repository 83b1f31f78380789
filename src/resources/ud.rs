//! Unreliable-datagram QPs: ready at creation, one datagram per send to any address handle,
//! receives with the 40-byte GRH area, multicast groups.

use super::ah::{AddressHandle, UdEndpoint};
use super::qp::RecvSide;
use super::ud_verbs::{is_roce_multicast, VerbsUd};
use super::{Cq, Pd, Qp, QpCaps, QueuePair};
use crate::backend::{self, QpKind, QpRings, QpSpec};
use crate::data_path::DataPath;
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::queue::regions::RegionCheck;
use crate::verbs::ex::VerbsApi;
use mlx5::av::{DatagramSeg, MULTICAST_LID_BASE, PERMISSIVE_LID};
use mlx5::request::Payload;
use mlx5::request::Sge;
use mlx5::wqe::UdSend;

/// The QP number of a send to a multicast group (`0xffffff`, InfiniBand's multicast QPN).
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// The bit of a Q_Key reserved for privileged Q_Keys (IBA 10.2.4): a QP may have one only
/// with `CAP_NET_RAW` (the kernel refuses it otherwise); in a send, it means "use the
/// sending QP's own Q_Key".
pub const QKEY_PRIVILEGED: u32 = 0x8000_0000;

/// The Q_Key of the multicast groups the connection manager joins (`RDMA_UDP_QKEY`,
/// `0x01234567`: librdmacm's UDP port space, and the Q_Key the kernel's `rdma_cm` gives a
/// group it creates). A [`UdQp`] that joins with [`UdQp::join_multicast`] must have it.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// A multicast group joined through the connection manager ([`UdQp::join_multicast`]):
/// where to send to it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct McastGroup {
    /// The group's IP address.
    pub group: std::net::IpAddr,
    /// Its address (multicast GID, and on InfiniBand its multicast LID): an address handle
    /// made of it ([`Pd::create_ah`]) sends to the group, with [`MULTICAST_QPN`].
    pub ah: crate::address::AhAttr,
    /// The group's Q_Key.
    pub qkey: u32,
}

/// Creation options of a UD QP besides its [`QpCaps`] and Q_Key.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct UdOptions {
    /// Multicast loopback: a datagram sent to a group this QP is attached to reaches this
    /// QP too (on by default, as on mlx5; off is verbs'
    /// `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`).
    pub mcast_loopback: bool,
}

impl Default for UdOptions {
    fn default() -> Self {
        UdOptions {
            mcast_loopback: true,
        }
    }
}

/// An unreliable-datagram queue pair.
///
/// Created ready to send and receive ([`Pd::create_ud_qp`]: RESET -> INIT with its Q_Key
/// -> RTR -> RTS, no connection). Each send names its destination: an [`AddressHandle`]
/// (made once per peer port or multicast group with [`Pd::create_ah`]), the remote QP
/// number and Q_Key. A datagram is one packet: at most [`UdQp::mtu`] bytes. Nothing
/// acknowledges it: the send completes when it left, and a datagram that finds no receive
/// posted, or a receiver with another Q_Key, is dropped without a trace at either end.
/// A receive reserves its first 40 bytes for the Global Route Header ([`crate::Grh`]): the
/// payload lands after them and the completion's `byte_len` counts them.
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, Grh, Payload, PostFlags, PostSend, QpCaps, QueuePair, WcOpcode};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let (mut cq_a, mut cq_b) = (dev.create_cq(64)?, dev.create_cq(64)?);
/// let mut a = pd.create_ud_qp(&cq_a, &cq_a, QpCaps::default(), 0x1111)?;
/// let mut b = pd.create_ud_qp(&cq_b, &cq_b, QpCaps::default(), 0x2222)?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
/// b.post_recv(&[mr.sge(0, 40 + 64)?], 7)?;          // 40 bytes of GRH area + payload
/// let to_b = b.endpoint();                            // exchanged out of band
/// let ah = pd.create_ah(to_b)?;
/// a.send_to(&ah, to_b.qpn, to_b.qkey, Payload::Inline(b"hello"), 1, PostFlags::SIGNALED)?;
/// dev.process();
/// let mut out = [Completion::default(); 2];
/// assert_eq!(cq_a.poll(&mut out), 1);
/// assert_eq!((out[0].cookie, out[0].opcode), (1, WcOpcode::Send));
/// assert_eq!(cq_b.poll(&mut out), 1);
/// assert_eq!((out[0].cookie, out[0].byte_len, out[0].src_qp), (7, 40 + 5, a.qpn()));
/// assert!(out[0].grh);
/// let mut buf = [0u8; 45];
/// mr.read(0, &mut buf)?;
/// assert_eq!(&buf[40..], b"hello");
/// let grh = Grh::parse(&buf).unwrap();
/// assert_eq!(grh.sgid, a.endpoint().gid);
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
pub struct UdQp {
    path: UdPath,
    qkey: u32,
    mtu: u32,
    lid: u16,
    gid: [u8; 16],
    /// Whether the port is Ethernet (RoCE: a multicast group has no LID).
    ethernet: bool,
    /// The multicast groups the QP is attached to (`ibv_attach_mcast`), on either path:
    /// detached before its QP is destroyed (the kernel refuses to destroy a QP with
    /// attachments, `EBUSY`).
    groups: Vec<([u8; 16], u16)>,
    /// On a device whose UD on-demand paging has no receive (`ud_odp_caps` without
    /// `IBV_ODP_SUPPORT_RECV`, as every ConnectX): the domain's regions, to refuse receives
    /// into on-demand and dma-buf ones before posting.
    odp_refusal: Option<Box<RegionCheck>>,
    /// The groups joined through the connection manager, each with its membership (left
    /// when it is dropped, after the QP detached: field order).
    joins: Vec<(McastGroup, backend::Membership)>,
    /// The device, for joins.
    dev: backend::Dev,
}

/// Which data path runs a UD QP.
enum UdPath {
    /// The direct path: a QP of the crate's own rings (the software NIC's, or on mlx5 the
    /// rings of an rdma-core UD QP from `mlx5dv_init_obj`).
    Direct(Qp),
    /// The verbs path (rxe and other rdma-core devices; mlx5 with `BLUEFLAME_PATH=verbs`):
    /// an rdma-core UD QP (`src/resources/ud_verbs.rs`).
    Verbs(VerbsUd),
}

impl core::fmt::Debug for UdQp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UdQp")
            .field("qpn", &self.qpn())
            .field("qkey", &self.qkey)
            .field("mtu", &self.mtu)
            .finish()
    }
}

impl Pd {
    /// Creates a UD QP with Q_Key `qkey` whose sends complete on `send_cq` and receives on
    /// `recv_cq` (they may be the same CQ), ready to send and receive.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a Q_Key with the privileged bit
    /// ([`QKEY_PRIVILEGED`]); as [`Pd::create_qp`] for the CQs and capabilities (on
    /// rdma-core devices [`Error::Verbs`] from `ibv_create_qp_ex` or `ibv_modify_qp`);
    /// [`Error::CompressedUdReceives`] for a receive CQ that compresses its entries (a
    /// mini-CQE names no sender); [`Error::Unsupported`] for `UdOptions::mcast_loopback = false` on rdma-core devices,
    /// and on mlx5's direct path with `MLX5_QP_SIGNATURE` set.
    pub fn create_ud_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        qkey: u32,
    ) -> Result<UdQp> {
        self.create_ud_qp_with(send_cq, recv_cq, caps, qkey, UdOptions::default())
    }

    /// As [`Pd::create_ud_qp`], with [`UdOptions`].
    ///
    /// # Errors
    /// As [`Pd::create_ud_qp`].
    pub fn create_ud_qp_with(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        qkey: u32,
        opts: UdOptions,
    ) -> Result<UdQp> {
        if qkey & QKEY_PRIVILEGED != 0 {
            return Err(Error::InvalidParameter {
                what: "Q_Key with the high bit set (privileged: the kernel refuses it without \
                       CAP_NET_RAW)",
                value: qkey as u64,
            });
        }
        self.check_cqs(send_cq, &recv_cq.handle, &recv_cq.dev, recv_cq.cqn())?;
        if recv_cq.compressed() {
            return Err(Error::CompressedUdReceives { cqn: recv_cq.cqn() });
        }
        // rdma-core's MLX5_* switches for this QP (`Dev::qp_env`).
        let env = self.inner.dev.backend.qp_env();
        let spec = QpSpec {
            caps,
            send_cq: &send_cq.handle.kind,
            kind: QpKind::Ud {
                recv_cq: &recv_cq.handle.kind,
                qkey,
                mcast_loopback: opts.mcast_loopback,
            },
            env: &env,
        };
        let (obj, rings, qpn) = self.inner.pd.create_qp(&spec)?;
        let port = obj.ud_port()?;
        let path = match rings {
            // The verbs path (rxe and the others; a ConnectX with BLUEFLAME_PATH=verbs).
            QpRings::Verbs {
                qp,
                rxe,
                provider_copies,
            } => UdPath::Verbs(VerbsUd::assemble(
                self,
                (obj, qp, rxe, provider_copies, qpn),
                send_cq,
                recv_cq,
                port.mtu,
            )),
            // The direct path (the software NIC; mlx5: rdma-core's UD QP, INIT with the
            // Q_Key, RTR, RTS, driven through its rings as UCX's uct_ud_mlx5 iface does,
            // `uct_ib_mlx5_get_txwq` / `uct_ib_mlx5_get_rxwq`), registered on the direct CQs
            // as an RC QP's queues are.
            rings => {
                let made = (obj, rings, qpn);
                let recv = RecvSide::cq(recv_cq);
                let mut qp = self.assemble(made, send_cq, recv, &env, caps.rnr_retry, None)?;
                qp.mark_ud();
                qp.mark_connected();
                UdPath::Direct(qp)
            }
        };
        Ok(UdQp {
            path,
            qkey,
            mtu: port.mtu,
            lid: port.lid,
            gid: port.gid,
            ethernet: port.ethernet,
            groups: Vec::new(),
            odp_refusal: (!self.inner.dev.odp_caps().ud_recv())
                .then(|| Box::new(RegionCheck::new(self.inner.regions.clone()))),
            joins: Vec::new(),
            dev: self.inner.dev.backend.clone(),
        })
    }
}

/// The bytes a payload carries (u64: a gather list may sum past u32).
fn payload_len(data: &Payload<'_>) -> u64 {
    match data {
        Payload::Inline(b) => b.len() as u64,
        Payload::Sgl(s) => s.iter().map(|e| e.len as u64).sum(),
    }
}

impl UdQp {
    /// The QP's Q_Key.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// The largest datagram: the port's active MTU (one packet per message).
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// What a peer needs to send to this QP (its port's LID and GID, QP number, Q_Key).
    pub fn endpoint(&self) -> UdEndpoint {
        UdEndpoint {
            qpn: self.qpn(),
            qkey: self.qkey,
            lid: self.lid,
            gid: self.gid,
        }
    }

    /// Sends one datagram of `data` to QP `remote_qpn` (Q_Key `remote_qkey`) at the address
    /// of `ah`. A Q_Key with the high bit set ([`QKEY_PRIVILEGED`]) sends with this QP's own
    /// Q_Key instead, as the InfiniBand specification says.
    ///
    /// # Errors
    /// [`Error::MessageTooLong`] for more than [`UdQp::mtu`] bytes (refused here: on the
    /// wire it would fail the QP's send queue); [`Error::InvalidHandle`] for an address handle of
    /// another protection domain; [`Error::InvalidParameter`] for a QP number above 24 bits;
    /// as [`crate::PostSend::post`] for the payload and queue room. Nothing is posted on an error.
    /// An address handle always names a port ([`Pd::create_ah`] refuses an address without
    /// a LID or GID), so no send checks its address again.
    #[inline]
    pub fn send_to(
        &mut self,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        data: Payload<'_>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post_to(ah, remote_qpn, remote_qkey, data, None, cookie, flags)
    }

    /// As [`UdQp::send_to`], with a 32-bit immediate (host order) that the receiver's
    /// completion carries.
    ///
    /// # Errors
    /// As [`UdQp::send_to`].
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn send_imm_to(
        &mut self,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        data: Payload<'_>,
        imm: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post_to(ah, remote_qpn, remote_qkey, data, Some(imm), cookie, flags)
    }

    #[allow(clippy::too_many_arguments)]
    fn post_to(
        &mut self,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        data: Payload<'_>,
        imm: Option<u32>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        if !std::sync::Arc::ptr_eq(&ah.pd.inner, &self.pd().inner) {
            return Err(Error::InvalidHandle {
                what: "address handle of another protection domain (its destination LID)",
                value: ah.attr().dlid as u64,
            });
        }
        if remote_qpn > 0xff_ffff {
            return Err(Error::InvalidParameter {
                what: "remote QP number (24 bits)",
                value: remote_qpn as u64,
            });
        }
        let len = payload_len(&data);
        if len > self.mtu as u64 {
            return Err(Error::MessageTooLong { len, mtu: self.mtu });
        }
        // IBA C10-15: a Q_Key with the high bit set sends with the QP's own Q_Key. Put in
        // the request here, as rdma-core's hns and the kernel's erdma, mthca and mlx4 (for
        // the headers they build) do: rxe sends `remote_qkey` as it is (`init_req_packet`)
        // and its receiver drops it (`check_keys`).
        let remote_qkey = if remote_qkey & QKEY_PRIVILEGED != 0 {
            self.qkey
        } else {
            remote_qkey
        };
        match &mut self.path {
            UdPath::Direct(qp) => {
                let send = UdSend {
                    dgram: DatagramSeg::ud(&ah.av, remote_qpn, remote_qkey),
                    data,
                    imm,
                };
                qp.direct_sq()?.post_ud(&send, cookie, flags)
            }
            UdPath::Verbs(v) => {
                let a = ah.verbs.as_ref().ok_or(Error::InvalidHandle {
                    what: "address handle of another device (its destination LID)",
                    value: ah.attr().dlid as u64,
                })?;
                v.send(a, remote_qpn, remote_qkey, &data, imm, cookie, flags)
            }
        }
    }

    /// Posts a receive into `sgl`. Its first 40 bytes get the GRH of the datagram (or are
    /// left as they are when it has none: [`crate::Completion::grh`]); the payload follows.
    /// A receive shorter than 40 bytes + the datagram completes with a local length error
    /// and moves the QP to error.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] with the receive's length when it is under 40 bytes (no
    /// datagram fits: even an empty one needs the GRH area), or with the lkey of an entry in
    /// an on-demand or dma-buf region on a device whose UD on-demand paging has no receive
    /// (every ConnectX: the kernel reports `ud_odp_caps` SEND only); as
    /// [`crate::Qp::post_recv`].
    /// Nothing is posted on an error.
    pub fn post_recv(&mut self, sgl: &[Sge], cookie: u64) -> Result<()> {
        let room: u64 = sgl.iter().map(|s| s.len as u64).sum();
        if room < mlx5::grh::GRH_BYTES as u64 {
            return Err(Error::InvalidParameter {
                what: "UD receive length (at least the 40-byte GRH area)",
                value: room,
            });
        }
        if let Some(lkey) = self.odp_refusal.as_mut().and_then(|c| c.on_demand(sgl)) {
            return Err(Error::InvalidParameter {
                what: "UD receive into an on-demand or dma-buf region (lkey): the device's \
                       on-demand paging serves no UD receive (ud_odp_caps without RECV, as \
                       on every ConnectX)",
                value: lkey as u64,
            });
        }
        match &mut self.path {
            UdPath::Direct(qp) => qp.post_recv(sgl, cookie),
            UdPath::Verbs(v) => v.post_recv(sgl, cookie),
        }
    }

    /// Attaches the QP to the multicast group `gid` / `lid` (`ibv_attach_mcast`): datagrams
    /// sent to the group reach it (its own ones too, with [`UdOptions::mcast_loopback`]).
    /// On RoCE (the verbs path on an Ethernet port) the group is an IPv6 multicast GID or an
    /// IPv4-mapped multicast address (`::ffff:224.0.0.0/4`) and the LID is not used (pass
    /// 0); on rxe the host must also have joined the IPv4 group at the IP level (see the
    /// README, "UD on the verbs path"). Attaching tells only the NIC: a fabric forwards the
    /// group to this port once the port joined it (the subnet manager on InfiniBand, IGMP /
    /// MLD on RoCE; librdmacm's `rdma_join_multicast` does both: see the guide, "What a
    /// multicast group needs on each fabric").
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a GID that is not multicast (first byte 0xff; on
    /// RoCE also `::ffff:224.0.0.0/4`) or, on InfiniBand, a LID outside 0xc000..=0xfffe;
    /// the device's refusal otherwise.
    pub fn attach_mcast(&mut self, gid: [u8; 16], lid: u16) -> Result<()> {
        check_link_group(self.ethernet, &gid, lid)?;
        self.backend_qp()?.attach_mcast(gid, lid)?;
        if !self.groups.contains(&(gid, lid)) {
            self.groups.push((gid, lid));
        }
        Ok(())
    }

    /// Detaches the QP from a multicast group (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// As [`UdQp::attach_mcast`]; the device's refusal when the QP is not attached.
    pub fn detach_mcast(&mut self, gid: [u8; 16], lid: u16) -> Result<()> {
        check_link_group(self.ethernet, &gid, lid)?;
        self.backend_qp()?.detach_mcast(gid, lid)?;
        self.groups.retain(|g| *g != (gid, lid));
        Ok(())
    }

    /// Joins the multicast group `group` through the connection manager and attaches the QP
    /// to it: what a group needs beyond [`UdQp::attach_mcast`] on a fabric. `local` is the
    /// IP address of this device's port (its IPoIB or Ethernet interface). On InfiniBand the
    /// join is the subnet manager's (`rdma_join_multicast` -> `ib_sa_join_multicast`: the
    /// switches then forward the group, and the event gives its MGID, MLID and Q_Key); on
    /// RoCE v2 the kernel joins the IP group too (IGMP/MLD, `cma_iboe_join_multicast`), as
    /// snooping switches and rxe need. The QP must have the group's Q_Key
    /// ([`RDMA_UDP_QKEY`] for groups the connection manager creates). The membership lasts
    /// until [`UdQp::leave_multicast`] or the QP is dropped. On the software NIC the join is
    /// its subnet manager's, with the MGID the connection manager makes of `group`; behind
    /// its switch (`NicView::set_multicast_fabric`) a group reaches the port only while
    /// joined.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a group that is not multicast or not
    /// of `local`'s family, a `local` on another device or port, a group already joined, or
    /// (with the group's Q_Key) one whose Q_Key is not this QP's; [`Error::Verbs`] from
    /// librdmacm (no device on `local`, the join refused or unanswered for 10 s) or
    /// `ibv_attach_mcast`. Nothing stays joined on an error.
    pub fn join_multicast(
        &mut self,
        local: std::net::IpAddr,
        group: std::net::IpAddr,
    ) -> Result<McastGroup> {
        if self.joins.iter().any(|(g, _)| g.group == group) {
            return Err(Error::InvalidParameter {
                what: "multicast group already joined by this QP (its address's first byte)",
                value: match group {
                    std::net::IpAddr::V4(a) => a.octets()[0] as u64,
                    std::net::IpAddr::V6(a) => a.octets()[0] as u64,
                },
            });
        }
        let (membership, ah, qkey) = self.dev.join_multicast(local, group)?;
        if qkey != self.qkey {
            return Err(Error::InvalidParameter {
                what: "Q_Key of the joined group, not this QP's (create the UdQp with it: \
                       RDMA_UDP_QKEY for the connection manager's groups)",
                value: qkey as u64,
            });
        }
        let dgid = ah.grh.map(|g| g.dgid).unwrap_or_default();
        self.attach_mcast(dgid, ah.dlid)?;
        let joined = McastGroup { group, ah, qkey };
        self.joins.push((joined, membership));
        Ok(joined)
    }

    /// Leaves a group joined with [`UdQp::join_multicast`]: detaches the QP, then ends the
    /// membership.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] for a group this QP has not joined; as
    /// [`UdQp::detach_mcast`] (the membership ends anyway).
    pub fn leave_multicast(&mut self, group: std::net::IpAddr) -> Result<()> {
        let Some(i) = self.joins.iter().position(|(g, _)| g.group == group) else {
            return Err(Error::InvalidParameter {
                what: "multicast group not joined by this QP (its address's first byte)",
                value: match group {
                    std::net::IpAddr::V4(a) => a.octets()[0] as u64,
                    std::net::IpAddr::V6(a) => a.octets()[0] as u64,
                },
            });
        };
        let (g, membership) = self.joins.remove(i);
        let dgid = g.ah.grh.map(|r| r.dgid).unwrap_or_default();
        let detached = self.detach_mcast(dgid, g.ah.dlid);
        drop(membership);
        detached
    }

    /// The backend's QP.
    fn backend_qp(&self) -> Result<&backend::Qp> {
        match &self.path {
            UdPath::Direct(qp) => qp
                .backend_qp()
                .ok_or(Error::InvalidState { state: "destroyed" }),
            UdPath::Verbs(v) => Ok(v.backend_qp()),
        }
    }
}

impl QueuePair for UdQp {
    fn qpn(&self) -> u32 {
        match &self.path {
            UdPath::Direct(qp) => qp.qpn(),
            UdPath::Verbs(v) => v.qpn(),
        }
    }

    fn pd(&self) -> &Pd {
        match &self.path {
            UdPath::Direct(qp) => qp.pd(),
            UdPath::Verbs(v) => v.pd(),
        }
    }

    fn data_path(&self) -> DataPath {
        match &self.path {
            UdPath::Direct(qp) => qp.data_path(),
            UdPath::Verbs(_) => DataPath::Verbs,
        }
    }

    fn verbs_api(&self) -> Option<VerbsApi> {
        match &self.path {
            UdPath::Direct(_) => None,
            UdPath::Verbs(v) => Some(v.api()),
        }
    }

    fn free_send(&self) -> u32 {
        match &self.path {
            UdPath::Direct(qp) => qp.free_send(),
            UdPath::Verbs(v) => v.room().0,
        }
    }

    fn send_depth(&self) -> u32 {
        match &self.path {
            UdPath::Direct(qp) => qp.send_depth(),
            UdPath::Verbs(v) => v.room().1,
        }
    }

    fn free_recv(&self) -> u32 {
        match &self.path {
            UdPath::Direct(qp) => qp.free_recv(),
            UdPath::Verbs(v) => v.room().2,
        }
    }

    fn recv_depth(&self) -> u32 {
        match &self.path {
            UdPath::Direct(qp) => qp.recv_depth(),
            UdPath::Verbs(v) => v.room().3,
        }
    }

    fn set_error(&mut self) -> Result<()> {
        match &mut self.path {
            UdPath::Direct(qp) => qp.set_error(),
            UdPath::Verbs(v) => v.set_error(),
        }
    }

    fn check(&self) -> Result<()> {
        match &self.path {
            UdPath::Direct(qp) => qp.check(),
            UdPath::Verbs(v) => v.check(),
        }
    }

    /// The device's (a UD QP posts no atomics).
    fn atomic_caps(&self) -> mlx5::AtomicCaps {
        self.pd().device().atomic_caps()
    }
}

impl Drop for UdQp {
    /// Leaves the QP's multicast groups before the QP goes (the kernel refuses
    /// `ibv_destroy_qp` with attachments, `EBUSY`, `uverbs_free_qp`).
    fn drop(&mut self) {
        let groups = std::mem::take(&mut self.groups);
        if let Ok(qp) = self.backend_qp() {
            for (gid, lid) in groups {
                let _ = qp.detach_mcast(gid, lid);
            }
        }
    }
}

/// The kernel's checks of `ibv_attach_mcast` for an rdma-core UD QP: on an Ethernet port
/// `rdma_is_multicast_addr` (the LID is ignored), on InfiniBand as [`check_group`].
fn check_link_group(ethernet: bool, gid: &[u8; 16], lid: u16) -> Result<()> {
    if !ethernet {
        return check_group(gid, lid);
    }
    if !is_roce_multicast(gid) {
        return Err(Error::InvalidParameter {
            what: "multicast GID (ff00::/8 or ::ffff:224.0.0.0/4 on RoCE; first byte given)",
            value: gid[0] as u64,
        });
    }
    Ok(())
}

/// The kernel's checks of `ibv_attach_mcast` on an InfiniBand port (`EINVAL` otherwise).
fn check_group(gid: &[u8; 16], lid: u16) -> Result<()> {
    if gid[0] != 0xff {
        return Err(Error::InvalidParameter {
            what: "multicast GID (its first byte must be 0xff; first byte given)",
            value: gid[0] as u64,
        });
    }
    if !(MULTICAST_LID_BASE..PERMISSIVE_LID).contains(&lid) {
        return Err(Error::InvalidParameter {
            what: "multicast LID (0xc000..=0xfffe)",
            value: lid as u64,
        });
    }
    Ok(())
}
