//! UD on a real device (rxe in the VM of `cargo xtask test`), through the verbs path with
//! both rdma-core APIs (`ibv_wr_send` + `ibv_wr_set_ud_addr`, and `ibv_post_send` with
//! `wr.ud`): ping-pong with the GRH and the source QP, immediates, Q_Key mismatch dropped,
//! the MTU, multicast to several QPs and detach, flushes, refusals before posting
//! (`tests/scenarios/ud.rs`); and what rxe does that a ConnectX does not. Ignored on the
//! host.

use crate::scenarios;

use blueflame::*;
use scenarios::device;
use scenarios::ud::{self, Net, GRH_BYTES, MGID, QKEY};
use std::time::{Duration, Instant};

/// One test at a time in this process, whatever `--test-threads` says: `with_api` sets a
/// process-wide variable, and the multicast tests join 239.1.2.3 at the IP level, which
/// another test's "nothing delivered without a join" would see.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` with `BLUEFLAME_VERBS_API=value` (tests run one at a time: [`serial`]).
fn with_api<T>(value: &str, f: impl FnOnce() -> T) -> T {
    std::env::set_var("BLUEFLAME_VERBS_API", value);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::env::remove_var("BLUEFLAME_VERBS_API");
    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn ud_scenarios_on_both_verbs_apis() {
    let _one = serial();
    let Some(dev) = device::under_test() else {
        return device::skipped("ud_scenarios_on_both_verbs_apis");
    };
    for (value, api) in [
        ("extended", VerbsApi::Extended),
        ("legacy", VerbsApi::Legacy),
    ] {
        with_api(value, || {
            let n = Net::new(&dev, 1);
            assert_eq!(n.nodes[0].qp.verbs_api(), Some(api), "{value}");
            assert_eq!(n.nodes[0].qp.data_path(), DataPath::Verbs);
            let all = ud::run_all(&dev);
            for o in &all {
                if !o.grh.is_empty() {
                    println!("{value}: {}", ud::grh_deviation(o));
                }
            }
            ud::check(&all);
            println!("{value}: {} UD scenarios as expected", all.len());
        });
    }
}

/// Polls `cq` for `ms` milliseconds; the completions seen. Only to show that nothing
/// (more) arrives: what must arrive is waited for with [`until`].
fn drain(dev: &Device, cq: &mut Cq, ms: u64) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut out = [Completion::default(); 8];
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(ms) {
        dev.process();
        let n = cq.poll(&mut out);
        all.extend_from_slice(&out[..n]);
    }
    all
}

/// How long a completion that must come is waited for: rxe runs under qemu without KVM on
/// a shared 2-core host, where one datagram has been seen to take 250 ms (perftest's own
/// `t_max`), so a fixed window of a few hundred milliseconds loses completions that are only
/// late, and the test reads a late datagram as a lost one.
const ARRIVAL: Duration = Duration::from_secs(20);

/// Polls `cq` until a completion with each of `cookies` has come (at most [`ARRIVAL`]),
/// then `extra_ms` milliseconds more to catch what should not come; every completion seen.
fn until(dev: &Device, cq: &mut Cq, cookies: &[u64], extra_ms: u64) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut out = [Completion::default(); 8];
    let start = Instant::now();
    while !cookies
        .iter()
        .all(|k| all.iter().any(|c: &Completion| c.cookie == *k))
        && start.elapsed() < ARRIVAL
    {
        dev.process();
        let n = cq.poll(&mut out);
        all.extend_from_slice(&out[..n]);
    }
    all.extend(drain(dev, cq, extra_ms));
    all
}

