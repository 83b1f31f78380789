//! Shared receive queues on a real verbs device (rxe in the VM: `ibv_create_srq`,
//! `ibv_post_srq_recv`, `ibv_modify_srq`, QPs created with `srq`, the SRQ-limit and
//! last-WQE-reached async events), and the same program on the software NIC.

use crate::scenarios;

use blueflame::*;
use scenarios::srq::SrqFan;
use scenarios::*;
use std::collections::HashMap;

/// Eight QPs receive into one SRQ of 15 while it is refilled: 96 messages of 1 to 300
/// bytes, each once, in the receive its completion names, on the QP it was sent to, with
/// its bytes; no completion lost.
fn fan_traffic(dev: &Device) {
    let mut f = SrqFan::new(dev, 8, 15);
    const SLOT: usize = 512;
    let cap = f.srq.capacity() as u64;
    let mut next = 0u64; // receive k uses slot k % 64
    let post = |f: &mut SrqFan, next: &mut u64| {
        while f.srq.free() > 0 {
            let at = (*next % 64) as usize * SLOT;
            f.srq
                .post_recv(&[f.mr_s.sge(at, SLOT as u32).unwrap()], *next)
                .unwrap();
            *next += 1;
        }
    };
    post(&mut f, &mut next);
    assert!(next >= 15 && next == cap, "capacity {cap}");
    let server_of: HashMap<u32, usize> = f
        .servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.qpn(), i))
        .collect();
    let mut seq = [0u32; 8];
    let mut got: HashMap<usize, Vec<u32>> = HashMap::new();
    for m in 0..96usize {
        let c = (m * 5) % 8;
        let len = 8 + (m * 37) % 293;
        let mut msg: Vec<u8> = (0..len).map(|i| (i * 7 + m) as u8).collect();
        msg[..4].copy_from_slice(&(c as u32).to_le_bytes());
        msg[4..8].copy_from_slice(&seq[c].to_le_bytes());
        f.mr_c.write(c * SLOT, &msg).unwrap();
        let sge = f.mr_c.sge(c * SLOT, len as u32).unwrap();
        f.clients[c]
            .send(Payload::Sgl(&[sge]), m as u64, PostFlags::SIGNALED)
            .unwrap();
        seq[c] += 1;
        let s = f.wait(false, 1);
        assert!(s[0].is_ok(), "{:?}", s[0]);
        let r = f.wait(true, 1);
        let r = r[0];
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(r.byte_len, len as u32);
        assert_eq!(server_of[&r.qpn], c, "arrived on the client's server");
        let at = (r.cookie % 64) as usize * SLOT;
        assert_eq!(Pair::bytes(&f.mr_s, at, len), msg, "message {m}");
        got.entry(c)
            .or_default()
            .push(u32::from_le_bytes(msg[4..8].try_into().unwrap()));
        // Refilled now and then, not after every message.
        if m % 5 == 4 {
            post(&mut f, &mut next);
        }
    }
    assert!(f.nothing_more());
    for (c, s) in got {
        assert_eq!(s, (0..seq[c]).collect::<Vec<_>>(), "client {c}");
    }
}

/// What the API refuses on the device, before posting.
fn refusals(dev: &Device) {
    let mut f = SrqFan::new(dev, 1, 15);
    let sge = f.mr_s.sge(0, 8).unwrap();
    assert!(matches!(
        f.servers[0].post_recv(&[sge], 1),
        Err(Error::SrqQp { .. })
    ));
    let cap = f.srq.capacity();
    assert!(matches!(
        f.srq.set_limit(cap + 1),
        Err(Error::InvalidParameter { .. })
    ));
    let many = vec![sge; f.srq.max_sge() + 1];
    assert!(matches!(
        f.srq.post_recv(&many, 1),
        Err(Error::TooManySge { .. })
    ));
    for i in 0..cap {
        f.srq.post_recv(&[sge], i as u64).unwrap();
    }
    assert!(matches!(
        f.srq.post_recv(&[sge], 99),
        Err(Error::QueueFull { free: 0, .. })
    ));
}

/// A QP dropped before the receive it consumed from the SRQ was polled: the SRQ gets that
/// receive's slot back (and its region pin) once the receive CQ is polled, as rdma-core's
/// `__mlx5_cq_clean` gives the WQE back with `mlx5_free_srq_wqe`; the SRQ can be filled
/// to its capacity again. (On the verbs path over rxe, whose kernel leaves the dropped QP's
/// completions in the CQ, the poller once dropped them as of an unknown QP and the slot was
/// lost for good: `Srq::free` one lower per such drop.)
fn receives_of_a_dropped_qp_come_back(dev: &Device) {
    let pd = dev.alloc_pd().unwrap();
    let mut scq = dev.create_cq(64).unwrap();
    let mut rcq = dev.create_cq(64).unwrap();
    let srq_caps = SrqCaps {
        entries: 7,
        max_sge: 1,
    };
    let mut srq = pd.create_srq(&rcq, srq_caps).unwrap();
    let cap = srq.capacity();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    for round in 0..3u64 {
        let mut s = pd.create_qp_with_srq(&scq, &srq, caps()).unwrap();
        let mut c = pd.create_qp(&scq, &scq, caps()).unwrap();
        let (es, ec) = (s.endpoint().unwrap(), c.endpoint().unwrap());
        s.connect(&ec).unwrap();
        c.connect(&es).unwrap();
        srq.post_recv(&[mr.sge(0, 64).unwrap()], round).unwrap();
        c.send(Payload::Inline(b"hello"), round, PostFlags::SIGNALED)
            .unwrap();
        let done = wait_on(dev, &mut scq, 1);
        assert!(done[0].is_ok(), "round {round}: {:?}", done[0]);
        // The server goes with its receive's completion not polled.
        drop(s);
        drop(c);
        let mut out = [Completion::default(); 8];
        for _ in 0..20 {
            rcq.poll(&mut out);
            if srq.free() == cap {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(
            srq.free(),
            cap,
            "round {round}: the SRQ's slot of the dropped QP's receive on {dev}"
        );
    }
    for i in 0..cap {
        let sge = mr.sge(64 * (i as usize % 60), 64).unwrap();
        srq.post_recv(&[sge], 100 + i as u64)
            .unwrap_or_else(|e| panic!("receive {i} of {cap}: {e}"));
    }
}

#[test]
fn fan_and_refusals_on_the_software_nic() {
    fan_traffic(&Device::sim());
    refusals(&Device::sim());
    receives_of_a_dropped_qp_come_back(&Device::sim());
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn srq_on_the_device() {
    let Some(dev) = device::under_test() else {
        return device::skipped("srq_on_the_device");
    };
    fan_traffic(&dev);
    refusals(&dev);
    receives_of_a_dropped_qp_come_back(&dev);
    let mut hw: Vec<Observed> = srq::ALL.iter().map(|(_, f)| f(&dev)).collect();
    for line in srq::normalize_rxe(&dev, &mut hw) {
        println!("documented rxe deviation: {line}");
    }
    let sim: Vec<Observed> = srq::ALL.iter().map(|(_, f)| f(&Device::sim())).collect();
    let d = diff("software NIC (direct)", &sim, &dev.to_string(), &hw);
    assert!(d.is_empty(), "the two paths differ:\n{d}");
    srq::check(&hw);
    println!("SRQ: identical on the software NIC and {}", dev);
}
