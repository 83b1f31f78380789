//! Shared set-up for the direct-path integration tests on the stepped software NIC.
#![allow(dead_code)]

use blueflame::*;

// ---- The only place that knows which version of the resource API this is. ----

/// Send-queue room of a direct-path QP, in blocks.
pub fn free_send(qp: &mut Qp) -> u32 {
    qp.free_send()
}

/// Receive-queue room of a QP, in entries.
pub fn free_recv(qp: &mut Qp) -> u32 {
    qp.free_recv()
}

/// The software NIC behind a device (its read-only view).
pub fn nic(dev: &Device) -> &mlx5::sim::NicView {
    dev.nic().expect("a software-NIC device")
}

/// What ringing a batch returns (nothing, or a result on APIs where it can fail).
pub trait Rung {
    /// Asserts the ring succeeded.
    fn rung(self);
}

impl Rung for () {
    fn rung(self) {}
}

impl Rung for Result<()> {
    fn rung(self) {
        self.unwrap()
    }
}

/// A CQ of `entries` entries whose CQEs the device compresses with `format`.
pub fn zip_cq(dev: &Device, entries: u32, format: MiniCqeFormat) -> Cq {
    dev.create_cq_with(&CqOptions::new(entries).compression(format))
        .unwrap()
}

// ---- ----

/// Every right a test region may need.
pub const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

/// A requester QP `a` and its responder: `a` itself (loopback) or a second QP `b`.
pub struct Setup {
    /// The stepped software NIC.
    pub dev: Device,
    /// The protection domain of every QP and region.
    pub pd: Pd,
    /// Send and receive CQ of `a` (and of everything in loopback).
    pub cq_a: Cq,
    /// Send and receive CQ of `b` (pair only).
    pub cq_b: Option<Cq>,
    /// The requester.
    pub a: Qp,
    /// The responder (pair only; in loopback the responder is `a`).
    pub b: Option<Qp>,
}

impl Setup {
    /// `a` connected to itself.
    pub fn loopback(caps: QpCaps) -> Setup {
        Setup::new(true, caps, caps)
    }

    /// `a` connected to a second QP `b`, each with its own CQ.
    pub fn pair(caps: QpCaps) -> Setup {
        Setup::new(false, caps, caps)
    }

    /// Either topology, with separate capabilities for requester and responder.
    pub fn new(loopback: bool, caps_a: QpCaps, caps_b: QpCaps) -> Setup {
        let dev = Device::sim_stepped();
        let pd = dev.alloc_pd().unwrap();
        let cq_a = dev.create_cq(1024).unwrap();
        let mut a = pd.create_qp(&cq_a, &cq_a, caps_a).unwrap();
        if loopback {
            let q = a.endpoint().unwrap();
            a.connect(&q).unwrap();
            return Setup {
                dev,
                pd,
                cq_a,
                cq_b: None,
                a,
                b: None,
            };
        }
        let cq_b = dev.create_cq(1024).unwrap();
        let mut b = pd.create_qp(&cq_b, &cq_b, caps_b).unwrap();
        a.connect(&b.endpoint().unwrap()).unwrap();
        b.connect(&a.endpoint().unwrap()).unwrap();
        assert_ne!(a.qpn(), b.qpn());
        Setup {
            dev,
            pd,
            cq_a,
            cq_b: Some(cq_b),
            a,
            b: Some(b),
        }
    }

    /// Whether the responder is the requester itself.
    pub fn is_loopback(&self) -> bool {
        self.b.is_none()
    }

    /// The responder QP.
    pub fn resp(&mut self) -> &mut Qp {
        match self.b.as_mut() {
            Some(b) => b,
            None => &mut self.a,
        }
    }

    /// The responder's QP number.
    pub fn resp_qpn(&self) -> u32 {
        self.b.as_ref().unwrap_or(&self.a).qpn()
    }

    /// A region of `len` bytes with `access` in the shared PD.
    pub fn mr(&self, len: usize, access: Access) -> MemoryRegion {
        self.pd.alloc_mr(len, access).unwrap()
    }

    /// Runs the NIC until idle, then polls every CQ empty. Returns (requester-side
    /// completions, receive completions), each in CQ order.
    pub fn run(&mut self) -> (Vec<Completion>, Vec<Completion>) {
        self.dev.process();
        let mut all = poll_all(&mut self.cq_a);
        if let Some(cq) = self.cq_b.as_mut() {
            all.extend(poll_all(cq));
        }
        all.into_iter().partition(|c| !is_recv(c))
    }

    /// Like [`Setup::run`], asserting how many of each came back.
    pub fn run_expect(&mut self, sends: usize, recvs: usize) -> (Vec<Completion>, Vec<Completion>) {
        let (s, r) = self.run();
        assert_eq!(s.len(), sends, "requester completions: {s:?}");
        assert_eq!(r.len(), recvs, "receive completions: {r:?}");
        (s, r)
    }
}

/// Whether a completion is for a receive WQE.
pub fn is_recv(c: &Completion) -> bool {
    c.opcode.is_receive()
}

/// Polls until the CQ is empty.
pub fn poll_all(cq: &mut Cq) -> Vec<Completion> {
    let mut v = Vec::new();
    let mut out = [Completion::default(); 32];
    loop {
        let n = cq.poll(&mut out);
        if n == 0 {
            return v;
        }
        v.extend_from_slice(&out[..n]);
    }
}

/// Deterministic bytes that differ with `seed` and position.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `len` bytes of a region from `off`.
pub fn bytes(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v).unwrap();
    v
}

/// Fills a whole region with `b`.
pub fn fill(mr: &MemoryRegion, b: u8) {
    mr.write(0, &vec![b; mr.len()]).unwrap();
}

/// Asserts a successful completion with these fields.
#[track_caller]
pub fn assert_ok(c: &Completion, cookie: u64, opcode: WcOpcode, byte_len: u32, qpn: u32) {
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    assert_eq!(c.cookie, cookie, "{c:?}");
    assert_eq!(c.opcode, opcode, "{c:?}");
    assert_eq!(c.byte_len, byte_len, "{c:?}");
    assert_eq!(c.qpn, qpn, "{c:?}");
    assert_eq!(c.syndrome, None, "{c:?}");
}

/// Asserts an error completion with this status and syndrome.
#[track_caller]
pub fn assert_err(c: &Completion, cookie: u64, status: WcStatus, syndrome: u8, qpn: u32) {
    assert_eq!(c.status, status, "{c:?}");
    assert_eq!(c.cookie, cookie, "{c:?}");
    assert_eq!(c.syndrome, Some((syndrome, 0)), "{c:?}");
    assert_eq!(c.qpn, qpn, "{c:?}");
    assert!(!c.is_ok());
}

/// Blocks a send WQE of `ds` DS units takes.
pub fn bbs(ds: usize) -> u32 {
    ds.div_ceil(4) as u32
}

/// DS units of an inline payload of `len` bytes (0 for an empty one).
pub fn inline_ds(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len + 4).div_ceil(16)
    }
}
