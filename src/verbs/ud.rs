//! Unreliable-datagram QPs over rdma-core: creation (`ibv_create_qp_ex` with `IBV_QPT_UD`),
//! the UD state transitions, address handles (`ibv_create_ah`), multicast
//! (`ibv_attach_mcast` / `ibv_detach_mcast`) and the sends of the verbs data path:
//! `ibv_post_send` with `wr.ud`, or, on a QP created with the extended API,
//! `ibv_wr_send` / `ibv_wr_send_imm` + `ibv_wr_set_ud_addr` (chosen at creation as for RC,
//! [`super::ex::ApiChoice`]).
//!
//! A UD send carries at most one path MTU of payload (there is no segmentation: a longer
//! one is refused before posting); each receive gets the 40-byte GRH (or 40 undefined bytes
//! without one) in front of the payload, so a receive for `n` bytes of payload needs
//! `n + 40` bytes of buffer, as perftest's `ib_send_lat -c UD` sizes them (`UD_ADDITION`).
//!
//! The send and receive queues are the verbs path's own ([`VerbsSendQueue`],
//! [`super::path::VerbsRecvQueue`]): the same cookies, completion moderation, CQ
//! accounting, flushes and refusals as RC.

use super::ex::{ud_send_ops_flags, ApiChoice, UdSendOps, VerbsApi};
use super::objects::{Caps, Cq, Pd, Qp};
use super::path::{VerbsSendQueue, MAX_BATCH};
use super::{code, last, VerbsError};
use crate::completion::WcOpcode;
use crate::error::{Error, QueueUnit, Result};
use crate::queue::flags::PostFlags;
use crate::{Fence, Payload};
use rdma_sys as ffi;
use std::sync::Arc;

/// Bytes of the global route header in front of every UD receive's payload.
pub const GRH_BYTES: u32 = 40;

/// The path MTU in bytes of a verbs MTU enum (`IBV_MTU_256` = 1 ... `IBV_MTU_4096` = 5);
/// 0 for a value outside it.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// The creation attributes of a UD QP; with `extended`, the UD `ibv_wr_*` opcodes.
fn ud_init_attr(
    send_cq: &Cq,
    recv_cq: &Cq,
    caps: &Caps,
    pd: *mut ffi::ibv_pd,
    extended: bool,
) -> ffi::ibv_qp_init_attr_ex {
    let mut attr =
        super::objects::base_init_attr(send_cq, recv_cq, caps, pd, ffi::ibv_qp_type::IBV_QPT_UD);
    if extended {
        attr.comp_mask |= ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
        attr.send_ops_flags = ud_send_ops_flags();
    }
    attr
}

impl Qp {
    /// Creates a UD QP in RESET on `pd` (then [`Qp::ud_ready`]); with the extended UD send
    /// operations when `api` wants them and the provider has them, else `ibv_post_send`;
    /// with `thread_domain`, on a thread domain of its own when the device gives one (its
    /// BlueFlame register is its own: mlx5's direct path, as for RC).
    ///
    /// # Errors
    /// The `ibv_create_qp_ex` error; [`Error::Unsupported`] when `api` requires the
    /// extended operations and the provider refuses them.
    pub fn new_ud(
        pd: Arc<Pd>,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        caps: Caps,
        api: ApiChoice,
        thread_domain: bool,
    ) -> Result<Qp> {
        let td = super::objects::thread_domain(&pd, thread_domain);
        let on = super::objects::qp_pd(&pd, &td);
        let create = |ex: bool| {
            let mut attr = ud_init_attr(&send_cq, &recv_cq, &caps, on, ex);
            // SAFETY: live context, (parent) PD and CQs; `attr` is a valid in/out parameter.
            let qp = unsafe { super::ex::create_qp_ex(pd.ctx.ctx, &mut attr) };
            (qp, attr)
        };
        let caps_of = |a: &ffi::ibv_qp_init_attr_ex| Caps {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline: a.cap.max_inline_data,
        };
        let mut made = None;
        if api.wants_extended() {
            let (qp, attr) = create(true);
            if !qp.is_null() {
                // SAFETY: created just above; the ops are used while the Qp lives.
                match unsafe { UdSendOps::of(qp) } {
                    Some(ops) => made = Some((qp, caps_of(&attr), Some(ops))),
                    // SAFETY: created above, used by nothing.
                    None => unsafe {
                        ffi::ibv_destroy_qp(qp);
                    },
                }
            }
            if made.is_none() {
                api.unavailable(
                    "BLUEFLAME_VERBS_API=extended: the provider refused the extended UD send operations",
                )?;
            }
        }
        let (qp, real, ud_ops) = match made {
            Some(m) => m,
            None => {
                let (qp, attr) = create(false);
                if qp.is_null() {
                    return Err(Error::Verbs(last("ibv_create_qp_ex")));
                }
                (qp, caps_of(&attr), None)
            }
        };
        Ok(Qp {
            qp,
            caps: real,
            send_ops: None,
            ud_ops,
            cm_id: None,
            td,
            pd,
            _cqs: [send_cq, recv_cq],
            _srq: None,
            recv_targets: Default::default(),
        })
    }

