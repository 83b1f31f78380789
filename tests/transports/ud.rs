//! Unreliable datagram on the software NIC through the direct path: address handles, Q_Keys,
//! the GRH area, MTU, receive errors, multicast, immediates, many peers, flushes.
#![cfg(feature = "sim")]

use blueflame::QueuePair;
use blueflame::{
    Access, AhAttr, Completion, Cq, Device, Error, Grh, MemoryRegion, Payload, Pd, PostFlags,
    QpCaps, UdOptions, UdQp, WcOpcode, WcStatus,
};

const GRH: usize = 40;
const MGID: [u8; 16] = [
    0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42,
];
const MLID: u16 = 0xc042;

struct Node {
    qp: UdQp,
    cq: Cq,
}

fn node(pd: &Pd, qkey: u32) -> Node {
    let dev = pd.device();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.create_ud_qp(&cq, &cq, QpCaps::default(), qkey).unwrap();
    Node { qp, cq }
}

fn poll_all(dev: &Device, cq: &mut Cq) -> Vec<Completion> {
    dev.process();
    let mut out = [Completion::default(); 64];
    let n = cq.poll(&mut out);
    out[..n].to_vec()
}

/// Lowers the port's MTU to 1024 under `from`, then posts a send of `big` (2000 bytes: past
/// the new MTU; cookie 2) and an inline byte (cookie 3) to QP `qpn` (Q_Key 1) through `ah`,
/// both signaled; returns what `from`'s CQ gives.
fn send_past_a_lowered_mtu(
    dev: &Device,
    from: &mut Node,
    ah: &blueflame::AddressHandle,
    qpn: u32,
    big: blueflame::Sge,
) -> Vec<Completion> {
    dev.nic().unwrap().set_port_mtu(1024).unwrap();
    let sgl = [big];
    from.qp
        .send_to(ah, qpn, 1, Payload::Sgl(&sgl), 2, PostFlags::SIGNALED)
        .unwrap();
    from.qp
        .send_to(ah, qpn, 1, Payload::Inline(b"x"), 3, PostFlags::SIGNALED)
        .unwrap();
    poll_all(dev, &mut from.cq)
}

fn setup() -> (Device, Pd, MemoryRegion) {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.alloc_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
    (dev, pd, mr)
}

