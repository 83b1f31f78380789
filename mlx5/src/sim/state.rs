//! Everything the software NIC holds under its one lock: its tables of objects, its
//! registers, clock, ordering mode and event queue.

use super::clock::Clock;
use super::cq::SimCq;
use super::event::AsyncEvent;
use super::ids::Ids;
use super::mem::{Memory, MemoryCaps};
use super::order::OrderMode;
use super::port::Port;
use super::qp::SimQp;
use super::srq::SimSrq;
use super::uar::{UarConfig, Uars};
use crate::be::Be64;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Everything the software NIC holds, under the lock of its [`Nic`](super::Nic) handle.
pub(crate) struct State {
    pub(crate) mem: Memory,
    pub(crate) cqs: HashMap<u32, SimCq>,
    pub(crate) qps: BTreeMap<u32, SimQp>,
    pub(crate) qpns: Ids,
    /// Shared receive queues, by number.
    pub(crate) srqs: HashMap<u32, SimSrq>,
    pub(crate) srqns: Ids,
    pub(crate) cqns: Ids,
    pub(crate) threaded: bool,
    /// What the NIC's atomics do and how it writes their replies.
    pub(crate) atomics: crate::atomic::AtomicCaps,
    /// What the NIC reports of CQE compression.
    pub(crate) cqe_comp: crate::cqe::CqeCompCaps,
    pub(crate) uars: Uars,
    /// Asynchronous events not yet taken (the device's event queue).
    pub(crate) events: VecDeque<AsyncEvent>,
    /// What registration can do.
    pub(crate) memory_caps: MemoryCaps,
    /// Arms count only entries written after them
    /// ([`NicView::set_arm_next_only`](super::NicView::set_arm_next_only)).
    pub(crate) arm_next_only: bool,
    /// Virtual time, for the transport timers and held-back requests.
    pub(crate) clock: Clock,
    /// The device clock CQEs are stamped with.
    pub(crate) hw_clock: super::HwClock,
    /// In order, or as freely as the ordering rules allow.
    pub(crate) order: OrderMode,
    /// Set while a held-back request runs: the responder accepted it when it arrived, so
    /// its state then no longer matters.
    pub(crate) replay: bool,
    /// The port's UD side: its MTU and multicast groups.
    pub(crate) port: Port,
    /// Who publishes the device clock (a kernel's counter and clock-info pages), told
    /// after each pass and each change of time or clock.
    pub(crate) clock_hook: Option<super::ClockHook>,
}

/// The longest compressed session of a software NIC by default (its `cqe_comp_caps.max_num`;
/// [`NicView::set_cqe_comp_caps`](super::NicView::set_cqe_comp_caps) changes it).
pub const DEFAULT_CQE_COMP_MAX_NUM: u32 = 64;

/// How many objects of each kind a software NIC may hold at once. The defaults are the
/// hardware's 24-bit spaces; tests that exhaust or wrap them choose smaller ones.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Key indices shared by regions and windows (at most 0xff_ffff).
    pub keys: u32,
    /// QP numbers, from 0x100 (at most 0xff_ff00).
    pub qps: u32,
    /// CQ numbers, from 0x80 (at most 0xff_ff80).
    pub cqs: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            keys: 0xff_ffff,
            qps: 0x100_0000 - 0x100,
            cqs: 0x100_0000 - 0x80,
        }
    }
}

impl State {
    /// The timestamp of a CQE written now (0 when the NIC has no clock). The clock is
    /// published first: a driver that reads the counter after it saw the CQE reads a later
    /// time, as it would from a ConnectX's live counter.
    pub(crate) fn stamp(&self) -> Be64 {
        let now = self.clock.now();
        self.publish_clock_at(now);
        Be64::new(self.hw_clock.stamp_at(now))
    }

    /// Tells the clock hook, if any, the counter and the clock-info page now.
    pub(crate) fn publish_clock(&self) {
        if self.clock_hook.is_some() {
            self.publish_clock_at(self.clock.now());
        }
    }

    /// Tells the clock hook, if any, the counter and the clock-info page at `now`.
    fn publish_clock_at(&self, now: u64) {
        if let Some(h) = &self.clock_hook {
            let c = self.hw_clock;
            if c.khz != 0 {
                h(c.cycles_at(now), c.clock_info_at(now));
            }
        }
    }

    /// A NIC with no resources, holding at most `limits` objects of each kind (each clamped
    /// to the hardware's 24-bit space, at least one), with these BlueFlame registers.
    pub(crate) fn new(limits: Limits, uars: UarConfig) -> State {
        let d = Limits::default();
        let last = |first: u32, n: u32, max: u32| first + n.clamp(1, max) - 1;
        State {
            mem: Memory::new(limits.keys.clamp(1, d.keys)),
            cqs: HashMap::new(),
            qps: BTreeMap::new(),
            qpns: Ids::new(0x100, last(0x100, limits.qps, d.qps)),
            srqs: HashMap::new(),
            srqns: Ids::new(0x40, 0xff_ffff),
            cqns: Ids::new(0x80, last(0x80, limits.cqs, d.cqs)),
            threaded: false,
            atomics: crate::atomic::AtomicCaps::CONNECTX,
            cqe_comp: crate::cqe::CqeCompCaps {
                max_num: DEFAULT_CQE_COMP_MAX_NUM,
                supported_format: crate::cqe::MiniCqeFormat::ALL
                    .iter()
                    .fold(0, |a, f| a | f.bit()),
                cqe_128: true,
            },
            uars: Uars::new(uars),
            events: VecDeque::new(),
            memory_caps: MemoryCaps::default(),
            arm_next_only: false,
            clock: Clock::new(),
            hw_clock: super::HwClock::default(),
            order: OrderMode::default(),
            replay: false,
            port: Port::new(),
            clock_hook: None,
        }
    }
}