    /// Whether this QP was created as a UD QP with the extended send operations.
    pub fn ud_api(&self) -> VerbsApi {
        self.api()
    }

    /// RESET -> INIT (P_Key index 0, `port`, Q_Key `qkey`) -> RTR -> RTS (send PSN `psn`):
    /// the UD transitions (no address, no path MTU: each send names its own address
    /// handle).
    ///
    /// # Errors
    /// The `ibv_modify_qp` error.
    pub fn ud_ready(&self, port: u8, qkey: u32, psn: u32) -> std::result::Result<(), VerbsError> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: zeroed attributes are valid; the masked ones are set.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        self.modify(
            &mut a,
            M::IBV_QP_STATE.0 | M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_PORT.0 | M::IBV_QP_QKEY.0,
        )?;
        // SAFETY: as above.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, M::IBV_QP_STATE.0)?;
        // SAFETY: as above.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = psn & 0xff_ffff;
        self.modify(&mut a, M::IBV_QP_STATE.0 | M::IBV_QP_SQ_PSN.0)
    }

    /// Joins the multicast group `gid` / `lid` (`ibv_attach_mcast`; `lid` is 0 on RoCE).
    ///
    /// # Errors
    /// The `ibv_attach_mcast` error (`EINVAL` for a GID that is not multicast, or a QP that
    /// is not UD).
    pub fn attach_mcast(&self, gid: &[u8; 16], lid: u16) -> std::result::Result<(), VerbsError> {
        let g = ffi::ibv_gid { raw: *gid };
        // SAFETY: live QP; `g` is valid for the call, which copies it.
        let rc = unsafe { ffi::ibv_attach_mcast(self.qp, &g, lid) };
        if rc != 0 {
            return Err(code("ibv_attach_mcast", rc));
        }
        Ok(())
    }

    /// Leaves the multicast group `gid` / `lid` (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// The `ibv_detach_mcast` error (`EINVAL` when the QP is not attached to it).
    pub fn detach_mcast(&self, gid: &[u8; 16], lid: u16) -> std::result::Result<(), VerbsError> {
        let g = ffi::ibv_gid { raw: *gid };
        // SAFETY: as in `attach_mcast`.
        let rc = unsafe { ffi::ibv_detach_mcast(self.qp, &g, lid) };
        if rc != 0 {
            return Err(code("ibv_detach_mcast", rc));
        }
        Ok(())
    }
}

/// An address handle (`ibv_create_ah`), destroyed when the last reference drops: the UD send
/// queue holds one for each request naming it until the request completed
/// ([`VerbsUdSendQueue`]), as verbs requires (rxe resolves the address when the AH is created
/// and its kernel requester looks the AH up by number when it processes each WQE; mlx5
/// copies it into each WQE).
pub struct Ah {
    pub(crate) ah: *mut ffi::ibv_ah,
    _pd: Arc<Pd>,
}