#[test]
fn ping_pong_replies_to_the_source_qp_of_each_datagram() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 0x11);
    let mut b = node(&pd, 0x22);
    let ah_b = pd.create_ah(b.qp.endpoint()).unwrap();
    // A learns nothing of B's reply address but the port: the reply goes to src_qp.
    let ah_a = pd.create_ah(a.qp.endpoint()).unwrap();
    for round in 0..20u64 {
        b.qp.post_recv(&[mr.sge(0, 256).unwrap()], 100 + round)
            .unwrap();
        a.qp.post_recv(&[mr.sge(4096, 256).unwrap()], 200 + round)
            .unwrap();
        let ping = round.to_le_bytes();
        let eb = b.qp.endpoint();
        a.qp.send_to(
            &ah_b,
            eb.qpn,
            eb.qkey,
            Payload::Inline(&ping),
            round,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let got = poll_all(&dev, &mut b.cq);
        assert_eq!(got.len(), 1, "round {round}");
        let r = got[0];
        assert_eq!(
            (r.cookie, r.status, r.opcode),
            (100 + round, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(
            (r.byte_len, r.qpn, r.src_qp),
            (GRH as u32 + 8, b.qp.qpn(), a.qp.qpn())
        );
        let mut buf = [0u8; 8];
        mr.read(GRH, &mut buf).unwrap();
        assert_eq!(buf, ping);
        // pong: to whoever sent it
        let pong = (round * 3).to_le_bytes();
        b.qp.send_to(
            &ah_a,
            r.src_qp,
            0x11,
            Payload::Inline(&pong),
            1000 + round,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let got = poll_all(&dev, &mut a.cq);
        // A's CQ: its send's completion and the pong
        assert_eq!(got.len(), 2, "round {round}: {got:?}");
        assert_eq!(
            (got[0].cookie, got[0].opcode, got[0].status),
            (round, WcOpcode::Send, WcStatus::Success)
        );
        assert_eq!((got[1].cookie, got[1].src_qp), (200 + round, b.qp.qpn()));
        mr.read(4096 + GRH, &mut buf).unwrap();
        assert_eq!(buf, pong);
        let got = poll_all(&dev, &mut b.cq);
        assert_eq!((got.len(), got[0].cookie), (1, 1000 + round));
    }
}

#[test]
fn the_grh_holds_the_route_and_a_local_address_leaves_the_area_alone() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 5);
    let mut b = node(&pd, 5);
    let eb = b.qp.endpoint();
    let mut attr = AhAttr::from(&eb);
    let mut route = attr.grh.unwrap();
    route.traffic_class = 0x28;
    route.flow_label = 0x5_4321;
    route.hop_limit = 17;
    attr.grh = Some(route);
    let ah = pd.create_ah(attr).unwrap();
    mr.write(0, &[0xaa; 128]).unwrap();
    b.qp.post_recv(&[mr.sge(0, 128).unwrap()], 1).unwrap();
    a.qp.send_imm_to(
        &ah,
        eb.qpn,
        5,
        Payload::Inline(b"abc"),
        0x0102_0304,
        9,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let got = poll_all(&dev, &mut b.cq);
    assert!(got[0].grh);
    assert_eq!(got[0].imm, Some(0x0102_0304));
    let mut buf = [0u8; 43];
    mr.read(0, &mut buf).unwrap();
    let g = Grh::parse(&buf).unwrap();
    assert_eq!(
        (g.version(), g.traffic_class(), g.flow_label()),
        (6, 0x28, 0x5_4321)
    );
    assert_eq!((g.next_hdr, g.hop_limit), (0x1b, 17));
    // BTH 12 + DETH 8 + immediate 4 + payload 3 and its pad byte + ICRC 4
    assert_eq!(g.paylen.get(), 12 + 8 + 4 + 3 + 1 + 4);
    assert_eq!(g.sgid, a.qp.endpoint().gid);
    assert_eq!(g.dgid, eb.gid);
    assert_eq!(&buf[40..], b"abc");

    // Without global routing: no GRH, the 40 bytes stay as they were, still counted.
    let ah_local = pd.create_ah(AhAttr::from(&eb).local()).unwrap();
    mr.write(0, &[0xaa; 128]).unwrap();
    b.qp.post_recv(&[mr.sge(0, 128).unwrap()], 2).unwrap();
    a.qp.send_to(
        &ah_local,
        eb.qpn,
        5,
        Payload::Inline(b"xyz"),
        10,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let got = poll_all(&dev, &mut b.cq);
    assert_eq!((got[0].cookie, got[0].grh, got[0].byte_len), (2, false, 43));
    mr.read(0, &mut buf).unwrap();
    assert!(buf[..40].iter().all(|&x| x == 0xaa));
    assert_eq!(&buf[40..], b"xyz");
}

/// The GRH's payload length counts the bytes after it up to the ICRC, as on the wire: the
/// payload is padded to 4 bytes there (BTH PadCnt), so the length is a multiple of 4 (the
/// kernel's `ib_ud_header_init`: `(BTH + DETH + payload + ICRC + 3) & ~3`).
#[test]
fn the_grh_payload_length_counts_the_pad_to_4_bytes() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 5);
    let mut b = node(&pd, 5);
    let eb = b.qp.endpoint();
    let ah = pd.create_ah(AhAttr::from(&eb)).unwrap();
    // (payload bytes, immediate) -> BTH 12 + DETH 8 [+ immediate 4] + padded payload + ICRC 4
    for (k, (len, imm, paylen)) in [
        (0usize, false, 24u16),
        (1, false, 28),
        (3, true, 32),
        (4, false, 28),
        (5, false, 32),
        (7, true, 36),
    ]
    .into_iter()
    .enumerate()
    {
        b.qp.post_recv(&[mr.sge(0, 128).unwrap()], k as u64)
            .unwrap();
        let data = Payload::Inline(&b"0123456"[..len]);
        if imm {
            a.qp.send_imm_to(&ah, eb.qpn, 5, data, 1, k as u64, PostFlags::SIGNALED)
        } else {
            a.qp.send_to(&ah, eb.qpn, 5, data, k as u64, PostFlags::SIGNALED)
        }
        .unwrap();
        poll_all(&dev, &mut a.cq);
        let got = poll_all(&dev, &mut b.cq);
        assert_eq!(
            (got[0].cookie, got[0].byte_len, got[0].grh),
            (k as u64, (GRH + len) as u32, true)
        );
        let mut buf = [0u8; GRH];
        mr.read(0, &mut buf).unwrap();
        assert_eq!(
            Grh::parse(&buf).unwrap().paylen.get(),
            paylen,
            "{len} bytes, immediate {imm}"
        );
    }
}

#[test]
fn a_qkey_mismatch_or_a_missing_receive_drops_the_datagram_silently() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 1);
    let mut b = node(&pd, 2);
    let eb = b.qp.endpoint();
    let ah = pd.create_ah(eb).unwrap();
    // No receive posted: dropped (UD has no RNR); the sender completes.
    a.qp.send_to(
        &ah,
        eb.qpn,
        2,
        Payload::Inline(b"lost"),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let got = poll_all(&dev, &mut a.cq);
    assert_eq!((got.len(), got[0].status), (1, WcStatus::Success));
    assert!(poll_all(&dev, &mut b.cq).is_empty());
    // Wrong Q_Key: dropped, the receive stays posted.
    b.qp.post_recv(&[mr.sge(0, 128).unwrap()], 50).unwrap();
    a.qp.send_to(
        &ah,
        eb.qpn,
        3,
        Payload::Inline(b"bad key"),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let got = poll_all(&dev, &mut a.cq);
    assert_eq!(
        (got.len(), got[0].cookie, got[0].status),
        (1, 2, WcStatus::Success)
    );
    assert!(poll_all(&dev, &mut b.cq).is_empty());
    let nic = dev.nic().unwrap();
    assert_eq!(nic.qp_stats(eb.qpn).unwrap().ud_drops, 2);
    // The right key takes the receive that waited.
    a.qp.send_to(
        &ah,
        eb.qpn,
        2,
        Payload::Inline(b"good"),
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let got = poll_all(&dev, &mut b.cq);
    assert_eq!((got.len(), got[0].cookie, got[0].byte_len), (1, 50, 44));
    // A Q_Key with the privileged bit in a send means the sender's own Q_Key (1 here: drop).
    b.qp.post_recv(&[mr.sge(0, 128).unwrap()], 51).unwrap();
    a.qp.send_to(
        &ah,
        eb.qpn,
        0x8000_0002,
        Payload::Inline(b"own"),
        4,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert!(poll_all(&dev, &mut b.cq).is_empty());
    assert_eq!(nic.qp_stats(eb.qpn).unwrap().ud_drops, 3);
    let mut c = node(&pd, 2);
    let ah_b = pd.create_ah(eb).unwrap();
    c.qp.send_to(
        &ah_b,
        eb.qpn,
        0x8000_0000,
        Payload::Inline(b"own2"),
        5,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let got = poll_all(&dev, &mut b.cq);
    assert_eq!(
        (got.len(), got[0].cookie, got[0].src_qp),
        (1, 51, c.qp.qpn())
    );
    assert_eq!(poll_all(&dev, &mut c.cq).len(), 1);
}

#[test]
fn datagrams_above_the_mtu_are_refused_before_posting_and_fail_at_the_nic() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 1);
    let b = node(&pd, 1);
    let eb = b.qp.endpoint();
    let ah = pd.create_ah(eb).unwrap();
    assert_eq!(a.qp.mtu(), 4096);
    let sgl = [mr.sge(0, 4000).unwrap(), mr.sge(8192, 97).unwrap()];
    let e =
        a.qp.send_to(&ah, eb.qpn, 1, Payload::Sgl(&sgl), 1, PostFlags::SIGNALED);
    assert!(
        matches!(
            e,
            Err(Error::MessageTooLong {
                len: 4097,
                mtu: 4096
            })
        ),
        "{e:?}"
    );
    assert!(poll_all(&dev, &mut a.cq).is_empty(), "nothing posted");
    // The NIC itself: a port whose MTU dropped under the QP fails the send with a local
    // length error (the send queue goes to error; the next request is flushed).
    let got = send_past_a_lowered_mtu(&dev, &mut a, &ah, eb.qpn, mr.sge(0, 2000).unwrap());
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].cookie, got[0].status), (2, WcStatus::LocLenErr));
    assert_eq!((got[1].cookie, got[1].status), (3, WcStatus::WrFlushErr));
}

