//! UD scenarios, run on any device: the software NIC through the direct path, or an
//! rdma-core device (rxe in the VM) through the verbs path. Each returns what a user can
//! observe: the payload bytes that arrived and the completions (cookie, status, opcode, byte
//! count, immediate, whether the source QP is the sender's, GRH flag), in order; the
//! differential test requires them identical. The GRH bytes themselves are kept apart
//! ([`UdObserved::grh`]): what a device writes there depends on its link (see
//! [`grh_deviation`]).
#![allow(dead_code)]

use blueflame::*;
use std::time::{Duration, Instant};

/// perftest's `DEF_QKEY`.
pub const QKEY: u32 = 0x1111_1111;

/// The group of the multicast scenarios on RoCE: the IPv4-mapped multicast GID
/// `::ffff:239.1.2.3` (how RoCE v2 over IPv4 and rdma_cm name an IPv4 group), no LID.
pub const MGID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3];

/// The group on InfiniBand (the software NIC): `ff0e::ef01:203` and multicast LID 0xc001.
pub const MGID_IB: [u8; 16] = [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 239, 1, 2, 3];

/// Bytes in front of every UD receive's payload (the GRH area).
pub const GRH_BYTES: u32 = 40;

/// The multicast group (GID, LID) for the port of `ep`: RoCE when its GID is IPv4-mapped.
pub fn group_of(ep: &UdEndpoint) -> ([u8; 16], u16) {
    if ep.gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        (MGID, 0)
    } else {
        (MGID_IB, 0xc001)
    }
}

/// One completion as observed: (cookie, status, opcode, byte_len, imm, src_qp is the
/// expected sender's, grh).
pub type UdWc = (u64, WcStatus, WcOpcode, u32, Option<u32>, bool, bool);

/// What one UD scenario showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdObserved {
    pub name: &'static str,
    pub completions: Vec<UdWc>,
    /// Payload bytes that arrived (after each receive's GRH).
    pub data: Vec<u8>,
    /// The first receive's 40 GRH bytes (not compared: see `grh_deviation`).
    pub grh: Vec<u8>,
}

pub fn caps() -> QpCaps {
    QpCaps {
        sq_blocks: 64,
        rq_entries: 32,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline: 64,
        ..QpCaps::default()
    }
}

/// A UD QP with its own CQ and a region.
pub struct Node {
    pub qp: UdQp,
    pub cq: Cq,
    pub mr: MemoryRegion,
}

/// Several UD QPs of one protection domain (`n` nodes), each with its own CQ and region.
pub struct Net {
    pub dev: Device,
    pub pd: Pd,
    pub nodes: Vec<Node>,
}

impl Net {
    pub fn new(dev: &Device, n: usize) -> Net {
        let pd = dev.alloc_pd().expect("pd");
        let nodes = (0..n)
            .map(|_| {
                let cq = dev.create_cq(128).expect("cq");
                let qp = pd.create_ud_qp(&cq, &cq, caps(), QKEY).expect("ud qp");
                let mr = pd.alloc_mr(3 * 4096, Access::LOCAL_WRITE).expect("mr");
                Node { qp, cq, mr }
            })
            .collect();
        Net {
            dev: dev.clone(),
            pd,
            nodes,
        }
    }

    /// An address handle to node `i`.
    pub fn ah_to(&self, i: usize) -> AddressHandle {
        let ep = self.nodes[i].qp.endpoint();
        self.pd.create_ah(ep).expect("ah")
    }

    /// Waits for `n` completions of node `i` (20 s at most); `src` is the QP number their
    /// `src_qp` should name.
    pub fn wait(&mut self, i: usize, n: usize, src: u32) -> Vec<UdWc> {
        let out = super::wait_on(&self.dev, &mut self.nodes[i].cq, n);
        out.iter().map(|c| observe(c, src)).collect()
    }

    /// Polls every node a little longer (300 ms) to prove nothing else arrives.
    pub fn nothing_more(&mut self) -> bool {
        let mut out = [Completion::default(); 4];
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(300) {
            self.dev.process();
            for n in &mut self.nodes {
                if n.cq.poll(&mut out) > 0 {
                    return false;
                }
            }
        }
        true
    }

    pub fn bytes(&self, i: usize, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.nodes[i].mr.read(off, &mut v).expect("read back");
        v
    }
}

