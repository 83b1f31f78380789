//! Control and query of the software NIC's objects once created: QP transitions and
//! attributes, CQ and SRQ settings, the NIC's capabilities, statistics, events and injected
//! faults.

use super::arm::{ArmStats, CqEventSink};
use super::clock::QpTiming;
use super::error::SimError;
use super::event::AsyncEvent;
use super::nic::{Nic, NicView};
use super::order::OrderMode;
use super::qp_attr::{QpState, QpStats, RcPath};
use super::srq::SrqStats;
use super::uar::{self, RegKind, RegisterCheck};
use crate::wqe;
use std::sync::Arc;

impl Nic {
    /// Moves RC QP `qpn` from RESET to INIT (`ibv_modify_qp` to INIT: port, P_Key index,
    /// access rights), where it takes receives (they wait until it is connected) and from
    /// where it connects ([`Nic::connect`]). A second call changes nothing (INIT -> INIT).
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::Dc`] for a DC QP (made ready whole, by
    /// [`Nic::dci_ready`] or at creation); [`SimError::QpState`] for a UD QP (made ready
    /// whole by [`Nic::make_ud`]) or one past INIT.
    pub fn init_qp(&self, qpn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get_mut(&qpn).ok_or(SimError::NoQp(qpn))?;
        if q.dc.is_some() {
            return Err(SimError::Dc {
                qpn,
                why: "a DC QP is made ready whole (dci_ready, or a DCT at creation)",
            });
        }
        match q.state {
            QpState::Reset | QpState::Init if q.ud.is_none() => {}
            state => return Err(SimError::QpState { qpn, state }),
        }
        q.state = QpState::Init;
        Ok(())
    }

    /// Connects QP `a` to the QP `path` names (`path.dest_qpn` at LID `path.dlid`: another
    /// QP of this NIC, or `a` itself) and moves `a` to RTS, as `ibv_modify_qp` to RTR and
    /// RTS does on a ConnectX: only `a` changes. The peer need not exist or be connected
    /// yet; `a`'s requests reach it once it is in RTS. Nothing answers them, and `a`'s
    /// retries run out ([`Syndrome::TransportRetryExc`](crate::syndrome::Syndrome::TransportRetryExc)),
    /// when the path names another port (`dlid` not this NIC's LID: another NIC's, or no
    /// one's), when `a`'s first send PSN (`path.sq_psn`) is not the PSN the peer expects
    /// (its own `rq_psn`: a ConnectX drops or NAKs out-of-sequence requests, and none
    /// of `a`'s is ever in sequence), or when the peer is in RESET, INIT or in error, of
    /// another service type (a DCT, a DCI or a UD QP), or does not exist. Each side
    /// connects itself.
    ///
    /// # Errors
    /// [`SimError::NoQp`] for `a`; [`SimError::Dc`] for a DC QP; [`SimError::Limit`] for a
    /// path MTU not one of 256, 512, 1024, 2048, 4096 (the kernel's `mlx5_ib_modify_qp`
    /// refuses a `path_mtu` outside `IB_MTU_256 ..= IB_MTU_4096`); [`SimError::QpState`]
    /// when `a` is not in INIT (unless it is connected by this same `path` already: a
    /// second call changes nothing): in RESET (verbs move a QP to RTR only from INIT),
    /// connected, or in error. `a` reaches INIT by [`Nic::init_qp`].
    pub fn connect(&self, a: u32, path: RcPath) -> Result<(), SimError> {
        if !matches!(path.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(SimError::Limit {
                what: "path MTU (256, 512, 1024, 2048 or 4096 bytes)",
                value: u64::from(path.mtu),
            });
        }
        let path = RcPath {
            dest_qpn: path.dest_qpn & 0xff_ffff,
            rq_psn: path.rq_psn & 0xff_ffff,
            sq_psn: path.sq_psn & 0xff_ffff,
            ..path
        };
        let b = path.dest_qpn;
        let mut st = self.st();
        let q = st.qps.get_mut(&a).ok_or(SimError::NoQp(a))?;
        if q.dc.is_some() {
            return Err(SimError::Dc {
                qpn: a,
                why: "a DC QP has no peer (a DCI is made ready with dci_ready, a DCT at creation)",
            });
        }
        // Verbs moves a QP to RTR only from INIT, which only RESET reaches: a QP connects
        // once.
        match q.state {
            QpState::Init => {}
            QpState::Rts if q.peer == Some(b) && q.path == path => {}
            state => return Err(SimError::QpState { qpn: a, state }),
        }
        q.peer = Some(b);
        q.path = path;
        q.state = QpState::Rts;
        Ok(())
    }

    /// The path to QP `dest_qpn` of this NIC as a driver's exchange of endpoints gives it:
    /// this port's LID and MTU, PSN 0 in both directions (every QP connected with such a
    /// path starts its sends at PSN 0 and expects 0 of its peer, so any two agree).
    pub fn path_to(&self, dest_qpn: u32) -> RcPath {
        let port = self.port_attr();
        RcPath {
            dest_qpn,
            dlid: port.lid,
            rq_psn: 0,
            sq_psn: 0,
            mtu: port.mtu,
        }
    }

    /// Sets a connected QP's first send PSN (`sq_psn`), for a driver that programs it at RTS
    /// after [`Nic::connect`] at RTR (see [`RcPath::sq_psn`]).
    ///
    /// # Errors
    /// [`SimError::NoQp`].
    pub fn set_sq_psn(&self, qpn: u32, psn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let q = st.qps.get_mut(&qpn).ok_or(SimError::NoQp(qpn))?;
        q.path.sq_psn = psn & 0xff_ffff;
        Ok(())
    }

    /// Moves a QP to error: its outstanding and future WQEs and receives are flushed.
    ///
    /// # Errors
    /// [`SimError::NoQp`].
    pub fn set_error(&self, qpn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        if !st.qps.contains_key(&qpn) {
            return Err(SimError::NoQp(qpn));
        }
        st.set_error(qpn);
        Ok(())
    }

    /// Programs a QP's transport attributes (`ibv_modify_qp` at RTR/RTS): its local ACK
    /// timeout and retry count, its RNR retry count and the RNR timer it asks of its
    /// requesters.
    ///
    /// # Errors
    /// [`SimError::NoQp`]; [`SimError::Caps`] for a value past its encoding.
    pub fn set_timing(&self, qpn: u32, timing: QpTiming) -> Result<(), SimError> {
        if !timing.is_valid() {
            return Err(SimError::Caps(
                "timing: retry_cnt and rnr_retry <= 7, timeout and min_rnr_timer <= 31",
            ));
        }
        let mut st = self.st();
        let q = st.qps.get_mut(&qpn).ok_or(SimError::NoQp(qpn))?;
        q.timing = timing;
        Ok(())
    }

    /// A compressing CQ's mini-CQE format (None: not compressing, or no such CQ).
    pub fn cq_compression(&self, cqn: u32) -> Option<crate::cqe::MiniCqeFormat> {
        self.st().cqs.get(&cqn).and_then(|c| c.zip_format())
    }

    /// Gives a CQ the sink its completion events go to (None: events are counted but go
    /// nowhere, as for a CQ created without a completion channel).
    ///
    /// # Errors
    /// [`SimError::NoCq`].
    pub fn set_cq_event_sink(
        &self,
        cqn: u32,
        sink: Option<Arc<dyn CqEventSink>>,
    ) -> Result<(), SimError> {
        let mut st = self.st();
        st.cqs
            .get_mut(&cqn)
            .ok_or(SimError::NoCq(cqn))?
            .arm
            .set_sink(sink);
        Ok(())
    }

    /// Arms the SRQ's limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): one
    /// [`AsyncEvent::SrqLimitReached`] when a WQE is taken and fewer than `limit` remain
    /// posted; 0 disarms.
    ///
    /// # Errors
    /// [`SimError::NoSrq`]; [`SimError::Limit`] for a limit not below the ring's entries
    /// (the kernel's `mlx5_ib_modify_srq`: `EINVAL`).
    pub fn arm_srq_limit(&self, srqn: u32, limit: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let s = st.srqs.get_mut(&srqn).ok_or(SimError::NoSrq(srqn))?;
        if limit >= s.cnt {
            return Err(SimError::Limit {
                what: "SRQ limit (below the SRQ's entries)",
                value: limit as u64,
            });
        }
        s.limit = limit;
        Ok(())
    }

    /// The next asynchronous event, if any (as `ibv_get_async_event` on a non-blocking
    /// event file descriptor).
    pub fn take_async_event(&self) -> Option<AsyncEvent> {
        self.st().events.pop_front()
    }
}

impl NicView {
    /// What the NIC saw of a QP.
    pub fn qp_stats(&self, qpn: u32) -> Option<QpStats> {
        self.st().qps.get(&qpn).map(|q| q.stats)
    }

    /// The state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.st().qps.get(&qpn).map(|q| q.state)
    }

    /// Whether the NIC found a CQ full when it had a CQE to write (the CQ is then in error and
    /// its QPs too).
    pub fn cq_overrun(&self, cqn: u32) -> bool {
        self.st().cqs.get(&cqn).is_some_and(|c| c.overrun)
    }

    /// What the NIC saw of a CQ's arm requests and events (None for an unknown CQ).
    pub fn cq_arm_stats(&self, cqn: u32) -> Option<ArmStats> {
        self.st().cqs.get(&cqn).map(|c| c.arm.stats)
    }

    /// Whether an arm counts only the entries written after the NIC reads it (the IB
    /// specification's minimum, what rxe does) instead of every entry past the armed
    /// consumer index, as a ConnectX does (the default). A driver must poll once more after
    /// arming to be right on both; this mode catches one that does not.
    pub fn set_arm_next_only(&self, next_only: bool) {
        self.st().arm_next_only = next_only;
    }

    /// Puts a CQ in error as the hardware does when it overruns or cannot write its ring:
    /// it writes nothing more, and raises [`AsyncEvent::CqError`] (a fault injection for
    /// tests: blueflame's own accounting never overruns a CQ).
    ///
    /// # Errors
    /// [`SimError::NoCq`].
    pub fn fail_cq(&self, cqn: u32) -> Result<(), SimError> {
        let mut st = self.st();
        let cq = st.cqs.get_mut(&cqn).ok_or(SimError::NoCq(cqn))?;
        cq.overrun = true;
        st.note_cq_errors();
        Ok(())
    }

    /// Raises an event the way the device would (port down, device fatal: fault injection
    /// for tests). A fatal device stops running WQEs.
    pub fn raise_event(&self, e: AsyncEvent) {
        self.st().events.push_back(e);
    }

    /// What the NIC saw of an SRQ.
    pub fn srq_stats(&self, srqn: u32) -> Option<SrqStats> {
        self.st().srqs.get(&srqn).map(|s| s.stats)
    }

    /// WQEs posted to the SRQ and not taken yet (None for an unknown SRQ).
    pub fn srq_pending(&self, srqn: u32) -> Option<u32> {
        self.st().srqs.get(&srqn).map(|s| s.pending())
    }

    /// The SRQ's armed limit (0: disarmed), None for an unknown SRQ.
    pub fn srq_limit(&self, srqn: u32) -> Option<u32> {
        self.st().srqs.get(&srqn).map(|s| s.limit)
    }

    /// The NIC's atomic capabilities: by default a ConnectX's under a current Linux driver
    /// ([`AtomicCaps::CONNECTX`](crate::atomic::AtomicCaps::CONNECTX): every atomic, 8-byte
    /// replies in host order, 4-byte masked replies big-endian).
    pub fn atomic_caps(&self) -> crate::atomic::AtomicCaps {
        self.st().atomics
    }

    /// Changes the NIC's atomic capabilities (before creating the QPs that should see them:
    /// a driver reads them once). Atomics the NIC lacks fail with a local QP operation
    /// error; replies are written in the byte order `caps` says.
    pub fn set_atomic_caps(&self, caps: crate::atomic::AtomicCaps) {
        self.st().atomics = caps;
    }

    /// What the NIC reports of CQE compression (`mlx5dv_query_device`'s `cqe_comp_caps`):
    /// by default every mini-CQE format, sessions of up to
    /// [`DEFAULT_CQE_COMP_MAX_NUM`](super::DEFAULT_CQE_COMP_MAX_NUM), 64- and 128-byte CQEs.
    pub fn cqe_comp_caps(&self) -> crate::cqe::CqeCompCaps {
        self.st().cqe_comp
    }

    /// Changes what the NIC reports of CQE compression (for CQs created afterwards).
    pub fn set_cqe_comp_caps(&self, caps: crate::cqe::CqeCompCaps) {
        self.st().cqe_comp = caps;
    }

    /// How many compressed sessions the NIC wrote into a CQ, and how many completions they
    /// held (sessions of one are written plain and not counted).
    pub fn cq_sessions(&self, cqn: u32) -> (u64, u64) {
        self.st().cqs.get(&cqn).map_or((0, 0), |c| c.zip_stats)
    }

    /// The kind of the register a QP rings and how many QPs ring it.
    pub fn qp_register(&self, qpn: u32) -> Option<(RegKind, u32)> {
        let st = self.st();
        let q = st.qps.get(&qpn)?;
        let r = &st.uars.regs[q.reg];
        Some((r.kind, r.users))
    }

    /// Checks every register at a quiescent point (no ring in progress: the posting threads
    /// wait): a half holding a BlueFlame copy holds one whole WQE still in its ring, never
    /// pieces of two; a register rung at least twice since the last check has both halves
    /// written. Then clears the registers for the next check.
    pub fn check_registers(&self) -> RegisterCheck {
        let mut st = self.st();
        let mut out = RegisterCheck::default();
        let mut rung = vec![0u64; st.uars.regs.len()];
        for q in st.qps.values_mut() {
            let db = q.sq_db();
            rung[q.reg] += q.rings_since_mark(db);
        }
        for (i, r) in st.uars.regs.iter().enumerate() {
            if r.users == 0 {
                continue;
            }
            out.registers += 1;
            let bf = r.bf_size;
            if bf == 0 {
                r.clear();
                continue;
            }
            let mut written = 0;
            for half in [0, bf] {
                let mut bytes = [0u8; wqe::MAX_WQE_BYTES];
                let n = bf.min(wqe::MAX_WQE_BYTES);
                r.read(half, &mut bytes[..n]);
                let mut ring = [0u8; wqe::MAX_WQE_BYTES];
                let live = st
                    .qps
                    .values()
                    .filter(|q| q.reg == i)
                    .any(|q| q.wqe_matching(&bytes[..8], &mut ring));
                match uar::classify(&bytes[..n], live.then_some(&ring[..])) {
                    uar::HalfContent::Empty => {}
                    uar::HalfContent::Doorbell => written += 1,
                    uar::HalfContent::Copy => {
                        written += 1;
                        out.copies += 1;
                    }
                    uar::HalfContent::Torn => {
                        written += 1;
                        out.torn += 1;
                    }
                }
            }
            if rung[i] >= 2 && written < 2 {
                out.out_of_turn += 1;
            }
            r.clear();
        }
        out
    }

    /// The ordering mode (by default [`OrderMode::Relaxed`] with seed 0).
    pub fn order(&self) -> OrderMode {
        self.st().order
    }

    /// Sets the ordering mode. QPs created from now on draw their choices from the new seed;
    /// [`OrderMode::Strict`] holds nothing back from now on, on every QP.
    pub fn set_order(&self, order: OrderMode) {
        self.st().order = order;
    }

    /// A QP's transport attributes.
    pub fn qp_timing(&self, qpn: u32) -> Option<QpTiming> {
        self.st().qps.get(&qpn).map(|q| q.timing)
    }
}
