//! One list of scenarios, run on any device: the software NIC through the direct path, or
//! an rdma-core device (rxe in the VM) through the verbs path. Each returns what a user can
//! observe: the bytes moved and the completions (cookie, status, opcode, byte count,
//! immediate), in order. The differential test requires them to be identical.
#![allow(dead_code)]

pub mod device;
pub mod srq;
pub mod ud;

use blueflame::*;
use std::cell::RefCell;
use std::time::{Duration, Instant};

thread_local! {
    /// The device of side B of every [`Pair`] while [`with_peer`] runs (the differential
    /// runs of `tests/provider`: the direct path on one side, rdma-core's own post and poll
    /// on the other, over one device); None: both sides on the scenario's device.
    static PEER: RefCell<Option<Device>> = const { RefCell::new(None) };
}

/// Runs `f` with side B of every [`Pair`] it makes on `peer` (side A stays on the device the
/// scenario is given).
pub fn with_peer<T>(peer: &Device, f: impl FnOnce() -> T) -> T {
    let old = PEER.with(|p| p.replace(Some(peer.clone())));
    struct Restore(Option<Device>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            PEER.with(|p| *p.borrow_mut() = old);
        }
    }
    let _restore = Restore(old);
    f()
}

/// What one scenario showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Scenario name.
    pub name: &'static str,
    /// Completions of the requester, then of the responder, as (cookie, status, opcode,
    /// byte_len, imm).
    pub completions: Vec<(u64, WcStatus, WcOpcode, u32, Option<u32>)>,
    /// Bytes read back from the buffers after the scenario.
    pub data: Vec<u8>,
}

/// Two connected QPs, each with its own CQ, and a region on each side.
pub struct Pair {
    pub dev: Device,
    pub a: Qp,
    pub b: Qp,
    pub cq_a: Cq,
    pub cq_b: Cq,
    pub mr_a: MemoryRegion,
    pub mr_b: MemoryRegion,
}

pub const RIGHTS: Access = Access(1 | 2 | 4 | 8); // local write, remote write/read/atomic

/// QP sizes that every device here accepts (rxe refuses large inline sizes).
pub fn caps() -> QpCaps {
    QpCaps {
        sq_blocks: 64,
        rq_entries: 32,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline: 64,
        bf_size: 256,
        rnr_retry: 7,
        ..QpCaps::default()
    }
}

impl Pair {
    pub fn new(dev: &Device, rights_b: Access, caps: QpCaps, timing: &Timing) -> Pair {
        let pd = dev.alloc_pd().expect("pd");
        // Side B on the peer device while `with_peer` runs, with its own domain there.
        let peer = PEER.with(|p| p.borrow().clone());
        let pd_b = match &peer {
            Some(d) => d.alloc_pd().expect("pd b"),
            None => pd.clone(),
        };
        let dev_b = peer.as_ref().unwrap_or(dev);
        let cq_a = dev.create_cq(64).expect("cq a");
        let cq_b = dev_b.create_cq(64).expect("cq b");
        let mut a = pd.create_qp(&cq_a, &cq_a, caps).expect("qp a");
        let mut b = pd_b.create_qp(&cq_b, &cq_b, caps).expect("qp b");
        let (ea, eb) = (a.endpoint().expect("ep a"), b.endpoint().expect("ep b"));
        a.connect_with(&eb, timing).expect("connect a");
        b.connect_with(&ea, timing).expect("connect b");
        let mr_a = pd.alloc_mr(4096, RIGHTS).expect("mr a");
        let mr_b = pd_b.alloc_mr(4096, rights_b).expect("mr b");
        Pair {
            dev: dev.clone(),
            a,
            b,
            cq_a,
            cq_b,
            mr_a,
            mr_b,
        }
    }

    /// Waits for `n` completions on `which` CQ (A or B), 20 s at most.
    pub fn wait(
        &mut self,
        on_b: bool,
        n: usize,
    ) -> Vec<(u64, WcStatus, WcOpcode, u32, Option<u32>)> {
        let cq = if on_b { &mut self.cq_b } else { &mut self.cq_a };
        wait_on(&self.dev, cq, n)
            .iter()
            .map(|c| (c.cookie, c.status, c.opcode, c.byte_len, c.imm))
            .collect()
    }

