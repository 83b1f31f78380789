//! The DC objects of the software NIC's API: creating DC initiators and targets, making a
//! DCI ready, and a DCT's settings and statistics (the transport itself is `dc.rs`).

use super::clock::QpTiming;
use super::error::SimError;
use super::nic::{Nic, NicView};
use super::qp_attr::{DcRole, DctStats, QpCaps, QpState};
use crate::raw::RawQp;
use crate::request::Access;

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

    /// As [`Nic::create_dci`], over the driver's memory (`mem`: the send ring rdma-core's
    /// provider allocated for the DCI, its record and the BlueFlame register it chose), as
    /// [`Nic::create_qp_at`].
    ///
    /// # Safety
    /// As [`Nic::create_qp_at`].
    ///
    /// # Errors
    /// As [`Nic::create_qp_at`].
    pub unsafe fn create_dci_at(
        &self,
        pd: u32,
        send_cq: u32,
        caps: QpCaps,
        mem: super::host::HostQp,
    ) -> Result<RawQp, SimError> {
        self.create_dci_in(pd, DciRing::Host(mem), send_cq, caps)
    }

    fn create_dci_in(
        &self,
        pd: u32,
        ring: impl Into<DciRing>,
        send_cq: u32,
        caps: QpCaps,
    ) -> Result<RawQp, SimError> {
        let caps = QpCaps {
            rq_entries: 0,
            scatter_to_cqe: false,
            ..caps
        };
        let raw = match ring.into() {
            DciRing::Own(None) => self.create_qp(pd, send_cq, send_cq, caps)?,
            DciRing::Own(Some(td)) => self.create_qp_on_td(pd, td, send_cq, send_cq, caps)?,
            // SAFETY: the caller of `create_dci_at` promised what `create_qp_at` needs.
            DciRing::Host(mem) => unsafe { self.create_qp_at(pd, send_cq, send_cq, caps, mem)? },
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
    /// [`SimError::Caps`] for an SRQ of another domain; [`SimError::NoCapability`] for
    /// remote atomic rights on a NIC without atomics (mlx5_ib's `mlx5_ib_modify_dct` at
    /// INIT: `get_atomic_mode` fails, EOPNOTSUPP).
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
        let atomics = self.atomic_caps();
        if access.contains(Access::REMOTE_ATOMIC) && !(atomics.standard || atomics.masked) {
            return Err(SimError::NoCapability("remote atomic rights (no atomics)"));
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
}

/// Where a DCI's ring comes from: the NIC (on a thread domain or not), or the driver.
enum DciRing {
    Own(Option<u32>),
    Host(super::host::HostQp),
}

impl From<Option<u32>> for DciRing {
    fn from(td: Option<u32>) -> DciRing {
        DciRing::Own(td)
    }
}

impl NicView {
    /// What a DCT saw (None when `dctn` is not a DCT).
    pub fn dct_stats(&self, dctn: u32) -> Option<DctStats> {
        let st = self.st();
        let q = st.qps.get(&dctn)?;
        matches!(q.dc, Some(DcRole::Dct { .. })).then_some(q.dct_stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctrl::{CompletionMode, FmCeSe};
    use crate::dc::{encode_dc, DcAddr};
    use crate::request::{Payload, Remote, Request};
    use crate::sim::order::OrderMode;
    use crate::syndrome::Syndrome;
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
        let av = crate::av::Av {
            rlid: crate::be::Be16::new(nic.port_attr().lid),
            ..crate::av::Av::default()
        };
        let addr = DcAddr {
            av: av.to_bytes(),
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
