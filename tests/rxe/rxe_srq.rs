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

#[test]
fn fan_and_refusals_on_the_software_nic() {
    fan_traffic(&Device::sim());
    refusals(&Device::sim());
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn srq_on_the_device() {
    let Some(dev) = device::under_test() else {
        return device::skipped("srq_on_the_device");
    };
    fan_traffic(&dev);
    refusals(&dev);
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
