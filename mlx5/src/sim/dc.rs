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

use super::progress::Outcome;
use super::qp_attr::{DcDest, DcRole, QpState};
use super::state::State;
use crate::dc::{decode_dc, DcAddr};
use crate::request::{Access, Request, Sge};
use crate::syndrome::Syndrome;
use crate::wqe::{decode, Decoded, MAX_WQE_BYTES};

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
        // Routed by its address vector, as a UD datagram (`super::ud`): a ConnectX sends
        // the request to the LID (and GID) the AV names, not to a DCT number of its own.
        let av = crate::av::Av::from_bytes(&addr.av);
        let here = av.rlid.get() == self.port.lid && (!av.grh_bit() || av.rgid == self.port.gid);
        let dest = DcDest {
            dctn: addr.dctn,
            key: addr.dc_key,
            here,
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
        let Some(dest) = cur.filter(|d| d.here) else {
            // No destination, or one on another port: nothing answers.
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
        if !dest.here {
            return None; // never reaches this port's DCTs: `dc_responder` says so
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
        if !dest.here {
            return None;
        }
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