/// A send that fails at the NIC moves a UD QP to the send-queue-error state, not to error
/// (IBA 10.3.1 SQEr for UD/UC; ConnectX MLX5_QP_STATE_SQER, left with SQERR2RTS_QP in the
/// kernel's mlx5 modify_qp table): its sends are flushed, its receive queue keeps working.
#[test]
fn a_failed_ud_send_flushes_the_sends_but_the_qp_keeps_receiving() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 1);
    let mut b = node(&pd, 1);
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    let (to_a, to_b) = (pd.create_ah(ea).unwrap(), pd.create_ah(eb).unwrap());
    a.qp.post_recv(&[mr.sge(0, 256).unwrap()], 100).unwrap();
    a.qp.post_recv(&[mr.sge(256, 256).unwrap()], 101).unwrap();
    let got = send_past_a_lowered_mtu(&dev, &mut a, &to_b, eb.qpn, mr.sge(4096, 2000).unwrap());
    assert_eq!(
        got.iter().map(|c| (c.cookie, c.status)).collect::<Vec<_>>(),
        vec![(2, WcStatus::LocLenErr), (3, WcStatus::WrFlushErr)],
        "the sends fail and flush; the receives stay posted"
    );
    assert_eq!(
        dev.nic().unwrap().qp_state(a.qp.qpn()),
        Some(mlx5::sim::QpState::SqError)
    );
    b.qp.send_to(
        &to_a,
        ea.qpn,
        1,
        Payload::Inline(b"still"),
        9,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(poll_all(&dev, &mut b.cq)[0].status, WcStatus::Success);
    let got = poll_all(&dev, &mut a.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].cookie, got[0].status, got[0].byte_len, got[0].src_qp),
        (100, WcStatus::Success, GRH as u32 + 5, eb.qpn)
    );
    let mut buf = [0u8; 5];
    mr.read(GRH, &mut buf).unwrap();
    assert_eq!(&buf, b"still");
    // Moving it to error flushes the receive left, once.
    a.qp.set_error().unwrap();
    let got = poll_all(&dev, &mut a.cq);
    assert_eq!(
        got.iter().map(|c| (c.cookie, c.status)).collect::<Vec<_>>(),
        vec![(101, WcStatus::WrFlushErr)]
    );
}