/// A completion as the scenarios compare it: for a receive, whether its source is `src`.
pub fn observe(c: &Completion, src: u32) -> UdWc {
    let recv = matches!(c.opcode, WcOpcode::Recv) && c.status == WcStatus::Success;
    (
        c.cookie,
        c.status,
        c.opcode,
        c.byte_len,
        c.imm,
        recv && c.src_qp == src,
        c.grh,
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const G: u32 = GRH_BYTES;

/// A send of a two-entry gather list into a two-entry receive (the GRH and 20 payload bytes
/// in the first entry).
fn ud_send_sgl(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 2);
    let ah = n.ah_to(1);
    let (b_qpn, a_qpn) = (n.nodes[1].qp.qpn(), n.nodes[0].qp.qpn());
    let b = &mut n.nodes[1];
    let sgl = [b.mr.sge(0, G + 20).unwrap(), b.mr.sge(200, 200).unwrap()];
    b.qp.post_recv(&sgl, 901).unwrap();
    let a = &mut n.nodes[0];
    a.mr.write(1000, &pattern(100, 5)).unwrap();
    let sgl = [a.mr.sge(1000, 60).unwrap(), a.mr.sge(1060, 40).unwrap()];
    a.qp.send_to(
        &ah,
        b_qpn,
        QKEY,
        Payload::Sgl(&sgl),
        11,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = n.wait(0, 1, a_qpn);
    completions.extend(n.wait(1, 1, a_qpn));
    let mut data = n.bytes(1, G as usize, 20);
    data.extend(n.bytes(1, 200, 80));
    UdObserved {
        name: "ud_send_sgl",
        completions,
        data,
        grh: n.bytes(1, 0, G as usize),
    }
}

/// An inline send with immediate.
fn ud_send_inline_imm(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 2);
    let ah = n.ah_to(1);
    let (b_qpn, a_qpn) = (n.nodes[1].qp.qpn(), n.nodes[0].qp.qpn());
    let b = &mut n.nodes[1];
    b.qp.post_recv(&[b.mr.sge(0, 128).unwrap()], 902).unwrap();
    n.nodes[0]
        .qp
        .send_imm_to(
            &ah,
            b_qpn,
            QKEY,
            Payload::Inline(b"hello"),
            0x0102_0304,
            12,
            PostFlags::SIGNALED.solicited(),
        )
        .unwrap();
    let mut completions = n.wait(0, 1, a_qpn);
    completions.extend(n.wait(1, 1, a_qpn));
    UdObserved {
        name: "ud_send_inline_imm",
        completions,
        data: n.bytes(1, G as usize, 8),
        grh: n.bytes(1, 0, G as usize),
    }
}

/// A datagram with the wrong Q_Key is dropped by the receiver (the sender's send succeeds:
/// nothing acknowledges a datagram); the next, right one takes the receive the dropped one
/// did not consume.
fn ud_qkey_mismatch(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 2);
    let ah = n.ah_to(1);
    let (b_qpn, a_qpn) = (n.nodes[1].qp.qpn(), n.nodes[0].qp.qpn());
    let b = &mut n.nodes[1];
    b.qp.post_recv(&[b.mr.sge(0, 128).unwrap()], 903).unwrap();
    let a = &mut n.nodes[0];
    a.qp.send_to(
        &ah,
        b_qpn,
        QKEY ^ 1,
        Payload::Inline(b"wrong"),
        13,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = n.wait(0, 1, a_qpn);
    assert!(n.nothing_more(), "a datagram with the wrong Q_Key arrived");
    n.nodes[0]
        .qp
        .send_to(
            &ah,
            b_qpn,
            QKEY,
            Payload::Inline(b"right"),
            14,
            PostFlags::SIGNALED,
        )
        .unwrap();
    completions.extend(n.wait(0, 1, a_qpn));
    completions.extend(n.wait(1, 1, a_qpn));
    UdObserved {
        name: "ud_qkey_mismatch",
        completions,
        data: n.bytes(1, G as usize, 5),
        grh: Vec::new(),
    }
}

/// A send of exactly the MTU arrives whole (`byte_len` = MTU + 40); one byte more is refused
/// before posting ([`Error::MessageTooLong`]), the queue as it was. The byte counts are
/// recorded relative to the MTU (devices differ in their MTU).
fn ud_mtu(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 2);
    let ah = n.ah_to(1);
    let (b_qpn, a_qpn) = (n.nodes[1].qp.qpn(), n.nodes[0].qp.qpn());
    let mtu = n.nodes[0].qp.mtu();
    assert!((256..=4096).contains(&mtu), "MTU {mtu}");
    let b = &mut n.nodes[1];
    b.qp.post_recv(&[b.mr.sge(0, mtu + G).unwrap()], 904)
        .unwrap();
    let a = &mut n.nodes[0];
    a.mr.write(4096, &pattern(mtu as usize + 1, 9)).unwrap();
    let free = a.qp.free_send();
    let big = [a.mr.sge(4096, mtu + 1).unwrap()];
    match a.qp.send_to(
        &ah,
        b_qpn,
        QKEY,
        Payload::Sgl(&big),
        15,
        PostFlags::SIGNALED,
    ) {
        Err(Error::MessageTooLong { len, mtu: m }) => {
            assert_eq!((len, m), (mtu as u64 + 1, mtu))
        }
        other => panic!("a send above the MTU: {other:?}"),
    }
    assert_eq!(a.qp.free_send(), free, "the refused send took queue room");
    let fit = [a.mr.sge(4096, mtu).unwrap()];
    a.qp.send_to(
        &ah,
        b_qpn,
        QKEY,
        Payload::Sgl(&fit),
        16,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = n.wait(0, 1, a_qpn);
    completions.extend(n.wait(1, 1, a_qpn));
    for c in &mut completions {
        if c.2 == WcOpcode::Recv {
            assert_eq!(c.3, mtu + G, "a full-MTU datagram's byte count");
            c.3 = u32::MAX; // "MTU + 40", the same on every device
        }
    }
    let data = n.bytes(1, G as usize, mtu as usize);
    let sent = pattern(mtu as usize, 9);
    UdObserved {
        name: "ud_mtu",
        completions,
        data: vec![(data == sent) as u8],
        grh: Vec::new(),
    }
}

/// Eight sends, the last one signaled: one send completion (its cookie), eight receives in
/// order.
fn ud_unsignaled(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 2);
    let ah = n.ah_to(1);
    let (b_qpn, a_qpn) = (n.nodes[1].qp.qpn(), n.nodes[0].qp.qpn());
    for i in 0..8u32 {
        let b = &mut n.nodes[1];
        let sge = b.mr.sge(64 * i as usize, 64).unwrap();
        b.qp.post_recv(&[sge], 910 + i as u64).unwrap();
    }
    for i in 0..8u8 {
        let flags = if i == 7 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        n.nodes[0]
            .qp
            .send_to(&ah, b_qpn, QKEY, Payload::Inline(&[i; 8]), i as u64, flags)
            .unwrap();
    }
    let mut completions = n.wait(0, 1, a_qpn);
    completions.extend(n.wait(1, 8, a_qpn));
    let data = (0..8)
        .flat_map(|i| n.bytes(1, 64 * i + G as usize, 8))
        .collect();
    assert!(n.nothing_more());
    UdObserved {
        name: "ud_unsignaled",
        completions,
        data,
        grh: Vec::new(),
    }
}

