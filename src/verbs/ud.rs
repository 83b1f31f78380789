//! UD sends on the verbs path: `ibv_post_send` with `wr.ud`, or, on a QP created with the
//! extended API, `ibv_wr_send` / `ibv_wr_send_imm` + `ibv_wr_set_ud_addr` (chosen at creation
//! as for RC, [`super::ex::ApiChoice`]), each send naming its address handle.
//!
//! The UD QP itself (creation with `IBV_QPT_UD`, the UD state transitions, multicast) and
//! its address handles are rdma-core objects: [`super::objects::Qp`] and [`Ah`] (re-exported
//! here from `super::objects`).
//!
//! A UD send carries at most one path MTU of payload (there is no segmentation: a longer
//! one is refused before posting); each receive gets the 40-byte GRH (or 40 undefined bytes
//! without one) in front of the payload, so a receive for `n` bytes of payload needs
//! `n + 40` bytes of buffer, as perftest's `ib_send_lat -c UD` sizes them (`UD_ADDITION`).
//!
//! The send and receive queues are the verbs path's own ([`VerbsSendQueue`],
//! [`super::rq::VerbsRecvQueue`]): the same cookies, completion moderation, CQ
//! accounting, flushes and refusals as RC.

use super::objects::Qp;
use super::sq::{VerbsSendQueue, MAX_BATCH};
use crate::completion::WcOpcode;
use crate::error::{Error, QueueUnit, Result};
use crate::queue::flags::PostFlags;
use mlx5::ctrl::Fence;
use mlx5::request::Payload;
use rdma_sys as ffi;
use std::sync::Arc;

pub use super::objects::Ah;

/// The path MTU in bytes of a verbs MTU enum (`IBV_MTU_256` = 1 ... `IBV_MTU_4096` = 5);
/// 0 for a value outside it.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
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
                unit: QueueUnit::VerbsBatch,
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