    /// Polls a little longer to prove nothing else arrives.
    pub fn nothing_more(&mut self) -> bool {
        let mut out = [Completion::default(); 4];
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            self.dev.process();
            if self.cq_a.poll(&mut out) + self.cq_b.poll(&mut out) > 0 {
                return false;
            }
        }
        true
    }

    pub fn bytes(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        mr.read(off, &mut v).expect("read back");
        v
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub type Scenario = fn(&Device) -> Observed;

/// Every scenario, by name.
pub const ALL: &[(&str, Scenario)] = &[
    ("write_sgl", write_sgl),
    ("write_inline", write_inline),
    ("write_imm", write_imm),
    ("write_imm_zero", write_imm_zero),
    ("read_sgl", read_sgl),
    ("send_recv", send_recv),
    ("send_imm", send_imm),
    ("atomics", atomics),
    ("unsignaled", unsignaled),
    ("batch", batch),
    ("bad_rkey", bad_rkey),
    ("out_of_bounds", out_of_bounds),
    ("bad_lkey", bad_lkey),
    ("missing_rights", missing_rights),
    ("recv_too_small", recv_too_small),
    ("flush", flush),
    ("window_rebind", window_rebind),
    ("window_past_end", window_past_end),
    // Shared receive queues (`srq.rs`).
    ("srq_send_recv", srq::srq_send_recv),
    ("srq_qp_error", srq::srq_qp_error),
    ("srq_limit", srq::srq_limit),
];

fn pair(dev: &Device) -> Pair {
    Pair::new(dev, RIGHTS, caps(), &Timing::default())
}

fn write_sgl(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.mr_a.write(0, &pattern(300, 1)).unwrap();
    let sgl = [
        p.mr_a.sge(0, 100).unwrap(),
        p.mr_a.sge(100, 50).unwrap(),
        p.mr_a.sge(150, 150).unwrap(),
    ];
    p.a.write(&sgl, p.mr_b.remote(10).unwrap(), 11, PostFlags::SIGNALED)
        .unwrap();
    let completions = p.wait(false, 1);
    Observed {
        name: "write_sgl",
        completions,
        data: Pair::bytes(&p.mr_b, 0, 320),
    }
}

fn write_inline(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.a.write_inline(
        b"8 bytes!",
        p.mr_b.remote(64).unwrap(),
        12,
        PostFlags::SIGNALED,
    )
    .unwrap();
    p.a.write_inline(
        &pattern(60, 7),
        p.mr_b.remote(128).unwrap(),
        13,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let completions = p.wait(false, 2);
    Observed {
        name: "write_inline",
        completions,
        data: Pair::bytes(&p.mr_b, 0, 200),
    }
}

fn write_imm(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.b.post_recv(&[p.mr_b.sge(1024, 64).unwrap()], 900)
        .unwrap();
    p.mr_a.write(0, &pattern(16, 3)).unwrap();
    let data = Payload::Sgl(&[p.mr_a.sge(0, 16).unwrap()]);
    p.a.write_imm(
        data,
        p.mr_b.remote(0).unwrap(),
        0xdead_beef,
        14,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = p.wait(false, 1);
    completions.extend(p.wait(true, 1));
    Observed {
        name: "write_imm",
        completions,
        data: Pair::bytes(&p.mr_b, 0, 32),
    }
}

fn write_imm_zero(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.b.post_recv(&[p.mr_b.sge(1024, 64).unwrap()], 901)
        .unwrap();
    p.a.write_imm(
        Payload::Inline(&[]),
        p.mr_b.remote(0).unwrap(),
        7,
        15,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = p.wait(false, 1);
    completions.extend(p.wait(true, 1));
    Observed {
        name: "write_imm_zero",
        completions,
        data: Vec::new(),
    }
}

fn read_sgl(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.mr_b.write(500, &pattern(48, 9)).unwrap();
    let sgl = [p.mr_a.sge(0, 16).unwrap(), p.mr_a.sge(100, 32).unwrap()];
    p.a.read(&sgl, p.mr_b.remote(500).unwrap(), 16, PostFlags::SIGNALED)
        .unwrap();
    let completions = p.wait(false, 1);
    Observed {
        name: "read_sgl",
        completions,
        data: Pair::bytes(&p.mr_a, 0, 140),
    }
}

fn send_recv(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.b.post_recv(
        &[p.mr_b.sge(0, 40).unwrap(), p.mr_b.sge(200, 100).unwrap()],
        902,
    )
    .unwrap();
    p.mr_a.write(0, &pattern(100, 5)).unwrap();
    p.a.send(
        Payload::Sgl(&[p.mr_a.sge(0, 100).unwrap()]),
        17,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = p.wait(false, 1);
    completions.extend(p.wait(true, 1));
    let mut data = Pair::bytes(&p.mr_b, 0, 40);
    data.extend(Pair::bytes(&p.mr_b, 200, 100));
    Observed {
        name: "send_recv",
        completions,
        data,
    }
}

fn send_imm(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.b.post_recv(&[p.mr_b.sge(0, 64).unwrap()], 903).unwrap();
    p.a.post(
        &Request::SendImm {
            data: Payload::Inline(b"hello"),
            imm: 0x0102_0304,
        },
        18,
        PostFlags::SIGNALED.solicited(),
    )
    .unwrap();
    let mut completions = p.wait(false, 1);
    completions.extend(p.wait(true, 1));
    Observed {
        name: "send_imm",
        completions,
        data: Pair::bytes(&p.mr_b, 0, 8),
    }
}

fn atomics(dev: &Device) -> Observed {
    let mut p = pair(dev);
    p.mr_b.write(0, &100u64.to_ne_bytes()).unwrap();
    let local = p.mr_a.sge(0, 8).unwrap();
    p.a.compare_swap(
        p.mr_b.remote(0).unwrap(),
        100,
        200,
        local,
        19,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = p.wait(false, 1);
    // Replies through Qp::atomic_result: host order on every device (rxe writes host order,
    // a ConnectX may write big-endian).
    let reply = |p: &Pair, off: usize| p.a.atomic_result(&Pair::bytes(&p.mr_a, off, 8)).unwrap();
    let first = reply(&p, 0);
    p.a.compare_swap(
        p.mr_b.remote(0).unwrap(),
        100,
        300,
        p.mr_a.sge(8, 8).unwrap(),
        20,
        PostFlags::SIGNALED,
    )
    .unwrap();
    completions.extend(p.wait(false, 1));
    p.a.fetch_add(
        p.mr_b.remote(0).unwrap(),
        5,
        p.mr_a.sge(16, 8).unwrap(),
        21,
        PostFlags::SIGNALED,
    )
    .unwrap();
    completions.extend(p.wait(false, 1));
    let mut data = first.to_ne_bytes().to_vec();
    data.extend(reply(&p, 8).to_ne_bytes());
    data.extend(reply(&p, 16).to_ne_bytes());
    data.extend(Pair::bytes(&p.mr_b, 0, 8));
    Observed {
        name: "atomics",
        completions,
        data,
    }
}

fn unsignaled(dev: &Device) -> Observed {
    let mut p = pair(dev);
    for i in 0..5u8 {
        p.a.write_inline(
            &[i; 8],
            p.mr_b.remote(i as usize * 8).unwrap(),
            30 + i as u64,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    p.a.write_inline(&[9; 8], p.mr_b.remote(40).unwrap(), 35, PostFlags::SIGNALED)
        .unwrap();
    let completions = p.wait(false, 1);
    assert!(
        p.nothing_more(),
        "an unsignaled request produced a completion"
    );
    Observed {
        name: "unsignaled",
        completions,
        data: Pair::bytes(&p.mr_b, 0, 48),
    }
}

fn batch(dev: &Device) -> Observed {
    let mut p = pair(dev);
    let remote = p.mr_b.remote(0).unwrap();
    let mut b = p.a.batch();
    for i in 0..8u64 {
        let flags = if i % 4 == 3 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        let r = Remote {
            addr: remote.addr + i * 8,
            ..remote
        };
        b.push(
            &Request::Write {
                remote: r,
                data: Payload::Inline(&[i as u8 + 1; 8]),
            },
            40 + i,
            flags,
        )
        .unwrap();
    }
    b.ring().unwrap();
    let completions = p.wait(false, 2);
    Observed {
        name: "batch",
        completions,
        data: Pair::bytes(&p.mr_b, 0, 64),
    }
}

/// A failing request, then a second one that is flushed.
fn fail_then_flush(
    dev: &Device,
    name: &'static str,
    rights_b: Access,
    f: impl Fn(&mut Pair),
) -> Observed {
    let mut p = Pair::new(
        dev,
        rights_b,
        caps(),
        &Timing {
            retry_cnt: 1,
            timeout: 10,
            ..Timing::default()
        },
    );
    f(&mut p);
    p.a.write_inline(b"after", p.mr_b.remote(0).unwrap(), 99, PostFlags::SIGNALED)
        .unwrap();
    let completions = p.wait(false, 2);
    Observed {
        name,
        completions,
        data: Vec::new(),
    }
}

fn bad_rkey(dev: &Device) -> Observed {
    fail_then_flush(dev, "bad_rkey", RIGHTS, |p| {
        let r = Remote {
            rkey: p.mr_b.rkey() ^ 0x5a5a_0000,
            ..p.mr_b.remote(0).unwrap()
        };
        p.a.write(&[p.mr_a.sge(0, 8).unwrap()], r, 50, PostFlags::SIGNALED)
            .unwrap();
    })
}

fn out_of_bounds(dev: &Device) -> Observed {
    fail_then_flush(dev, "out_of_bounds", RIGHTS, |p| {
        p.a.write(
            &[p.mr_a.sge(0, 64).unwrap()],
            p.mr_b.remote(4096 - 32).unwrap(),
            51,
            PostFlags::SIGNALED,
        )
        .unwrap();
    })
}

fn bad_lkey(dev: &Device) -> Observed {
    fail_then_flush(dev, "bad_lkey", RIGHTS, |p| {
        let mut s = p.mr_a.sge(0, 8).unwrap();
        s.lkey ^= 0x7700_0000;
        p.a.write(&[s], p.mr_b.remote(0).unwrap(), 52, PostFlags::SIGNALED)
            .unwrap();
    })
}

fn missing_rights(dev: &Device) -> Observed {
    fail_then_flush(
        dev,
        "missing_rights",
        Access::LOCAL_WRITE | Access::REMOTE_READ,
        |p| {
            p.a.write(
                &[p.mr_a.sge(0, 8).unwrap()],
                p.mr_b.remote(0).unwrap(),
                53,
                PostFlags::SIGNALED,
            )
            .unwrap();
        },
    )
}

fn recv_too_small(dev: &Device) -> Observed {
    let mut p = Pair::new(
        dev,
        RIGHTS,
        caps(),
        &Timing {
            retry_cnt: 1,
            timeout: 10,
            ..Timing::default()
        },
    );
    p.b.post_recv(&[p.mr_b.sge(0, 8).unwrap()], 904).unwrap();
    p.a.send(Payload::Inline(&pattern(32, 1)), 54, PostFlags::SIGNALED)
        .unwrap();
    let mut completions = p.wait(false, 1);
    completions.extend(p.wait(true, 1));
    Observed {
        name: "recv_too_small",
        completions,
        data: Vec::new(),
    }
}

fn flush(dev: &Device) -> Observed {
    let mut p = pair(dev);
    // Receives posted, then the QP moved to error: each comes back once, flushed.
    for i in 0..3 {
        p.b.post_recv(&[p.mr_b.sge(i * 64, 64).unwrap()], 910 + i as u64)
            .unwrap();
    }
    p.b.set_error().unwrap();
    let mut completions = p.wait(true, 3);
    // Sends stuck behind an RNR wait (a healthy responder with no receive), then error.
    let mut p = pair(dev);
    // The ring as the device sized it (rdma-core's provider rounds the send queue up to
    // whole pages of its largest request: more than `caps().sq_blocks`).
    let room = p.a.free_send();
    for i in 0..3u64 {
        let flags = if i == 1 {
            PostFlags::UNSIGNALED
        } else {
            PostFlags::SIGNALED
        };
        p.a.send(Payload::Inline(b"x"), 60 + i, flags).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    p.dev.process();
    p.a.set_error().unwrap();
    completions.extend(p.wait(false, 3));
    assert!(p.nothing_more(), "a request completed twice");
    assert_eq!(p.a.free_send(), room, "queue space back");
    Observed {
        name: "flush",
        completions,
        data: Vec::new(),
    }
}

/// B's region with the bind right, and a type-2 window of B bound to its first 256 bytes
/// (the bind's completion is waited for).
fn bound_window(dev: &Device, timing: &Timing) -> (Pair, MemoryWindow, u32) {
    let rights = Access(RIGHTS.0 | Access::MW_BIND.0);
    let mut p = Pair::new(dev, rights, caps(), timing);
    let mut mw = p.b.pd().alloc_mw(MwType::Two).expect("window");
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let k =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 256, rw, 70, PostFlags::SIGNALED)
            .expect("bind");
    assert_eq!(p.wait(true, 1)[0].1, WcStatus::Success, "bind");
    (p, mw, k)
}

/// A type-2 window unbound (a local invalidate on every path) and bound again: the new key
/// works, the old one fails.
fn window_rebind(dev: &Device) -> Observed {
    let timing = Timing {
        retry_cnt: 1,
        timeout: 10,
        ..Timing::default()
    };
    let (mut p, mut mw, k1) = bound_window(dev, &timing);
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    p.b.unbind_mw(&mut mw, 71, PostFlags::SIGNALED)
        .expect("unbind");
    let k2 =
        p.b.bind_mw(&mut mw, &p.mr_b, 256, 256, rw, 72, PostFlags::SIGNALED)
            .expect("rebind");
    let mut completions = p.wait(true, 2);
    let base = p.mr_b.addr();
    let at = |off: u64, rkey| Remote {
        addr: base + off,
        rkey,
    };
    p.a.write_inline(b"new key", at(300, k2), 73, PostFlags::SIGNALED)
        .expect("write k2");
    completions.extend(p.wait(false, 1));
    p.a.write_inline(b"old key", at(8, k1), 74, PostFlags::SIGNALED)
        .expect("write k1");
    p.a.write_inline(b"after", p.mr_b.remote(0).unwrap(), 99, PostFlags::SIGNALED)
        .expect("write after");
    completions.extend(p.wait(false, 2));
    Observed {
        name: "window_rebind",
        completions,
        data: Pair::bytes(&p.mr_b, 300, 7),
    }
}

/// A write through a window's key that runs one byte past the window (inside the region):
/// a ConnectX (and the software NIC) refuse it; rxe checks only the region's range and
/// accepts it (see RXE_DEVIATIONS and the README's security caveat).
fn window_past_end(dev: &Device) -> Observed {
    let timing = Timing {
        retry_cnt: 1,
        timeout: 10,
        ..Timing::default()
    };
    let (mut p, _mw, k) = bound_window(dev, &timing);
    let r = Remote {
        addr: p.mr_b.addr() + 249,
        rkey: k,
    };
    p.a.write_inline(b"8 bytes!", r, 75, PostFlags::SIGNALED)
        .expect("write");
    p.a.write_inline(b"after", p.mr_b.remote(0).unwrap(), 99, PostFlags::SIGNALED)
        .expect("write after");
    let completions = p.wait(false, 2);
    Observed {
        name: "window_past_end",
        completions,
        data: Vec::new(),
    }
}

fn find<'a>(all: &'a [Observed], name: &str) -> &'a Observed {
    all.iter().find(|o| o.name == name).expect("scenario")
}

/// The outcome every device must show for every scenario.
pub fn check(all: &[Observed]) {
    use WcStatus::*;
    let ok = |o: &Observed| o.completions.iter().all(|c| c.1 == Success);
    for name in [
        "write_sgl",
        "write_inline",
        "write_imm",
        "write_imm_zero",
        "read_sgl",
        "send_recv",
        "send_imm",
        "atomics",
        "unsignaled",
        "batch",
    ] {
        assert!(ok(find(all, name)), "{name}: {:?}", find(all, name));
    }
    let w = find(all, "write_imm");
    assert_eq!(
        w.completions[1],
        (
            900,
            Success,
            WcOpcode::RecvRdmaWithImm,
            16,
            Some(0xdead_beef)
        )
    );
    assert_eq!(
        find(all, "write_imm_zero").completions[1],
        (901, Success, WcOpcode::RecvRdmaWithImm, 0, Some(7))
    );
    assert_eq!(
        find(all, "read_sgl").completions[0],
        (16, Success, WcOpcode::RdmaRead, 48, None)
    );
    assert_eq!(
        find(all, "send_recv").completions[1],
        (902, Success, WcOpcode::Recv, 100, None)
    );
    let a = &find(all, "atomics").data;
    assert_eq!(
        u64::from_ne_bytes(a[..8].try_into().unwrap()),
        100,
        "cas returned the old value"
    );
    assert_eq!(
        u64::from_ne_bytes(a[8..16].try_into().unwrap()),
        200,
        "failed cas returned the current value"
    );
    assert_eq!(
        u64::from_ne_bytes(a[16..24].try_into().unwrap()),
        200,
        "fetch-add returned the old value"
    );
    assert_eq!(
        u64::from_ne_bytes(a[24..32].try_into().unwrap()),
        205,
        "target after cas and add"
    );
    assert_eq!(
        find(all, "unsignaled").completions,
        vec![(35, Success, WcOpcode::RdmaWrite, 0, None)]
    );
    let b = find(all, "batch");
    assert_eq!(
        b.completions.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![43, 47]
    );
    assert_eq!(b.data, (0..64).map(|i| i / 8 + 1).collect::<Vec<u8>>());
    for (name, status) in [
        ("bad_rkey", RemAccessErr),
        ("out_of_bounds", RemAccessErr),
        ("bad_lkey", LocProtErr),
        ("missing_rights", RemAccessErr),
    ] {
        let o = find(all, name);
        assert_eq!(o.completions[0].1, status, "{name}");
        assert_eq!(
            o.completions[1],
            (99, WrFlushErr, WcOpcode::RdmaWrite, 0, None),
            "{name}"
        );
    }
    let w = find(all, "window_rebind");
    let cs: Vec<_> = w.completions.iter().map(|c| (c.0, c.1, c.2)).collect();
    assert_eq!(
        cs,
        vec![
            (71, Success, WcOpcode::LocalInv),
            (72, Success, WcOpcode::BindMw),
            (73, Success, WcOpcode::RdmaWrite),
            (74, RemAccessErr, WcOpcode::RdmaWrite),
            (99, WrFlushErr, WcOpcode::RdmaWrite),
        ]
    );
    assert_eq!(w.data, b"new key");
    let w = find(all, "window_past_end");
    assert_eq!((w.completions[0].0, w.completions[0].1), (75, RemAccessErr));
    assert_eq!((w.completions[1].0, w.completions[1].1), (99, WrFlushErr));
    let r = find(all, "recv_too_small");
    assert_eq!((r.completions[0].0, r.completions[0].1), (54, RemInvReqErr));
    assert_eq!((r.completions[1].0, r.completions[1].1), (904, LocLenErr));
    srq::check(all);
    let f = find(all, "flush");
    let cookies: Vec<u64> = f.completions.iter().map(|c| c.0).collect();
    assert_eq!(cookies, vec![910, 911, 912, 60, 61, 62]);
    assert!(
        f.completions.iter().all(|c| c.1 == WrFlushErr),
        "{:?}",
        f.completions
    );
}

/// Where the 6.1 kernel's rxe reports another status than mlx5 (and the software NIC, which
/// follows mlx5) for the same failure: (scenario, completion index, mlx5 status, rxe status).
/// Any other difference is a failure.
pub const RXE_DEVIATIONS: &[(&str, usize, WcStatus, WcStatus)] = &[
    // A gather entry with a bad lkey: mlx5 LOCAL_PROT (0x04); rxe flags the WQE itself.
    ("bad_lkey", 0, WcStatus::LocProtErr, WcStatus::LocQpOpErr),
    // A send larger than the receive buffer: mlx5 NAKs "invalid request" and fails the receive
    // with a length error; rxe reports a remote operation error and a local QP error.
    (
        "recv_too_small",
        0,
        WcStatus::RemInvReqErr,
        WcStatus::RemOpErr,
    ),
    (
        "recv_too_small",
        1,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
    ),
    // A write through a window's key one byte past the window's end (inside its region):
    // rxe (6.1) checks only the region's range for window keys, so the write lands and the
    // next request runs (a security caveat: see the README).
    (
        "window_past_end",
        0,
        WcStatus::RemAccessErr,
        WcStatus::Success,
    ),
    (
        "window_past_end",
        1,
        WcStatus::WrFlushErr,
        WcStatus::Success,
    ),
];

/// On an rxe device, maps each documented deviation back to the mlx5 status after checking
/// that rxe reported exactly the documented one. Returns what it mapped, for the log.
pub fn normalize_rxe(dev: &Device, all: &mut [Observed]) -> Vec<String> {
    let mut applied = Vec::new();
    if !dev.to_string().contains(" rxe") {
        return applied;
    }
    for &(name, i, mlx5, rxe) in RXE_DEVIATIONS {
        let o = all.iter_mut().find(|o| o.name == name).expect("scenario");
        let c = &mut o.completions[i];
        assert_eq!(
            c.1, rxe,
            "{name}[{i}]: rxe no longer reports the documented {rxe:?}"
        );
        c.1 = mlx5;
        applied.push(format!("{name}[{i}]: rxe {rxe:?} = mlx5 {mlx5:?}"));
    }
    applied.extend(srq::normalize_rxe(dev, all));
    applied
}

/// Runs every scenario on `dev`.
pub fn run_all(dev: &Device) -> Vec<Observed> {
    ALL.iter().map(|(_, f)| f(dev)).collect()
}

/// A readable diff of two runs; empty when they agree.
pub fn diff(left: &str, l: &[Observed], right: &str, r: &[Observed]) -> String {
    let mut out = String::new();
    for (x, y) in l.iter().zip(r) {
        if x != y {
            out.push_str(&format!("scenario {}:\n", x.name));
            if x.completions != y.completions {
                out.push_str(&format!(
                    "  completions on {left}:  {:?}\n  completions on {right}: {:?}\n",
                    x.completions, y.completions
                ));
            }
            if x.data != y.data {
                let at = x
                    .data
                    .iter()
                    .zip(&y.data)
                    .position(|(a, b)| a != b)
                    .unwrap_or(x.data.len().min(y.data.len()));
                out.push_str(&format!(
                    "  data differs from byte {at} ({} vs {} bytes)\n",
                    x.data.len(),
                    y.data.len()
                ));
            }
        }
    }
    out
}

/// Waits for `n` completions on `cq` of `dev` (driving the software NIC), 20 s at most.
pub fn wait_on(dev: &Device, cq: &mut Cq, n: usize) -> Vec<Completion> {
    let mut out = vec![Completion::default(); n];
    let mut got = 0;
    let start = Instant::now();
    while got < n {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {got} of {n} completions"
        );
        dev.process();
        got += cq.poll(&mut out[got..]);
    }
    out
}