/// What rxe (Linux 6.1, rdma-core 44) does where a ConnectX differs or the specification
/// leaves room, as seen in the VM (the README's "UD on rxe" list, each checked here):
/// 1. multicast is delivered only once the host joined the group at the IP level (rxe's
///    packets go through the IP stack; a ConnectX steers by MAC), and then also to the
///    sending QP when it is a member (multicast loopback, as a ConnectX by default);
/// 2. a datagram longer than its receive fails the receive with `LocQpOpErr` (a ConnectX:
///    `LocLenErr`), the sender's send succeeds;
/// 3. a datagram to a QP number nobody has is dropped, the send succeeds (both);
/// 4. the GRH area holds 20 zero bytes and the IPv4 header (RoCE v2 over IPv4, as a
///    ConnectX on RoCE v2), not an InfiniBand GRH;
/// 5. a send with a privileged Q_Key arrives with the sender's own Q_Key.
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn what_rxe_does_with_datagrams() {
    let _one = serial();
    let Some(dev) = device::under_test() else {
        return device::skipped("what_rxe_does_with_datagrams");
    };
    if !dev.to_string().contains(" rxe") {
        return println!("SKIPPED what_rxe_does_with_datagrams: {} is not rxe", dev);
    }
    let mut n = Net::new(&dev, 2);
    let b_qpn = n.nodes[1].qp.qpn();
    let a_qpn = n.nodes[0].qp.qpn();
    let ah = n.ah_to(1);
    // 1. Multicast, the sender a member of its group.
    let group = n.pd.create_ah(AhAttr::multicast(MGID, 0)).unwrap();
    for i in 0..2 {
        let node = &mut n.nodes[i];
        node.qp.attach_mcast(MGID, 0).unwrap();
        let sge = node.mr.sge(0, 128).unwrap();
        node.qp.post_recv(&[sge], 100 + i as u64).unwrap();
    }
    let mcast = |n: &mut Net, msg: &[u8], cookie: u64, own: &[u64], other: &[u64]| {
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
            .unwrap();
        let mut on_a_wanted = vec![cookie];
        on_a_wanted.extend_from_slice(own);
        let on_a = until(&dev, &mut n.nodes[0].cq, &on_a_wanted, 200);
        let on_b = until(&dev, &mut n.nodes[1].cq, other, 200);
        assert!(
            on_a.iter().any(|c| c.cookie == cookie && c.is_ok()),
            "the send completes"
        );
        (on_a, on_b)
    };
    let (on_a, on_b) = mcast(&mut n, b"none", 9, &[], &[]);
    assert_eq!(
        (on_a.len(), on_b.len()),
        (1, 0),
        "no IP-level join: nothing delivered"
    );
    let _member = ud::ip_join(&dev, &n.nodes[0].qp.endpoint());
    let (on_a, on_b) = mcast(&mut n, b"self", 1, &[100], &[101]);
    let got = |v: &[Completion], cookie| v.iter().find(|c| c.cookie == cookie).copied();
    let other = got(&on_b, 101).expect("the other member receives");
    let own = got(&on_a, 100).expect("the sending member receives its own datagram");
    for c in [other, own] {
        assert_eq!(
            (c.status, c.byte_len, c.src_qp, c.grh),
            (WcStatus::Success, 44, a_qpn, true)
        );
    }
    for i in 0..2 {
        n.nodes[i].qp.detach_mcast(MGID, 0).unwrap();
    }
    // 2. A datagram longer than its receive.
    let b = &mut n.nodes[1];
    let sge = b.mr.sge(1024, 48).unwrap();
    b.qp.post_recv(&[sge], 200).unwrap();
    let a = &mut n.nodes[0];
    a.qp.send_to(
        &ah,
        b_qpn,
        QKEY,
        Payload::Inline(&[7u8; 32]),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let on_a = until(&dev, &mut n.nodes[0].cq, &[2], 0);
    let on_b = until(&dev, &mut n.nodes[1].cq, &[200], 100);
    assert!(
        on_a.iter().any(|c| c.cookie == 2 && c.is_ok()),
        "the send completes"
    );
    let c = got(&on_b, 200).expect("the receive completes");
    assert_eq!(
        c.status,
        WcStatus::LocQpOpErr,
        "rxe: {c:?} (a ConnectX: LocLenErr)"
    );
    // 3. A datagram to a QP number nobody has.
    let a = &mut n.nodes[0];
    a.qp.send_to(
        &ah,
        0xff_fff0,
        QKEY,
        Payload::Inline(b"lost"),
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let on_a = until(&dev, &mut n.nodes[0].cq, &[3], 0);
    assert!(on_a.iter().any(|c| c.cookie == 3 && c.is_ok()), "{on_a:?}");
    // 4. The GRH area of a unicast datagram.
    let mut m = Net::new(&dev, 2);
    let ah = m.ah_to(1);
    let b = &mut m.nodes[1];
    b.qp.post_recv(&[b.mr.sge(0, 64).unwrap()], 300).unwrap();
    let b_qpn = b.qp.qpn();
    m.nodes[0]
        .qp
        .send_to(
            &ah,
            b_qpn,
            QKEY,
            Payload::Inline(b"grh"),
            4,
            PostFlags::SIGNALED,
        )
        .unwrap();
    let _ = m.wait(1, 1, 0);
    let g = m.bytes(1, 0, 40);
    let ip = &g[20..];
    let gid = m.nodes[1].qp.endpoint().gid;
    assert_eq!(&g[..20], &[0u8; 20], "{g:?}");
    assert_eq!(
        (ip[0], ip[9]),
        (0x45, 17),
        "an IPv4 header of a UDP packet: {g:?}"
    );
    assert_eq!(
        (&ip[12..16], &ip[16..20]),
        (&gid[12..16], &gid[12..16]),
        "addresses"
    );
    // 5. A Q_Key with the high bit set sends with the sender's own Q_Key (IBA C10-15): the
    //    crate puts it in the request, since rxe sends the key as given and its receiver
    //    drops a key it does not hold (`init_req_packet`, `check_keys`).
    let b = &mut m.nodes[1];
    b.qp.post_recv(&[b.mr.sge(0, 64).unwrap()], 301).unwrap();
    m.nodes[0]
        .qp
        .send_to(
            &ah,
            b_qpn,
            QKEY_PRIVILEGED,
            Payload::Inline(b"own"),
            5,
            PostFlags::SIGNALED,
        )
        .unwrap();
    let on_b = until(&dev, &mut m.nodes[1].cq, &[301], 100);
    assert!(
        on_b.iter().any(|c| c.cookie == 301 && c.is_ok()),
        "delivered with the sender's own Q_Key: {on_b:?}"
    );
}

/// Every combination of send payload (inline, one gather entry, two) and receive list (one
/// entry, two, the GRH alone in the first) on both APIs: each datagram arrives whole.
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn gather_and_scatter_lists() {
    let _one = serial();
    let Some(dev) = device::under_test() else {
        return device::skipped("gather_and_scatter_lists");
    };
    let mut failed = Vec::new();
    for api in ["extended", "legacy"] {
        with_api(api, || {
            for send in ["inline", "sgl1", "sgl2"] {
                for recv in ["one", "two", "grh-apart"] {
                    let mut n = Net::new(&dev, 2);
                    let ah = n.ah_to(1);
                    let b_qpn = n.nodes[1].qp.qpn();
                    let b = &mut n.nodes[1];
                    let g = GRH_BYTES;
                    let sgl = match recv {
                        "one" => vec![b.mr.sge(0, g + 64).unwrap()],
                        "two" => vec![b.mr.sge(0, g + 20).unwrap(), b.mr.sge(1024, 64).unwrap()],
                        _ => vec![b.mr.sge(0, g).unwrap(), b.mr.sge(1024, 64).unwrap()],
                    };
                    b.qp.post_recv(&sgl, 7).unwrap();
                    let a = &mut n.nodes[0];
                    let msg: Vec<u8> = (0..48u8).collect();
                    a.mr.write(2048, &msg).unwrap();
                    let g1 = [a.mr.sge(2048, 48).unwrap()];
                    let g2 = [a.mr.sge(2048, 30).unwrap(), a.mr.sge(2078, 18).unwrap()];
                    let data = match send {
                        "inline" => Payload::Inline(&msg),
                        "sgl1" => Payload::Sgl(&g1),
                        _ => Payload::Sgl(&g2),
                    };
                    a.qp.send_to(&ah, b_qpn, QKEY, data, 1, PostFlags::SIGNALED)
                        .unwrap();
                    let sent = until(&dev, &mut n.nodes[0].cq, &[1], 0);
                    let got = until(&dev, &mut n.nodes[1].cq, &[7], 100);
                    let ok = got.len() == 1 && got[0].is_ok() && got[0].byte_len == g + 48;
                    println!(
                        "{api} send {send} recv {recv}: sender {:?} receiver {:?}",
                        sent.iter().map(|c| c.status).collect::<Vec<_>>(),
                        got.iter()
                            .map(|c| (c.status, c.byte_len, c.src_qp, c.grh))
                            .collect::<Vec<_>>()
                    );
                    if !ok {
                        failed.push(format!("{api}/{send}/{recv}"));
                    }
                }
            }
        });
    }
    assert!(failed.is_empty(), "datagrams lost: {failed:?}");
}

/// An address handle dropped right after the send that names it: the send still completes
/// successfully and its datagram arrives, 200 times (the UD queue keeps each AH until its
/// request completed; rxe's requester looks the AH up by number when it processes the WQE,
/// which may be after the post returned, and fails the send with `LocQpOpErr` when the AH
/// is gone).
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn a_send_outlives_its_dropped_address_handle() {
    let _one = serial();
    let Some(dev) = device::under_test() else {
        return device::skipped("a_send_outlives_its_dropped_address_handle");
    };
    let mut n = Net::new(&dev, 2);
    let b_qpn = n.nodes[1].qp.qpn();
    let rounds = 200u64;
    let mut bad = Vec::new();
    for i in 0..rounds {
        let b = &mut n.nodes[1];
        let sge = b.mr.sge(0, GRH_BYTES + 64).unwrap();
        b.qp.post_recv(&[sge], 1000 + i).unwrap();
        let ah = n.ah_to(1);
        n.nodes[0]
            .qp
            .send_to(
                &ah,
                b_qpn,
                QKEY,
                Payload::Inline(b"dropped ah"),
                i,
                PostFlags::SIGNALED,
            )
            .unwrap();
        drop(ah);
        let sent = until(&dev, &mut n.nodes[0].cq, &[i], 0);
        let got = until(&dev, &mut n.nodes[1].cq, &[1000 + i], 0);
        if !sent.iter().any(|c| c.cookie == i && c.is_ok())
            || !got.iter().any(|c| c.cookie == 1000 + i && c.is_ok())
        {
            bad.push((i, sent, got));
            break;
        }
    }
    assert!(bad.is_empty(), "{bad:?}");
}

/// A group joined through the connection manager (`UdQp::join_multicast`:
/// `rdma_join_multicast`, which on RoCE v2 also joins the IP group) delivers to its
/// members with no IP-level join of the program's own (the bare `attach_mcast` of
/// `ud_multicast` needs one on rxe); a member that leaves gets nothing more; a second join
/// of the group by one QP, and a join by a QP of another Q_Key, are refused.
#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn a_group_joined_through_the_connection_manager_delivers() {
    let _one = serial();
    let Some(dev) = device::under_test() else {
        return device::skipped("a_group_joined_through_the_connection_manager_delivers");
    };
    let pd = dev.alloc_pd().expect("pd");
    let mut nodes: Vec<(UdQp, Cq, MemoryRegion)> = (0..3)
        .map(|_| {
            let cq = dev.create_cq(64).expect("cq");
            let qp = pd
                .create_ud_qp(&cq, &cq, ud::caps(), RDMA_UDP_QKEY)
                .expect("ud qp");
            let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).expect("mr");
            (qp, cq, mr)
        })
        .collect();
    let ep = nodes[0].0.endpoint();
    assert_eq!(
        ep.gid[..12],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff],
        "{ep:?}"
    );
    let local = std::net::IpAddr::from([ep.gid[12], ep.gid[13], ep.gid[14], ep.gid[15]]);
    // Not the group of the other multicast tests (which join theirs at the IP level).
    let group = std::net::IpAddr::from([239, 1, 2, 9]);
    let mut joined = None;
    for (qp, _, mr) in &mut nodes[1..] {
        let g = qp.join_multicast(local, group).expect("join");
        assert_eq!(g.qkey, RDMA_UDP_QKEY);
        for k in 0..2 {
            let sge = mr.sge(128 * k, 128).expect("sge");
            qp.post_recv(&[sge], 700 + k as u64).expect("recv");
        }
        joined = Some(g);
    }
    let g = joined.expect("a member");
    println!("joined {group} from {local}: {:?}", g.ah);
    // A second join of the same group, and a QP of another Q_Key, are refused.
    assert!(matches!(
        nodes[1].0.join_multicast(local, group),
        Err(Error::InvalidParameter { .. })
    ));
    let cq_x = dev.create_cq(8).expect("cq");
    let mut other = pd.create_ud_qp(&cq_x, &cq_x, ud::caps(), QKEY).expect("qp");
    assert!(matches!(
        other.join_multicast(local, group),
        Err(Error::InvalidParameter { .. })
    ));
    let ah = pd.create_ah(g.ah).expect("ah to the group");
    let wait = |cq: &mut Cq, n: usize| -> Vec<Completion> {
        let mut got = Vec::new();
        let mut out = [Completion::default(); 4];
        let t = Instant::now();
        while got.len() < n {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{} of {n}",
                got.len()
            );
            let k = cq.poll(&mut out);
            got.extend_from_slice(&out[..k]);
        }
        got
    };
    let send = |nodes: &mut Vec<(UdQp, Cq, MemoryRegion)>, msg: &[u8], cookie| {
        let (qp, cq, _) = &mut nodes[0];
        qp.send_to(
            &ah,
            MULTICAST_QPN,
            RDMA_UDP_QKEY,
            Payload::Inline(msg),
            cookie,
            PostFlags::SIGNALED,
        )
        .expect("send to the group");
        let c = wait(cq, 1);
        assert!(c[0].is_ok(), "{c:?}");
    };
    send(&mut nodes, b"to all", 1);
    for i in [1, 2] {
        let c = wait(&mut nodes[i].1, 1);
        assert!(
            c[0].is_ok() && c[0].byte_len == GRH_BYTES + 6,
            "member {i}: {c:?}"
        );
        let mut b = [0u8; 6];
        nodes[i].2.read(GRH_BYTES as usize, &mut b).expect("read");
        assert_eq!(&b, b"to all");
    }
    nodes[2].0.leave_multicast(group).expect("leave");
    assert!(matches!(
        nodes[2].0.leave_multicast(group),
        Err(Error::InvalidParameter { .. })
    ));
    send(&mut nodes, b"to one", 2);
    let c = wait(&mut nodes[1].1, 1);
    assert!(c[0].is_ok(), "{c:?}");
    std::thread::sleep(Duration::from_millis(300));
    let mut out = [Completion::default(); 2];
    assert_eq!(nodes[2].1.poll(&mut out), 0, "a member that left received");
}