/// On rxe, datagrams go through the host's IP stack, which delivers an IPv4 multicast
/// packet (and loops back the copy of one sent here) only for a group the host joined at the
/// IP level: rdma_cm's `rdma_join_multicast` sends that IGMP join for RoCE v2, a bare
/// `ibv_attach_mcast` does not. A ConnectX steers by MAC address and needs no IP
/// membership. This joins `MGID`'s IPv4 group on the interface of `ep`'s IPv4-mapped GID
/// (kept while the socket lives); None elsewhere (the software NIC, non-IPv4 GIDs).
pub fn ip_join(dev: &Device, ep: &UdEndpoint) -> Option<std::net::UdpSocket> {
    if !dev.to_string().contains(" rxe")
        || ep.gid[..12] != [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
    {
        return None;
    }
    let local = std::net::Ipv4Addr::new(ep.gid[12], ep.gid[13], ep.gid[14], ep.gid[15]);
    let group = std::net::Ipv4Addr::new(MGID[12], MGID[13], MGID[14], MGID[15]);
    let sock = std::net::UdpSocket::bind((local, 0)).expect("a UDP socket for the IGMP join");
    sock.join_multicast_v4(&group, &local)
        .expect("IP_ADD_MEMBERSHIP");
    Some(sock)
}

/// Multicast: nodes 1 and 2 join the group, node 0 sends to it (QP `MULTICAST_QPN`
/// through an address handle to the group): both receive it from node 0. Node 2 leaves; the
/// next datagram reaches node 1 only.
fn ud_multicast(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 3);
    let a_qpn = n.nodes[0].qp.qpn();
    let (mgid, mlid) = group_of(&n.nodes[0].qp.endpoint());
    for i in [1, 2] {
        let node = &mut n.nodes[i];
        node.qp.attach_mcast(mgid, mlid).unwrap();
        for k in 0..2 {
            let sge = node.mr.sge(128 * k, 128).unwrap();
            node.qp
                .post_recv(&[sge], 920 + 10 * i as u64 + k as u64)
                .unwrap();
        }
    }
    let group =
        n.pd.create_ah(AhAttr::multicast(mgid, mlid))
            .expect("ah to the group");
    let _member = ip_join(dev, &n.nodes[0].qp.endpoint());
    let send = |n: &mut Net, msg: &[u8], cookie| {
        n.nodes[0]
            .qp
            .send_to(
                &group,
                MULTICAST_QPN,
                QKEY,
                Payload::Inline(msg),
                cookie,
                PostFlags::SIGNALED,
            )
            .unwrap()
    };
    send(&mut n, b"to all", 21);
    let mut completions = n.wait(0, 1, a_qpn);
    completions.extend(n.wait(1, 1, a_qpn));
    completions.extend(n.wait(2, 1, a_qpn));
    n.nodes[2].qp.detach_mcast(mgid, mlid).unwrap();
    send(&mut n, b"to one", 22);
    completions.extend(n.wait(0, 1, a_qpn));
    completions.extend(n.wait(1, 1, a_qpn));
    assert!(n.nothing_more(), "a detached QP (or the sender) received");
    let mut data = n.bytes(1, G as usize, 6);
    data.extend(n.bytes(2, G as usize, 6));
    data.extend(n.bytes(1, 128 + G as usize, 6));
    UdObserved {
        name: "ud_multicast",
        completions,
        data,
        grh: n.bytes(1, 0, G as usize),
    }
}