/// A receive of fewer than 40 bytes can hold no datagram (even an empty one needs the GRH
/// area): a ConnectX would complete the first datagram into it with a local length error
/// and take the QP to error, so it is refused before it is posted.
#[test]
fn a_receive_without_room_for_the_grh_is_refused_before_posting() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 1);
    let mut b = node(&pd, 1);
    let free = b.qp.free_recv();
    let short = [mr.sge(0, 20).unwrap(), mr.sge(64, GRH as u32 - 21).unwrap()];
    let e = b.qp.post_recv(&short, 1);
    assert!(
        matches!(e, Err(Error::InvalidParameter { value: 39, .. })),
        "{e:?}"
    );
    assert!(matches!(
        b.qp.post_recv(&[], 2),
        Err(Error::InvalidParameter { value: 0, .. })
    ));
    assert_eq!(b.qp.free_recv(), free, "nothing posted");
    // Exactly the GRH area takes an empty datagram.
    b.qp.post_recv(&[mr.sge(0, 30).unwrap(), mr.sge(64, 10).unwrap()], 3)
        .unwrap();
    let eb = b.qp.endpoint();
    let ah = pd.create_ah(eb).unwrap();
    a.qp.send_to(&ah, eb.qpn, 1, Payload::Inline(b""), 4, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(poll_all(&dev, &mut a.cq)[0].status, WcStatus::Success);
    let got = poll_all(&dev, &mut b.cq);
    assert_eq!(
        got.iter()
            .map(|c| (c.cookie, c.status, c.byte_len))
            .collect::<Vec<_>>(),
        vec![(3, WcStatus::Success, GRH as u32)]
    );
}

#[test]
fn a_receive_shorter_than_grh_plus_payload_fails_and_flushes_the_rest() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 1);
    let mut b = node(&pd, 1);
    let eb = b.qp.endpoint();
    let ah = pd.create_ah(eb).unwrap();
    b.qp.post_recv(&[mr.sge(0, GRH as u32 + 9).unwrap()], 1)
        .unwrap();
    b.qp.post_recv(&[mr.sge(256, 256).unwrap()], 2).unwrap();
    a.qp.send_to(
        &ah,
        eb.qpn,
        1,
        Payload::Inline(b"0123456789"),
        7,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let sent = poll_all(&dev, &mut a.cq);
    assert_eq!(
        (sent.len(), sent[0].status),
        (1, WcStatus::Success),
        "UD: no answer comes back"
    );
    let got = poll_all(&dev, &mut b.cq);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].cookie, got[0].status), (1, WcStatus::LocLenErr));
    assert_eq!((got[1].cookie, got[1].status), (2, WcStatus::WrFlushErr));
    // Exactly GRH + payload fits.
    let mut c = node(&pd, 1);
    let ec = c.qp.endpoint();
    let ah_c = pd.create_ah(ec).unwrap();
    c.qp.post_recv(
        &[mr.sge(0, GRH as u32 + 4).unwrap(), mr.sge(100, 6).unwrap()],
        3,
    )
    .unwrap();
    a.qp.send_to(
        &ah_c,
        ec.qpn,
        1,
        Payload::Inline(b"0123456789"),
        8,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let got = poll_all(&dev, &mut c.cq);
    assert_eq!(
        (got[0].cookie, got[0].status, got[0].byte_len),
        (3, WcStatus::Success, 50)
    );
    let (mut x, mut y) = ([0u8; 4], [0u8; 6]);
    mr.read(GRH, &mut x).unwrap();
    mr.read(100, &mut y).unwrap();
    assert_eq!((&x[..], &y[..]), (&b"0123"[..], &b"456789"[..]));
}