// SAFETY: as for Pd: the wrapper only holds the pointer; rdma-core's calls on it are
// thread-safe and a posted request keeps no reference to the user-space object.
unsafe impl Send for Ah {}
// SAFETY: as above.
unsafe impl Sync for Ah {}

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ah").finish_non_exhaustive()
    }
}

impl Ah {
    /// An address handle on `pd` for `attr` (`struct ibv_ah_attr`; with a global route:
    /// `is_global`, `dgid`, `flow_label`, `sgid_index`, `hop_limit`, `traffic_class`, as
    /// perftest's and UCX's UD address handles). The fields go to verbs as they are: the
    /// caller maps the GID index.
    ///
    /// # Errors
    /// The `ibv_create_ah` error (e.g. no route to the GID's address on RoCE).
    pub fn new(pd: Arc<Pd>, attr: &crate::AhAttr) -> std::result::Result<Ah, VerbsError> {
        // SAFETY: zeroed attributes are valid (no GRH, SL 0, static rate 0).
        let mut a: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.dlid = attr.dlid;
        a.sl = attr.sl;
        a.src_path_bits = attr.src_path_bits;
        a.static_rate = attr.static_rate;
        a.port_num = attr.port;
        if let Some(g) = attr.grh {
            a.is_global = 1;
            a.grh.dgid.raw = g.dgid;
            a.grh.flow_label = g.flow_label & 0xf_ffff;
            a.grh.sgid_index = g.sgid_index;
            a.grh.hop_limit = g.hop_limit;
            a.grh.traffic_class = g.traffic_class;
        }
        // SAFETY: live PD; `a` is valid for the call, which copies it.
        let ah = unsafe { ffi::ibv_create_ah(pd.pd, &mut a) };
        if ah.is_null() {
            return Err(last("ibv_create_ah"));
        }
        Ok(Ah { ah, _pd: pd })
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe { ffi::ibv_destroy_ah(self.ah) };
    }
}

/// The send side of a UD QP on the verbs path: [`VerbsSendQueue`]'s queue, moderation and
/// CQ accounting, with sends addressed by an [`Ah`], a QP number and a Q_Key, each at most
/// one path MTU long.
pub struct VerbsUdSendQueue {
    sq: VerbsSendQueue,
    mtu: u32,
    /// The address handle of each request, by its sequence number modulo the length: kept
    /// until the slot is reused, which is after the request completed (the queue holds at
    /// most its capacity, at most this length). The provider may read an AH after the post
    /// returned (rxe: the kernel's requester looks the AH up by number when it processes the
    /// WQE, which can be after `ibv_post_send` returned when its task was busy elsewhere; a
    /// destroyed AH then fails the send with `LocQpOpErr` and the QP), and verbs forbids
    /// destroying an AH that outstanding requests name.
    ahs: Box<[Option<Arc<Ah>>]>,
}

impl std::fmt::Debug for VerbsUdSendQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsUdSendQueue")
            .field("sq", &self.sq)
            .field("mtu", &self.mtu)
            .finish()
    }
}

/// The bytes a payload carries.
fn payload_len(data: &Payload<'_>) -> u64 {
    match data {
        Payload::Sgl(sgl) => sgl.iter().map(|s| s.len as u64).sum(),
        Payload::Inline(b) => b.len() as u64,
    }
}

impl VerbsUdSendQueue {
    /// The send queue of the UD QP `qp`, whose sends carry at most `mtu` bytes (the port's
    /// active MTU in bytes, [`mtu_bytes`]).
    pub fn new(qp: Arc<Qp>, mtu: u32) -> VerbsUdSendQueue {
        let sq = VerbsSendQueue::new(qp);
        let len = sq.capacity().max(1).next_power_of_two() as usize;
        VerbsUdSendQueue {
            sq,
            mtu,
            ahs: (0..len).map(|_| None).collect(),
        }
    }

    /// The largest payload of one send (the path MTU).
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The queue underneath (room, capacity, CQ accounting, gather-list workaround).
    pub fn queue(&mut self) -> &mut VerbsSendQueue {
        &mut self.sq
    }

    /// Requests that can be posted now.
    pub fn free(&self) -> u32 {
        self.sq.free()
    }