/// A QP moved to error flushes its posted receives (each once, with its cookie) and the
/// sends posted after (each once, signaled or not).
fn ud_flush(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 2);
    let ah = n.ah_to(0);
    let a_qpn = n.nodes[0].qp.qpn();
    let b = &mut n.nodes[1];
    for k in 0..2u64 {
        let sge = b.mr.sge(128 * k as usize, 128).unwrap();
        b.qp.post_recv(&[sge], 930 + k).unwrap();
    }
    b.qp.set_error().unwrap();
    b.qp.send_to(
        &ah,
        a_qpn,
        QKEY,
        Payload::Inline(b"x"),
        31,
        PostFlags::UNSIGNALED,
    )
    .unwrap();
    b.qp.send_to(
        &ah,
        a_qpn,
        QKEY,
        Payload::Inline(b"y"),
        32,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut completions = n.wait(1, 4, 0);
    // Receives and sends share the CQ: the device may interleave the two queues' flushes;
    // each queue's own order is kept.
    completions.sort_by_key(|c| c.0);
    assert!(n.nothing_more());
    UdObserved {
        name: "ud_flush",
        completions,
        data: Vec::new(),
        grh: Vec::new(),
    }
}

/// Requests the API knows cannot work are refused before posting: a controlled Q_Key, a
/// non-multicast GID to attach, a QP number above 24 bits.
fn ud_refusals(dev: &Device) -> UdObserved {
    let mut n = Net::new(dev, 2);
    let ah = n.ah_to(1);
    let mut seen = Vec::new();
    let cq = n.dev.create_cq(4).unwrap();
    let e = n.pd.create_ud_qp(&cq, &cq, caps(), 0x8000_0001);
    seen.push(matches!(e, Err(Error::InvalidParameter { .. })));
    let a = &mut n.nodes[0];
    let unicast = a.qp.endpoint().gid;
    seen.push(matches!(
        a.qp.attach_mcast(unicast, 0xc001),
        Err(Error::InvalidParameter { .. })
    ));
    let e = a.qp.send_to(
        &ah,
        1 << 24,
        QKEY,
        Payload::Inline(b"x"),
        1,
        PostFlags::SIGNALED,
    );
    seen.push(matches!(e, Err(Error::InvalidParameter { .. })));
    // Nothing was posted: no completion anywhere.
    seen.push(n.nothing_more());
    UdObserved {
        name: "ud_refusals",
        completions: Vec::new(),
        data: seen.into_iter().map(u8::from).collect(),
        grh: Vec::new(),
    }
}

/// One UD scenario.
pub type Scenario = fn(&Device) -> UdObserved;

/// Every UD scenario, by name.
pub const ALL: &[(&str, Scenario)] = &[
    ("ud_send_sgl", ud_send_sgl),
    ("ud_send_inline_imm", ud_send_inline_imm),
    ("ud_qkey_mismatch", ud_qkey_mismatch),
    ("ud_mtu", ud_mtu),
    ("ud_unsignaled", ud_unsignaled),
    ("ud_multicast", ud_multicast),
    ("ud_flush", ud_flush),
    ("ud_refusals", ud_refusals),
];

