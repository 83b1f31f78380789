//! Dynamically connected transport in the software NIC: DC targets (DCTs) and DC initiators
//! (DCIs).
//!
//! - A DCT is a responder reached by number: its number comes from the QP number space (a
//!   ConnectX allocates DCT numbers as QP numbers), it is ready once created (verbs takes it
//!   INIT -> RTR only, as UCX's `uct_dc_mlx5_iface_create_dct` does), it checks the 64-bit DC
//!   access key of every request and answers as an RC responder with the access rights it
//!   was created with. Sends land in its receive queue (the SRQ it serves; without one, every
//!   send meets an RNR NAK). A DCT never goes to error for one initiator's fault: a refused
//!   request fails at its initiator only.
//! - A DCI is a send queue without a peer: it goes RESET -> INIT -> RTR -> RTS without a
//!   remote QP (UCX `uct_dc_mlx5_iface_dci_connect`), and every WQE carries its destination
//!   in the DC address segment ([`crate::dc`]). It serves one destination at a time, in order:
//!   a WQE for another DCT waits until everything started before it has completed (a ConnectX
//!   DCI reconnects only when idle).
//!
//! What the initiator sees, as on a ConnectX: a request to a DCT number that does not exist,
//! or with a DC key that is not the DCT's, is dropped by the responder (a DCT key violation is
//! an event of the target's side, `MLX5_EVENT_TYPE_DCT_KEY_VIOLATION`, which upstream
//! rdma-core does not pass on): no answer comes, the DCI retransmits after each local ACK
//! timeout and fails with `TRANSPORT_RETRY_EXC` when its retry count is spent, then flushes
//! everything after. An operation the DCT's access rights do not allow is NAKed as an
//! invalid request (`REMOTE_INVAL_REQ`, as rxe's `check_op_valid` answers an RC QP without
//! the right); a bad remote key or range gives `REMOTE_ACCESS` as on RC.

use super::clock::QpTiming;
use super::error::SimError;
use super::nic::Nic;
use super::progress::Outcome;
use super::qp_attr::{DcDest, DcRole, DctStats, QpCaps, QpState};
use super::state::State;
use crate::dc::{decode_dc, DcAddr};
use crate::request::{Access, Request, Sge};
use crate::syndrome::Syndrome;
use crate::wqe::{decode, Decoded, MAX_WQE_BYTES};
use crate::RawQp;

/// The rights a DCT may be created with: what an RC responder checks.
const DCT_RIGHTS: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

impl Nic {
    /// Creates a DC initiator in RESET: a send queue whose WQEs carry their destination
    /// (`mlx5dv_create_qp` with `MLX5DV_DCTYPE_DCI`). It has no receive queue
    /// (`caps.rq_entries` is ignored); its completions go to `send_cq`. Move it to RTS with
    /// [`Nic::dci_ready`].
    ///
    /// # Errors
    /// As [`Nic::create_qp`].
    pub fn create_dci(&self, pd: u32, send_cq: u32, caps: QpCaps) -> Result<RawQp, SimError> {
        self.create_dci_in(pd, None, send_cq, caps)
    }

    /// As [`Nic::create_dci`], on thread domain `td` (its register is the domain's own).
    ///
    /// # Errors
    /// As [`Nic::create_qp_on_td`].
    pub fn create_dci_on_td(
        &self,
        pd: u32,
        td: u32,
        send_cq: u32,
        caps: QpCaps,
    ) -> Result<RawQp, SimError> {
        self.create_dci_in(pd, Some(td), send_cq, caps)
    }

    fn create_dci_in(
        &self,
        pd: u32,
        td: Option<u32>,
        send_cq: u32,
        caps: QpCaps,
    ) -> Result<RawQp, SimError> {
        let caps = QpCaps {
            rq_entries: 0,
            scatter_to_cqe: false,
            ..caps
        };
        let raw = match td {
            None => self.create_qp(pd, send_cq, send_cq, caps)?,
            Some(td) => self.create_qp_on_td(pd, td, send_cq, send_cq, caps)?,
        };
        let mut st = self.st();
        let q = st.qps.get_mut(&raw.qpn).expect("just created");
        q.dc = Some(DcRole::Dci { cur: None });
        Ok(raw)
    }