    /// The queue's cookie table (shared with the CQ poller).
    pub(crate) fn shadow(
        &self,
    ) -> Arc<crate::queue::shadow::Shadow<crate::queue::shadow::SendEntry>> {
        self.sq.shadow.clone()
    }

    /// Requests the queue was created for.
    pub fn capacity(&self) -> u32 {
        self.sq.capacity()
    }

    /// Queues one send of `data` to QP `remote_qpn` behind `ah` (an address handle of this
    /// QP's protection domain, held until the request completed) with Q_Key `remote_qkey`
    /// (with immediate `imm` when Some) for the next [`VerbsUdSendQueue::ring`]; everything
    /// is checked first. A fence is meaningless on UD (no reads or atomics to wait for) and
    /// is not set.
    ///
    /// # Errors
    /// [`Error::MessageTooLong`] above the MTU; as [`VerbsSendQueue::push`]:
    /// [`Error::QueueFull`], [`Error::CqFull`], [`Error::TooManySge`],
    /// [`Error::InlineTooLong`], [`Error::InvalidParameter`] for a gather entry above 2 GiB.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        ah: &Arc<Ah>,
        remote_qpn: u32,
        remote_qkey: u32,
        data: &Payload<'_>,
        imm: Option<u32>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let len = payload_len(data);
        if len > self.mtu as u64 {
            return Err(Error::MessageTooLong { len, mtu: self.mtu });
        }
        let sq = &mut self.sq;
        if sq.pending == MAX_BATCH {
            return Err(Error::QueueFull {
                needed: 1,
                free: 0,
                unit: QueueUnit::SendRequests,
            });
        }
        sq.check_room()?;
        let slot = sq.pending;
        let mut send_flags = 0u32;
        let nsge = sq.stage(slot, data, &mut send_flags)?;
        // SAFETY: an all-zero ibv_send_wr (null pointers, zero counts) is a valid value.
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr.ud = ffi::ud_t {
            ah: ah.ah,
            remote_qpn,
            remote_qkey,
        };
        let opcode = match imm {
            Some(imm) => {
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
            }
            None => ffi::ibv_wr_opcode::IBV_WR_SEND,
        };
        let flags = PostFlags {
            fence: Fence::None,
            ..flags
        };
        let at = sq.position() as usize & (self.ahs.len() - 1);
        self.ahs[at] = Some(ah.clone());
        let sq = &mut self.sq;
        sq.enqueue(
            wr,
            opcode,
            (WcOpcode::Send, 0),
            nsge,
            send_flags,
            cookie,
            flags,
        );
        Ok(())
    }

    /// Posts the queued sends (`ibv_wr_start` ... `ibv_wr_complete` on an extended QP, else
    /// one `ibv_post_send`).
    ///
    /// # Errors
    /// As [`VerbsSendQueue::ring`]: the refused requests' space is given back.
    pub fn ring(&mut self) -> Result<()> {
        self.sq.ring()
    }

    /// Drops the queued sends (a batch that was not rung).
    pub fn rewind(&mut self) {
        self.sq.rewind()
    }

    /// Sends queued and not yet rung.
    pub fn pending(&self) -> usize {
        self.sq.pending()
    }

    /// One send now: [`VerbsUdSendQueue::push`] then [`VerbsUdSendQueue::ring`] (anything
    /// queued before is posted with it).
    ///
    /// # Errors
    /// As [`VerbsUdSendQueue::push`] and [`VerbsUdSendQueue::ring`]; nothing is posted on
    /// an error of `push`.
    #[allow(clippy::too_many_arguments)]
    pub fn post(
        &mut self,
        ah: &Arc<Ah>,
        remote_qpn: u32,
        remote_qkey: u32,
        data: &Payload<'_>,
        imm: Option<u32>,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.push(ah, remote_qpn, remote_qkey, data, imm, cookie, flags)?;
        self.ring()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_enum_to_bytes() {
        assert_eq!(mtu_bytes(1), 256);
        assert_eq!(mtu_bytes(3), 1024);
        assert_eq!(mtu_bytes(5), 4096);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(6), 0);
    }
}