/// Runs every UD scenario on `dev`.
pub fn run_all(dev: &Device) -> Vec<UdObserved> {
    ALL.iter().map(|(_, f)| f(dev)).collect()
}

fn find<'a>(all: &'a [UdObserved], name: &str) -> &'a UdObserved {
    all.iter().find(|o| o.name == name).expect("scenario")
}

/// The outcome every device must show.
pub fn check(all: &[UdObserved]) {
    use WcOpcode::{Recv, Send};
    use WcStatus::{Success, WrFlushErr};
    let o = find(all, "ud_send_sgl");
    assert_eq!(
        o.completions,
        vec![
            (11, Success, Send, 0, None, false, false),
            (901, Success, Recv, 140, None, true, true)
        ]
    );
    assert_eq!(o.data, pattern(100, 5));
    let o = find(all, "ud_send_inline_imm");
    assert_eq!(
        o.completions[1],
        (902, Success, Recv, 45, Some(0x0102_0304), true, true)
    );
    assert_eq!(&o.data[..5], b"hello");
    let o = find(all, "ud_qkey_mismatch");
    assert_eq!(
        o.completions,
        vec![
            (13, Success, Send, 0, None, false, false),
            (14, Success, Send, 0, None, false, false),
            (903, Success, Recv, 45, None, true, true)
        ]
    );
    assert_eq!(o.data, b"right");
    let o = find(all, "ud_mtu");
    assert_eq!(
        o.completions[1],
        (904, Success, Recv, u32::MAX, None, true, true)
    );
    assert_eq!(o.data, [1], "the full-MTU datagram's bytes");
    let o = find(all, "ud_unsignaled");
    assert_eq!(o.completions[0], (7, Success, Send, 0, None, false, false));
    let cookies: Vec<u64> = o.completions[1..].iter().map(|c| c.0).collect();
    assert_eq!(cookies, (910..918).collect::<Vec<_>>());
    assert!(o.completions[1..].iter().all(|c| c.3 == 48 && c.5 && c.6));
    assert_eq!(o.data, (0..8u8).flat_map(|i| [i; 8]).collect::<Vec<_>>());
    let o = find(all, "ud_multicast");
    assert_eq!(
        o.completions,
        vec![
            (21, Success, Send, 0, None, false, false),
            (930, Success, Recv, 46, None, true, true),
            (940, Success, Recv, 46, None, true, true),
            (22, Success, Send, 0, None, false, false),
            (931, Success, Recv, 46, None, true, true),
        ]
    );
    assert_eq!(o.data, b"to allto allto one");
    let o = find(all, "ud_flush");
    let flushed: Vec<(u64, WcStatus)> = o.completions.iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(
        flushed,
        vec![
            (31, WrFlushErr),
            (32, WrFlushErr),
            (930, WrFlushErr),
            (931, WrFlushErr)
        ]
    );
    let o = find(all, "ud_refusals");
    assert_eq!(o.data, [1, 1, 1, 1], "refusals before posting");
}

/// What the GRH bytes of `o` say about the device's link, for the log: RoCE v2 over IPv4
/// (20 zero bytes, then the IPv4 header: rxe and a ConnectX on RoCE), or an InfiniBand-style
/// GRH (IP version 6 in the first nibble).
pub fn grh_deviation(o: &UdObserved) -> String {
    let g = &o.grh;
    if g.len() != 40 {
        return format!("{}: no GRH bytes kept", o.name);
    }
    if g[..20] == [0; 20] && g[20] >> 4 == 4 {
        format!(
            "{}: GRH = 20 zero bytes + IPv4 header (protocol {}, {}.{}.{}.{} -> {}.{}.{}.{})",
            o.name, g[29], g[32], g[33], g[34], g[35], g[36], g[37], g[38], g[39]
        )
    } else {
        format!(
            "{}: GRH = IPv6-style header (version {}, next header {:#x}, hop limit {})",
            o.name,
            g[0] >> 4,
            g[6],
            g[7]
        )
    }
}

/// A readable diff of two runs; empty when they agree.
pub fn diff(left: &str, l: &[UdObserved], right: &str, r: &[UdObserved]) -> String {
    let mut out = String::new();
    for (x, y) in l.iter().zip(r) {
        if x.completions != y.completions {
            out.push_str(&format!(
                "scenario {}:\n  completions on {left}:  {:?}\n  completions on {right}: {:?}\n",
                x.name, x.completions, y.completions
            ));
        }
        if x.data != y.data {
            out.push_str(&format!("scenario {}: the data differs\n", x.name));
        }
    }
    out
}