    /// Moves a DCI from RESET to RTS (INIT -> RTR -> RTS with no remote QP) with its
    /// transport attributes (ACK timeout and retry count, RNR retries).
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::Dc`] for a QP that is not a DCI;
    /// [`SimError::QpState`] when it is not in RESET; [`SimError::Caps`] for a timing past
    /// its encoding.
    pub fn dci_ready(&self, dci: u32, timing: QpTiming) -> Result<(), SimError> {
        if !timing.is_valid() {
            return Err(SimError::Caps(
                "timing: retry_cnt and rnr_retry <= 7, timeout and min_rnr_timer <= 31",
            ));
        }
        let mut st = self.st();
        let q = st.qps.get_mut(&dci).ok_or(SimError::NoQp(dci))?;
        if !matches!(q.dc, Some(DcRole::Dci { .. })) {
            return Err(SimError::Dc {
                qpn: dci,
                why: "not a DC initiator",
            });
        }
        if q.state != QpState::Reset {
            return Err(SimError::QpState {
                qpn: dci,
                state: q.state,
            });
        }
        q.timing = timing;
        q.state = QpState::Rts;
        q.skip_doorbell_check();
        Ok(())
    }

    /// Creates a DC target of `pd` answering requests that carry `dc_key`
    /// (`mlx5dv_create_qp` with `MLX5DV_DCTYPE_DCT` and `dct_access_key`, then INIT -> RTR
    /// with `access`), ready at once. Its receive completions go to `cq`. Returns its number
    /// (from the QP number space). Sends and writes with immediate take the WQEs of SRQ
    /// `srqn` (`ibv_qp_init_attr.srq`); without one, every send meets an RNR NAK.
    ///
    /// # Errors
    /// [`SimError::NoPd`], [`SimError::NoCq`], [`SimError::NoSrq`], [`SimError::Exhausted`];
    /// [`SimError::Rights`] for rights other than remote write, read and atomic;
    /// [`SimError::Caps`] for an SRQ of another domain.
    pub fn create_dct(
        &self,
        pd: u32,
        cq: u32,
        srqn: Option<u32>,
        dc_key: u64,
        access: Access,
    ) -> Result<u32, SimError> {
        if !DCT_RIGHTS.contains(access) {
            return Err(SimError::Rights(access));
        }
        // A DCT has no send queue of the driver's: the smallest ring, no BlueFlame.
        let caps = QpCaps {
            sq_blocks: crate::doorbell::MAX_WQE_BBS as u32,
            rq_entries: 0,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
            bf_size: 0,
            ..QpCaps::default()
        };
        let raw = self.create_qp(pd, cq, cq, caps)?;
        if let Some(srqn) = srqn {
            if let Err(e) = self.attach_qp_srq(raw.qpn, srqn) {
                let _ = self.destroy_qp(raw.qpn);
                return Err(e);
            }
        }
        let mut st = self.st();
        let q = st.qps.get_mut(&raw.qpn).expect("just created");
        q.dc = Some(DcRole::Dct {
            key: dc_key,
            access,
        });
        q.state = QpState::Rts;
        q.skip_doorbell_check();
        Ok(raw.qpn)
    }

    /// Turns the DCT's responder scatter-to-CQE off or on (on by default, as rdma-core's
    /// `create_dct` asks for it unless `MLX5_SCATTER_TO_CQE=0`): a small send then arrives
    /// in its CQE instead of the SRQ receive's buffers.
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::Dc`] for a QP that is not a DCT.
    pub fn set_dct_scatter_to_cqe(&self, dctn: u32, on: bool) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get_mut(&dctn).ok_or(SimError::NoQp(dctn))?;
        if !matches!(q.dc, Some(DcRole::Dct { .. })) {
            return Err(SimError::Dc {
                qpn: dctn,
                why: "not a DC target",
            });
        }
        q.caps.scatter_to_cqe = on;
        Ok(())
    }

    /// Destroys a DCT (its number may come back with another QP or DCT).
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::Dc`] for a QP that is not a DCT.
    pub fn destroy_dct(&self, dctn: u32) -> Result<(), SimError> {
        let is_dct = matches!(
            self.st().qps.get(&dctn).map(|q| q.dc),
            Some(Some(DcRole::Dct { .. }))
        );
        if !is_dct {
            return match self.qp_state(dctn) {
                None => Err(SimError::NoQp(dctn)),
                Some(_) => Err(SimError::Dc {
                    qpn: dctn,
                    why: "not a DC target",
                }),
            };
        }
        self.destroy_qp(dctn)
    }

    /// What a DCT saw (None when `dctn` is not a DCT).
    pub fn dct_stats(&self, dctn: u32) -> Option<DctStats> {
        let st = self.st();
        let q = st.qps.get(&dctn)?;
        matches!(q.dc, Some(DcRole::Dct { .. })).then_some(q.dct_stats)
    }
}

impl State {
    /// Whether `qpn` is a DC target.
    pub(crate) fn is_dct(&self, qpn: u32) -> bool {
        matches!(
            self.qps.get(&qpn).and_then(|q| q.dc),
            Some(DcRole::Dct { .. })
        )
    }

    /// Decodes the WQE of `qpn` in `wqe`. For a DCI: strips and records its destination
    /// (the request is decoded from `body`); when it differs from the destination of WQEs
    /// started and not completed, those complete first (`settled` counts them; a replay
    /// passes None: it runs a WQE of the destination already current).
    pub(crate) fn decode_wqe<'a>(
        &mut self,
        qpn: u32,
        wqe: &'a [u8],
        body: &'a mut [u8; MAX_WQE_BYTES],
        sges: &'a mut [Sge; 64],
        settled: Option<&mut usize>,
    ) -> Result<Decoded<'a>, ()> {
        let Some(DcRole::Dci { cur }) = self.qps.get(&qpn).and_then(|q| q.dc) else {
            return decode(wqe, sges).map_err(|_| ());
        };
        let (addr, d): (DcAddr, Decoded<'a>) = decode_dc(wqe, body, sges).map_err(|_| ())?;
        let dest = DcDest {
            dctn: addr.dctn,
            key: addr.dc_key,
        };
        if let Some(n) = settled {
            let busy = self.qps.get(&qpn).is_some_and(|q| !q.started.is_empty());
            if cur.is_some_and(|c| c != dest) && busy {
                *n += self.settle(qpn, |_, _| true);
            }
        }
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.dc = Some(DcRole::Dci { cur: Some(dest) });
        }
        Ok(d)
    }

    /// The responder of a DCI's current WQE: `Some(Ok((pd, dctn)))`, or
    /// `Some(Err(TRANSPORT_RETRY_EXC))` when nothing answers (no such DCT, a wrong key, a
    /// DCT being destroyed); None for a QP that is not a DCI.
    pub(crate) fn dc_responder(&self, qpn: u32) -> Option<Result<(u32, u32), Syndrome>> {
        let Some(DcRole::Dci { cur }) = self.qps.get(&qpn)?.dc else {
            return None;
        };
        let Some(dest) = cur else {
            return Some(Err(Syndrome::TransportRetryExc));
        };
        let answer = match self.qps.get(&dest.dctn) {
            Some(t) => match t.dc {
                Some(DcRole::Dct { key, .. }) if key == dest.key && t.state == QpState::Rts => {
                    Ok((t.pd, dest.dctn))
                }
                _ => Err(Syndrome::TransportRetryExc),
            },
            None => Err(Syndrome::TransportRetryExc),
        };
        Some(answer)
    }

    /// The DCT's checks of a DCI request before it runs: counts a key violation (the
    /// request is dropped: `responder` says nobody answers), and refuses an operation the
    /// DCT's rights do not allow (an invalid request NAK). None: run it.
    pub(crate) fn dc_admit(&mut self, qpn: u32, req: &Request<'_>) -> Option<Outcome> {
        let q = self.qps.get(&qpn)?;
        let Some(DcRole::Dci { cur: Some(dest) }) = q.dc else {
            return None;
        };
        let replay = self.replay;
        if q.state == QpState::Error && !replay {
            // The WQEs it had started to another DCT failed while it switched: this one is
            // flushed, as everything after an error.
            return Some(Outcome::Failed(Syndrome::WrFlush));
        }
        let t = self.qps.get_mut(&dest.dctn)?;
        if let Some(DcRole::Dct { key, .. }) = t.dc {
            if key != dest.key && !replay {
                t.dct_stats.key_violations += 1;
            }
        }
        self.dc_refusal(qpn, req).map(Outcome::Failed)
    }

    /// What the DCT of a DCI's current WQE NAKs `req` with for lack of rights (None: it
    /// allows it, or there is no such DCT).
    pub(crate) fn dc_refusal(&self, qpn: u32, req: &Request<'_>) -> Option<Syndrome> {
        let Some(DcRole::Dci { cur: Some(dest) }) = self.qps.get(&qpn)?.dc else {
            return None;
        };
        let Some(DcRole::Dct { key, access }) = self.qps.get(&dest.dctn)?.dc else {
            return None;
        };
        if key != dest.key {
            return None;
        }
        let need = match req {
            Request::Write { .. } => Access::REMOTE_WRITE,
            // A write with immediate also consumes a receive: the right to write is checked.
            Request::WriteImm { .. } => Access::REMOTE_WRITE,
            Request::Read { .. } => Access::REMOTE_READ,
            Request::CompareSwap { .. } | Request::FetchAdd { .. } | Request::Masked { .. } => {
                Access::REMOTE_ATOMIC
            }
            _ => Access::NONE,
        };
        (!access.contains(need)).then_some(Syndrome::RemoteInvalReq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctrl::{CompletionMode, FmCeSe};
    use crate::dc::{encode_dc, DcAddr};
    use crate::request::{Payload, Remote};
    use crate::sim::order::OrderMode;
    use crate::wqe::Span;

    /// Writes one DCI WQE (two blocks) at block 0 of `raw`'s ring (optionally without the extended-AV
    /// bit), publishes it in the doorbell record, runs the NIC, and returns the CQE's opcode
    /// and syndrome byte.
    fn run_one(extended: bool) -> (u8, u8) {
        let nic = Nic::new();
        nic.set_order(OrderMode::Strict);
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(16, 64).unwrap();
        let dctn = nic.create_dct(pd, cq.cqn, None, 7, DCT_RIGHTS).unwrap();
        let raw = nic.create_dci(pd, cq.cqn, QpCaps::default()).unwrap();
        nic.dci_ready(raw.qpn, QpTiming::default()).unwrap();
        let mr = nic
            .alloc_mr(pd, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let req = Request::Write {
            remote: Remote {
                addr: mr.addr,
                rkey: mr.rkey,
            },
            data: Payload::Inline(b"abc"),
        };
        let ds = crate::dc::dc_wqe_ds(
            &req,
            &crate::wqe::Limits {
                max_sge: 1,
                max_inline: 64,
            },
        )
        .unwrap();
        let mut wqe = [0u8; 128];
        let addr = DcAddr {
            av: [0; 48],
            dctn,
            dc_key: 7,
        };
        let flags = FmCeSe {
            completion: CompletionMode::Always,
            ..FmCeSe::default()
        };
        encode_dc(
            &req,
            ds,
            0,
            raw.qpn,
            flags,
            &addr,
            &mut Span {
                a: &mut wqe,
                b: &mut [],
            },
        );
        if !extended {
            wqe[16 + 8] &= 0x7f;
        }
        // SAFETY: the ring and doorbell record of the DCI just created, which nothing else
        // writes; blocks 0 and 1 hold 128 bytes, the record's send slot is an aligned word.
        unsafe {
            core::ptr::copy_nonoverlapping(wqe.as_ptr(), raw.sq_buf, 128);
            raw.dbrec
                .add(crate::doorbell::SND_DBR)
                .write_volatile(2u32.to_be());
        }
        nic.process();
        let mut cqe = [0u8; 64];
        // SAFETY: the CQ's first 64-byte entry, which the NIC wrote during `process`.
        unsafe { core::ptr::copy_nonoverlapping(cq.buf, cqe.as_mut_ptr(), 64) };
        (cqe[63] >> 4, cqe[55])
    }

    #[test]
    fn a_dci_wqe_runs_and_one_without_the_extended_av_bit_is_a_local_qp_operation_error() {
        assert_eq!(run_one(true).0, crate::cqe::CqeOpcode::Req as u8);
        let (op, syndrome) = run_one(false);
        assert_eq!(op, crate::cqe::CqeOpcode::ReqErr as u8);
        assert_eq!(syndrome, Syndrome::LocalQpOp.to_u8());
    }
}