#[test]
fn multicast_reaches_every_attached_qp_until_it_detaches() {
    let (dev, pd, mr) = setup();
    let mut sender = node(&pd, 9);
    let mut members: Vec<Node> = (0..3).map(|_| node(&pd, 9)).collect();
    for m in members.iter_mut() {
        m.qp.attach_mcast(MGID, MLID).unwrap();
    }
    let group = pd.create_ah(AhAttr::multicast(MGID, MLID)).unwrap();
    let post_recvs = |members: &mut Vec<Node>, cookie: u64| {
        for (i, m) in members.iter_mut().enumerate() {
            m.qp.post_recv(&[mr.sge(1024 * i, 256).unwrap()], cookie + i as u64)
                .unwrap();
        }
    };
    post_recvs(&mut members, 10);
    sender
        .qp
        .send_to(
            &group,
            0xff_ffff,
            9,
            Payload::Inline(b"tick"),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
    assert_eq!(poll_all(&dev, &mut sender.cq).len(), 1);
    for (i, m) in members.iter_mut().enumerate() {
        let got = poll_all(&dev, &mut m.cq);
        assert_eq!(got.len(), 1, "member {i}");
        assert_eq!(
            (got[0].cookie, got[0].src_qp, got[0].grh),
            (10 + i as u64, sender.qp.qpn(), true)
        );
        let mut buf = [0u8; 44];
        mr.read(1024 * i, &mut buf).unwrap();
        assert_eq!(Grh::parse(&buf).unwrap().dgid, MGID);
        assert_eq!(&buf[40..], b"tick");
    }
    // The middle one leaves: it gets nothing more (its receive stays posted).
    members[1].qp.detach_mcast(MGID, MLID).unwrap();
    assert!(dev
        .nic()
        .unwrap()
        .mcast_groups(members[1].qp.qpn())
        .is_empty());
    post_recvs(&mut members, 20);
    sender
        .qp
        .send_to(
            &group,
            0xff_ffff,
            9,
            Payload::Inline(b"tock"),
            2,
            PostFlags::SIGNALED,
        )
        .unwrap();
    poll_all(&dev, &mut sender.cq);
    let counts: Vec<usize> = members
        .iter_mut()
        .map(|m| poll_all(&dev, &mut m.cq).len())
        .collect();
    assert_eq!(counts, vec![1, 0, 1]);
    // Detaching twice is the device's refusal.
    assert!(members[1].qp.detach_mcast(MGID, MLID).is_err());
}

#[test]
fn multicast_loopback_is_on_by_default_and_can_be_blocked() {
    let (dev, pd, mr) = setup();
    let group = pd.create_ah(AhAttr::multicast(MGID, MLID)).unwrap();
    for (loopback, expect) in [(true, 2usize), (false, 1)] {
        let mut cq = dev.create_cq(64).unwrap();
        let opts = UdOptions {
            mcast_loopback: loopback,
        };
        let mut qp = pd
            .create_ud_qp_with(&cq, &cq, QpCaps::default(), 3, opts)
            .unwrap();
        qp.attach_mcast(MGID, MLID).unwrap();
        qp.post_recv(&[mr.sge(0, 128).unwrap()], 77).unwrap();
        qp.send_to(
            &group,
            0xff_ffff,
            3,
            Payload::Inline(b"me"),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let got = poll_all(&dev, &mut cq);
        assert_eq!(got.len(), expect, "loopback {loopback}: {got:?}");
        // (the receive may be written before the send's own completion: one CQ, any order)
        let recv = got.iter().find(|c| c.opcode == WcOpcode::Recv);
        assert_eq!(
            recv.map(|c| (c.cookie, c.src_qp)),
            loopback.then_some((77, qp.qpn()))
        );
        assert!(got
            .iter()
            .any(|c| (c.cookie, c.opcode) == (1, WcOpcode::Send)));
    }
}

#[test]
fn one_qp_talks_to_many_peers_through_their_address_handles() {
    let (dev, pd, mr) = setup();
    let mut hub = node(&pd, 0x77);
    let mut peers: Vec<Node> = (0..8).map(|_| node(&pd, 0x77)).collect();
    let ahs: Vec<_> = peers
        .iter()
        .map(|p| pd.create_ah(p.qp.endpoint()).unwrap())
        .collect();
    let back = pd.create_ah(hub.qp.endpoint()).unwrap();
    for (i, p) in peers.iter_mut().enumerate() {
        p.qp.post_recv(&[mr.sge(512 * i, 256).unwrap()], i as u64)
            .unwrap();
        hub.qp
            .post_recv(&[mr.sge(8192 + 512 * i, 256).unwrap()], 100 + i as u64)
            .unwrap();
    }
    for (i, ah) in ahs.iter().enumerate() {
        let qpn = peers[i].qp.qpn();
        hub.qp
            .send_to(
                ah,
                qpn,
                0x77,
                Payload::Inline(&[i as u8; 16]),
                i as u64,
                PostFlags::UNSIGNALED,
            )
            .unwrap();
    }
    for (i, p) in peers.iter_mut().enumerate() {
        let got = poll_all(&dev, &mut p.cq);
        assert_eq!(
            (got.len(), got[0].cookie, got[0].src_qp),
            (1, i as u64, hub.qp.qpn())
        );
        let mut buf = [0u8; 16];
        mr.read(512 * i + GRH, &mut buf).unwrap();
        assert_eq!(buf, [i as u8; 16]);
        p.qp.send_to(
            &back,
            hub.qp.qpn(),
            0x77,
            Payload::Inline(&[0xf0 | i as u8]),
            0,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
    }
    let got = poll_all(&dev, &mut hub.cq);
    assert_eq!(got.len(), 8, "the unsignaled sends report nothing: {got:?}");
    let mut from: Vec<u32> = got.iter().map(|c| c.src_qp).collect();
    from.sort_unstable();
    let mut want: Vec<u32> = peers.iter().map(|p| p.qp.qpn()).collect();
    want.sort_unstable();
    assert_eq!(from, want);
}

#[test]
fn a_qp_in_error_flushes_every_send_and_receive_once() {
    let (dev, pd, mr) = setup();
    let mut a = node(&pd, 1);
    let b = node(&pd, 1);
    let eb = b.qp.endpoint();
    let ah = pd.create_ah(eb).unwrap();
    for i in 0..4 {
        a.qp.post_recv(&[mr.sge(256 * i, 256).unwrap()], 10 + i as u64)
            .unwrap();
    }
    a.qp.set_error().unwrap();
    for i in 0..3 {
        a.qp.send_to(
            &ah,
            eb.qpn,
            1,
            Payload::Inline(b"x"),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    let got = poll_all(&dev, &mut a.cq);
    assert_eq!(got.len(), 7, "{got:?}");
    assert!(got.iter().all(|c| c.status == WcStatus::WrFlushErr));
    let mut cookies: Vec<u64> = got.iter().map(|c| c.cookie).collect();
    cookies.sort_unstable();
    assert_eq!(cookies, vec![0, 1, 2, 10, 11, 12, 13]);
    assert!(poll_all(&dev, &mut a.cq).is_empty());
}

#[test]
fn refusals_are_typed() {
    let (_dev, pd, mr) = setup();
    let cq = pd.device().create_cq(16).unwrap();
    let e = pd.create_ud_qp(&cq, &cq, QpCaps::default(), 0x8000_0001);
    assert!(
        matches!(
            e,
            Err(Error::InvalidParameter {
                value: 0x8000_0001,
                ..
            })
        ),
        "{e:?}"
    );
    let mut a = node(&pd, 1);
    // multicast: not a multicast GID, not a multicast LID
    let e = a.qp.attach_mcast([0xfe; 16], MLID);
    assert!(
        matches!(e, Err(Error::InvalidParameter { value: 0xfe, .. })),
        "{e:?}"
    );
    let e = a.qp.attach_mcast(MGID, 0x11);
    assert!(
        matches!(e, Err(Error::InvalidParameter { value: 0x11, .. })),
        "{e:?}"
    );
    // an address handle of another protection domain
    let pd2 = pd.device().alloc_pd().unwrap();
    let foreign = pd2.create_ah(a.qp.endpoint()).unwrap();
    let e = a.qp.send_to(
        &foreign,
        1,
        1,
        Payload::Inline(b"x"),
        1,
        PostFlags::SIGNALED,
    );
    assert!(matches!(e, Err(Error::InvalidHandle { .. })), "{e:?}");
    // a QP number above 24 bits, a port the device lacks
    let ah = pd.create_ah(a.qp.endpoint()).unwrap();
    let e = a.qp.send_to(
        &ah,
        1 << 24,
        1,
        Payload::Inline(b"x"),
        1,
        PostFlags::SIGNALED,
    );
    assert!(
        matches!(
            e,
            Err(Error::InvalidParameter {
                value: 0x100_0000,
                ..
            })
        ),
        "{e:?}"
    );
    let e = pd.create_ah(AhAttr {
        port: 2,
        ..AhAttr::default()
    });
    assert!(
        matches!(e, Err(Error::InvalidParameter { value: 2, .. })),
        "{e:?}"
    );
    // payload limits of the QP still apply (inline)
    let big = [0u8; 300];
    let e =
        a.qp.send_to(&ah, 1, 1, Payload::Inline(&big), 1, PostFlags::SIGNALED);
    assert!(
        matches!(e, Err(Error::InlineTooLong { len: 300, .. })),
        "{e:?}"
    );
    drop(mr);
}

/// A ConnectX's mini-CQE has no source QP, GRH flag or immediate: the receives of a session
/// all report the title entry's, so a UD QP whose receive CQ compresses would name the
/// wrong sender. Such a QP is refused before it is created; a compressing send CQ is fine,
/// and the same QP on a plain receive CQ names each datagram's sender.
#[test]
fn ud_receives_on_a_compressing_cq_are_refused() {
    let (dev, pd, mr) = setup();
    let opts = blueflame::CqOptions::new(256).compression(blueflame::MiniCqeFormat::Hash);
    let zcq = dev.create_cq_with(&opts).unwrap();
    let plain = dev.create_cq(256).unwrap();
    let e = pd.create_ud_qp(&plain, &zcq, QpCaps::default(), 4);
    assert!(
        matches!(&e, Err(Error::CompressedUdReceives { cqn }) if *cqn == zcq.cqn()),
        "{e:?}"
    );
    assert!(e.unwrap_err().to_string().contains("source QP"));
    // Sends may complete on a compressing CQ; receives on a plain one.
    let mut rcq = dev.create_cq(256).unwrap();
    let mut r = pd.create_ud_qp(&zcq, &rcq, QpCaps::default(), 4).unwrap();
    let er = r.endpoint();
    let ah = pd.create_ah(er).unwrap();
    let mut senders: Vec<Node> = (0..2).map(|_| node(&pd, 4)).collect();
    for i in 0..4u64 {
        r.post_recv(&[mr.sge(128 * i as usize, 128).unwrap()], i)
            .unwrap();
    }
    for (i, s) in [0, 1, 0, 1].into_iter().enumerate() {
        senders[s]
            .qp
            .send_to(
                &ah,
                er.qpn,
                4,
                Payload::Inline(&[i as u8]),
                0,
                PostFlags::UNSIGNALED,
            )
            .unwrap();
    }
    let got = poll_all(&dev, &mut rcq);
    assert_eq!(got.len(), 4);
    for (k, c) in got.iter().enumerate() {
        // The NIC serves the senders in its own order: the payload names the datagram.
        let mut sent = [0u8];
        mr.read(128 * k + GRH, &mut sent).unwrap();
        let i = sent[0] as usize;
        assert_eq!(
            c.src_qp,
            senders[i % 2].qp.qpn(),
            "receive {k} (datagram {i})"
        );
        assert!(c.grh);
    }
}

/// UD WQEs (4 DS and more) go through the RC ring machinery: the ring wraps, each single
/// post is BlueFlame-copied when it fits the register's half (and never mixed up with the
/// 8-byte doorbell), unsignaled runs are moderated, and a CQ that could overrun refuses the
/// post instead.
#[test]
fn ud_sends_wrap_the_ring_ring_blueflame_and_respect_cq_accounting() {
    let (dev, pd, mr) = setup();
    let mut cq = dev.create_cq(16).unwrap();
    let caps = QpCaps {
        sq_blocks: 16,
        ..QpCaps::default()
    };
    let mut a = pd.create_ud_qp(&cq, &cq, caps, 1).unwrap();
    let b = node(&pd, 1);
    let eb = b.qp.endpoint();
    let ah = pd.create_ah(eb).unwrap();
    let big = [7u8; 200]; // ctrl + datagram + 13 DS of inline: 4 blocks
    let mut posted = 0u64;
    let mut completed = 0u64;
    let mut refused = 0;
    let mut out = [Completion::default(); 8];
    while posted < 300 {
        let data = if posted % 3 == 0 {
            Payload::Inline(&big[..])
        } else {
            Payload::Inline(&big[..8])
        };
        let flags = if posted % 4 == 3 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        match a.send_to(&ah, eb.qpn, 1, data, posted, flags) {
            Ok(()) => posted += 1,
            Err(Error::CqFull { .. }) | Err(Error::QueueFull { .. }) => {
                refused += 1;
                dev.process();
                let n = cq.poll(&mut out);
                assert!(out[..n].iter().all(|c| c.status == WcStatus::Success));
                completed += n as u64;
            }
            Err(e) => panic!("{e:?}"),
        }
        if posted % 5 == 0 {
            dev.process();
        }
    }
    dev.process();
    completed += cq.poll(&mut out) as u64;
    assert!(refused > 0, "a CQ of 16 fills");
    assert_eq!(completed, 75, "one completion per signaled send, none lost");
    let nic = dev.nic().unwrap();
    assert!(!nic.cq_overrun(cq.cqn()));
    let s = nic.qp_stats(a.qpn()).unwrap();
    assert_eq!(s.wqes, 300);
    assert!(s.bf_copies > 0, "{s:?}");
    assert_eq!(
        (
            s.bf_mismatches,
            s.bf_violations,
            s.doorbell_misses,
            s.bf_out_of_turn
        ),
        (0, 0, 0, 0),
        "{s:?}"
    );
    drop(mr);
}

/// The same datagrams with the NIC on its own thread (the latency setting).
#[test]
fn ping_pong_with_the_nic_thread() {
    let dev = Device::sim();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let mut a = node(&pd, 3);
    let mut b = node(&pd, 3);
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    let (to_a, to_b) = (pd.create_ah(ea).unwrap(), pd.create_ah(eb).unwrap());
    let wait = |cq: &mut Cq| -> Completion {
        let mut out = [Completion::default(); 1];
        let t = std::time::Instant::now();
        loop {
            if cq.poll(&mut out) == 1 {
                return out[0];
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(20),
                "no completion"
            );
            std::thread::yield_now();
        }
    };
    for i in 0..200u64 {
        b.qp.post_recv(&[mr.sge(0, 128).unwrap()], i).unwrap();
        a.qp.post_recv(&[mr.sge(4096, 128).unwrap()], i).unwrap();
        a.qp.send_to(
            &to_b,
            eb.qpn,
            3,
            Payload::Inline(&i.to_le_bytes()),
            i,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
        let r = wait(&mut b.cq);
        assert_eq!((r.cookie, r.src_qp, r.byte_len), (i, ea.qpn, 48));
        b.qp.send_to(
            &to_a,
            ea.qpn,
            3,
            Payload::Inline(&i.to_le_bytes()),
            i,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
        let r = wait(&mut a.cq);
        assert_eq!((r.cookie, r.src_qp), (i, eb.qpn));
        let mut v = [0u8; 8];
        mr.read(4096 + GRH, &mut v).unwrap();
        assert_eq!(u64::from_le_bytes(v), i);
    }
}

/// A ConnectX's UD on-demand paging serves sends only (the kernel's
/// `mlx5_ib_internal_fill_odp_caps`: `ud_odp_caps` SEND, never RECV), and the software NIC
/// reports the same: a UD receive into an on-demand region would fault with nothing to
/// resolve it, so it is refused before posting, naming the region's lkey. RC QPs keep
/// theirs (their receive bit is checked when the region is registered).
#[test]
fn ud_receives_into_on_demand_regions_are_refused_before_posting() {
    let (dev, pd, mr) = setup();
    let caps = dev.odp_caps();
    assert!(caps.rc(false) && !caps.ud_recv(), "{caps:?}");
    let mut r = node(&pd, 4);
    let odp = pd
        .register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::ON_DEMAND)
        .unwrap();
    for sgl in [
        vec![odp.sge(0, 128).unwrap()],
        vec![mr.sge(0, 64).unwrap(), odp.sge(64, 64).unwrap()],
    ] {
        match r.qp.post_recv(&sgl, 5) {
            Err(Error::InvalidParameter { value, what }) => {
                assert_eq!(value, odp.lkey() as u64);
                assert!(what.contains("UD receive"), "{what}");
            }
            other => panic!("a UD receive into an on-demand region was accepted: {other:?}"),
        }
        assert_eq!(r.qp.free_recv(), r.qp.recv_depth(), "nothing posted");
    }
    // Pinned memory, and an empty entry naming the on-demand region, are fine.
    r.qp.post_recv(&[odp.sge(0, 0).unwrap(), mr.sge(0, 128).unwrap()], 6)
        .unwrap();
    assert_eq!(r.qp.free_recv(), r.qp.recv_depth() - 1);
}

/// Issue 27, item 6, on the software NIC: behind a switch (`NicView::set_multicast_fabric`)
/// a multicast group reaches the port only while the port is a member, through the subnet
/// manager's join (`UdQp::join_multicast`, which attaches too): attaching alone is lost on
/// the wire, as on an InfiniBand fabric; the membership lasts until its last join is left.
/// The join's address is the connection manager's: the MGID `cma_set_mgid` makes of the IP
/// group, the group's multicast LID, `RDMA_UDP_QKEY`.
#[test]
fn multicast_behind_a_switch_reaches_the_port_only_once_joined() {
    let (dev, pd, mr) = setup();
    dev.nic().unwrap().set_multicast_fabric(true);
    let qkey = blueflame::RDMA_UDP_QKEY;
    let mut sender = node(&pd, qkey);
    let mut a = node(&pd, qkey);
    let mut b = node(&pd, qkey);
    let (local, group) = ([10, 0, 0, 1].into(), [239, 1, 2, 3].into());
    let mgid = [
        0xff,
        0x12,
        0x40,
        0x01,
        0xff,
        0xff,
        0,
        0,
        0,
        0,
        0,
        0,
        239 & 0x0f,
        1,
        2,
        3,
    ];
    for (i, n) in [&mut a, &mut b].into_iter().enumerate() {
        for k in 0..4u64 {
            let at = (i * 4 + k as usize) * 256;
            n.qp.post_recv(&[mr.sge(at, 256).unwrap()], k).unwrap();
        }
    }
    let send = |sender: &mut Node, ah: &blueflame::AddressHandle, tag: u64| {
        sender
            .qp
            .send_to(
                ah,
                blueflame::MULTICAST_QPN,
                qkey,
                Payload::Inline(b"tick"),
                tag,
                PostFlags::SIGNALED,
            )
            .unwrap();
        assert_eq!(poll_all(&dev, &mut sender.cq).len(), 1);
    };
    // Attached, not joined: the switch forwards nothing to the port.
    let unjoined = pd.create_ah(AhAttr::multicast(mgid, 0xc123)).unwrap();
    a.qp.attach_mcast(mgid, 0xc123).unwrap();
    send(&mut sender, &unjoined, 1);
    assert!(
        poll_all(&dev, &mut a.cq).is_empty(),
        "lost: the port is no member"
    );
    a.qp.detach_mcast(mgid, 0xc123).unwrap();
    // Joined: the connection manager's address, and delivery.
    let g = a.qp.join_multicast(local, group).unwrap();
    assert_eq!((g.group, g.qkey), (group, qkey));
    assert_eq!(g.ah.grh.map(|r| r.dgid), Some(mgid));
    assert!((0xc000..0xffff).contains(&g.ah.dlid));
    assert_eq!(
        dev.nic().unwrap().mcast_groups(a.qp.qpn()),
        vec![(mgid, g.ah.dlid)]
    );
    let to_group = pd.create_ah(g.ah).unwrap();
    send(&mut sender, &to_group, 2);
    assert_eq!(poll_all(&dev, &mut a.cq).len(), 1);
    // B attaches only: the port is a member (A's join), so B receives too.
    b.qp.attach_mcast(mgid, g.ah.dlid).unwrap();
    send(&mut sender, &to_group, 3);
    assert_eq!(
        (
            poll_all(&dev, &mut a.cq).len(),
            poll_all(&dev, &mut b.cq).len()
        ),
        (1, 1)
    );
    // A leaves: the port's last join ends, and B, still attached, is cut off too.
    a.qp.leave_multicast(group).unwrap();
    assert!(dev.nic().unwrap().mcast_groups(a.qp.qpn()).is_empty());
    send(&mut sender, &to_group, 4);
    assert!(
        poll_all(&dev, &mut b.cq).is_empty(),
        "the port left the group"
    );
    // B joins: the group anew (the subnet manager may hand out another multicast LID:
    // the address is the join's); dropping B ends its join.
    let gb = b.qp.join_multicast(local, group).unwrap();
    assert_eq!(gb.ah.grh, g.ah.grh);
    let to_group = pd.create_ah(gb.ah).unwrap();
    send(&mut sender, &to_group, 5);
    assert_eq!(poll_all(&dev, &mut b.cq).len(), 1);
    // Refused: a second join by one QP, a group that is not multicast or of another family.
    assert!(matches!(
        b.qp.join_multicast(local, group),
        Err(Error::InvalidParameter { .. })
    ));
    for bad in [[10, 1, 2, 3].into(), "ff02::1".parse().unwrap()] {
        assert!(matches!(
            a.qp.join_multicast(local, bad),
            Err(Error::InvalidParameter { .. })
        ));
    }
    drop(b);
    a.qp.attach_mcast(mgid, gb.ah.dlid).unwrap();
    send(&mut sender, &to_group, 6);
    assert!(
        poll_all(&dev, &mut a.cq).is_empty(),
        "B's drop ended the last join"
    );
}

/// A UD QP's send depth counts its longest sends with their datagram segment: that many
/// sends of `max_inline` bytes fit in its ring at once (the depth was the RC one, 51 for
/// the default caps, where 42 such sends fit: the 43rd was refused `QueueFull`).
#[test]
fn a_ud_qp_holds_its_send_depth_of_its_longest_sends() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut a = node(&pd, 1);
    let b = node(&pd, 1);
    let ah = pd.create_ah(b.qp.endpoint()).unwrap();
    let depth = a.qp.send_depth();
    let longest = vec![7u8; QpCaps::default().max_inline as usize];
    for i in 0..depth {
        a.qp.send_to(
            &ah,
            b.qp.qpn(),
            1,
            Payload::Inline(&longest),
            i as u64,
            PostFlags::SIGNALED,
        )
        .unwrap_or_else(|e| panic!("send {i} of a depth of {depth}: {e:?}"));
    }
}
