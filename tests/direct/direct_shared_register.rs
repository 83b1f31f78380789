//! Many QPs on few BlueFlame registers (rdma-core `mlx5_get_qp_uar`: the first QPs of a
//! context get a register each, the next ones share), from one thread and from several:
//! the offset alternates per register whichever QP rings, BlueFlame copies never mix, every
//! completion arrives; a thread domain per QP gives each its own register.

use crate::common;

use blueflame::*;
use common::*;
use mlx5::sim::RegKind;
use std::sync::{Arc, Barrier};

/// A device whose QPs share `shared` registers (no thread domains, no dedicated registers).
fn shared_only(shared: u32) -> UarConfig {
    UarConfig {
        dedicated: 0,
        shared,
        thread_domains: 0,
    }
}

/// Inline payloads of 8 bytes (one block, the fast path) and 100 bytes (two blocks, a
/// two-block BlueFlame copy), in turn.
fn payload(i: u64) -> Vec<u8> {
    let len = if i % 2 == 0 { 8 } else { 100 };
    (0..len)
        .map(|k| (i as u8).wrapping_add((k as u8).wrapping_mul(7)))
        .collect()
}

#[test]
fn rings_alternate_per_register_not_per_queue() {
    // Two registers, four QPs: two QPs on each. Every ring is checked on its own (a pass of
    // the NIC after each post): it must use the half the register's previous ring left, even
    // when that ring was another QP's. A per-queue offset (each queue starting at half 0)
    // rings the same half twice in a row here.
    let dev = Device::sim_with(Default::default(), shared_only(2), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let caps = QpCaps {
        max_inline: 128,
        ..QpCaps::default()
    };
    let mut qps: Vec<Qp> = (0..4)
        .map(|_| pd.create_qp(&cq, &cq, caps).unwrap())
        .collect();
    for q in &mut qps {
        let n = q.endpoint().unwrap();
        q.connect(&n).unwrap();
        assert_eq!(q.doorbell_mode(), Some(DoorbellMode::SharedLocked));
        assert_eq!(nic(&dev).qp_register(n.qpn), Some((RegKind::Shared, 2)));
    }
    let m = pd.alloc_mr(4096, ALL).unwrap();
    let mut wc = [Completion::default(); 16];
    for i in 0..200u64 {
        let q = &mut qps[(i % 4) as usize];
        let data = payload(i);
        q.write_inline(
            &data,
            m.remote(128 * (i as usize % 4)).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
        dev.process();
        assert_eq!(cq.poll(&mut wc), 1);
        assert_eq!((wc[0].cookie, wc[0].status), (i, WcStatus::Success));
        let mut got = vec![0u8; data.len()];
        m.read(128 * (i as usize % 4), &mut got).unwrap();
        assert_eq!(got, data);
    }
    for q in &qps {
        let st = nic(&dev).qp_stats(q.qpn()).unwrap();
        assert_eq!(st.doorbells, 50, "{st:?}");
        assert_eq!(st.bf_copies, 50, "{st:?}");
        assert_eq!(
            (st.bf_out_of_turn, st.doorbell_misses, st.bf_mismatches),
            (0, 0, 0),
            "{st:?}"
        );
    }
}

#[test]
fn two_queues_ring_one_register_between_passes() {
    // Both QPs of one register ring before the NIC looks: both rings must be visible, one in
    // each half. (Registers come in pages of two: the third QP shares the first's.)
    let dev = Device::sim_with(Default::default(), shared_only(1), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(1024).unwrap();
    let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let _other = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mut b = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let (na, nb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    assert_eq!(nic(&dev).qp_register(na.qpn), Some((RegKind::Shared, 2)));
    assert_eq!(nic(&dev).qp_register(nb.qpn), Some((RegKind::Shared, 2)));
    a.connect(&na).unwrap();
    b.connect(&nb).unwrap();
    let m = pd.alloc_mr(4096, ALL).unwrap();
    let mut wc = [Completion::default(); 4];
    for i in 0..50u64 {
        a.write_inline(
            &i.to_le_bytes(),
            m.remote(0).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
        b.write_inline(
            &i.to_le_bytes(),
            m.remote(8).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
        dev.process();
        assert_eq!(cq.poll_n(&mut wc, 2, 1000), 2);
    }
    for q in [na, nb] {
        let st = nic(&dev).qp_stats(q.qpn).unwrap();
        assert_eq!((st.doorbells, st.bf_copies), (50, 50), "{st:?}");
        assert_eq!((st.bf_out_of_turn, st.doorbell_misses), (0, 0), "{st:?}");
    }
}

#[test]
fn rdma_core_allocation_dedicated_then_shared() {
    // rdma-core's defaults: 4 dedicated registers, then 12 shared ones allocated as QPs
    // come, then the least used shared register: the 17th QP is the first to share.
    let uars = UarConfig {
        thread_domains: 0,
        ..UarConfig::default()
    };
    let dev = Device::sim_with(Default::default(), uars, false);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let caps = QpCaps {
        sq_blocks: 16,
        rq_entries: 0,
        ..QpCaps::default()
    };
    let qps: Vec<Qp> = (0..20)
        .map(|_| pd.create_qp(&cq, &cq, caps).unwrap())
        .collect();
    let kinds: Vec<_> = qps
        .iter()
        .map(|q| nic(&dev).qp_register(q.qpn()).unwrap())
        .collect();
    assert!(
        kinds[..4].iter().all(|k| *k == (RegKind::Dedicated, 1)),
        "{kinds:?}"
    );
    assert!(
        kinds[4..16].iter().all(|k| k.0 == RegKind::Shared),
        "{kinds:?}"
    );
    let sharing = kinds.iter().filter(|k| k.1 > 1).count();
    assert_eq!(
        sharing, 8,
        "QPs 17..20 share with 4 earlier ones: {kinds:?}"
    );
    // Without a thread domain the driver cannot know a register is not shared: locked.
    assert!(qps
        .iter()
        .all(|q| q.doorbell_mode() == Some(DoorbellMode::SharedLocked)));
}

#[test]
fn thread_domain_gives_a_register_of_its_own() {
    // The default device has registers for thread domains: every QP gets one (one domain per
    // QP), rings without a lock; when they run out, QPs fall back to shared registers.
    let uars = UarConfig {
        thread_domains: 4,
        ..UarConfig::default()
    };
    let dev = Device::sim_with(Default::default(), uars, false);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let caps = QpCaps {
        sq_blocks: 16,
        rq_entries: 0,
        ..QpCaps::default()
    };
    let qps: Vec<Qp> = (0..6)
        .map(|_| pd.create_qp(&cq, &cq, caps).unwrap())
        .collect();
    let modes: Vec<_> = qps.iter().map(|q| q.doorbell_mode().unwrap()).collect();
    assert_eq!(&modes[..4], &[DoorbellMode::Dedicated; 4]);
    assert_eq!(&modes[4..], &[DoorbellMode::SharedLocked; 2]);
    for q in &qps[..4] {
        assert_eq!(
            nic(&dev).qp_register(q.qpn()),
            Some((RegKind::ThreadDomain, 1))
        );
    }
    // A dropped QP gives its domain's register back.
    drop(qps);
    let q = pd.create_qp(&cq, &cq, caps).unwrap();
    assert_eq!(q.doorbell_mode(), Some(DoorbellMode::Dedicated));
    // No BlueFlame: 8-byte doorbells, whatever the register.
    let nobf = QpCaps { bf_size: 0, ..caps };
    let q0 = pd.create_qp(&cq, &cq, nobf).unwrap();
    assert_eq!(q0.doorbell_mode(), Some(DoorbellMode::DoorbellOnly));
}

/// One posting thread's QPs and CQ.
struct Worker {
    qps: Vec<Qp>,
    cq: Cq,
    mr: MemoryRegion,
}

const PER_THREAD: usize = 4;

/// One round of one posting thread: one signaled inline write per QP, then its completions
/// (exactly one each, successful) and the bytes.
fn one_round(w: &mut Worker, t: usize, round: u64) {
    let mut wc = [Completion::default(); 16];
    for (j, q) in w.qps.iter_mut().enumerate() {
        let cookie = round << 16 | (t * PER_THREAD + j) as u64;
        let data = payload(round + j as u64);
        q.write_inline(
            &data,
            w.mr.remote(128 * j).unwrap(),
            cookie,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    let mut seen = [false; PER_THREAD];
    let mut got = 0;
    let mut spins = 0u64;
    while got < PER_THREAD {
        let n = w.cq.poll(&mut wc);
        for c in &wc[..n] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            assert_eq!(c.cookie >> 16, round, "{c:?}");
            let j = (c.cookie & 0xffff) as usize - t * PER_THREAD;
            assert!(!seen[j], "two completions for one write: {c:?}");
            seen[j] = true;
        }
        got += n;
        spins += 1;
        assert!(spins < 100_000_000, "round {round}: completions lost");
        if n == 0 {
            std::thread::yield_now();
        }
    }
    for j in 0..PER_THREAD {
        let data = payload(round + j as u64);
        let mut back = vec![0u8; data.len()];
        w.mr.read(128 * j, &mut back).unwrap();
        assert_eq!(back, data, "thread {t} QP {j} round {round}");
    }
}

#[test]
fn stress_many_queues_few_registers_many_threads() {
    // 16 QPs: 4 with a thread domain's register, 2 on rdma-core's dedicated registers (rung
    // locked: the driver cannot know they are not shared), 10 on 2 shared registers (5 each);
    // 4 threads posting at once with the NIC in thread mode. Each
    // round every QP posts one signaled inline write (1 or 2 blocks: BlueFlame copies);
    // every completion and every byte is checked; at the end of each round, with all
    // threads waiting, the NIC checks each register: no mixed copy, and both halves written
    // on every register rung twice or more (the offset alternates per register).
    const THREADS: usize = 4;
    const ROUNDS: u64 = 1000;
    let uars = UarConfig {
        dedicated: 2,
        shared: 2,
        thread_domains: 4,
    };
    let dev = Device::sim_with(Default::default(), uars, true);
    let nic = nic(&dev);
    let pd = dev.alloc_pd().unwrap();
    let caps = QpCaps {
        max_inline: 128,
        sq_blocks: 64,
        rq_entries: 0,
        ..QpCaps::default()
    };
    let mut workers: Vec<Worker> = (0..THREADS)
        .map(|_| Worker {
            qps: Vec::new(),
            cq: dev.create_cq(256).unwrap(),
            mr: pd.alloc_mr(PER_THREAD * 128, ALL).unwrap(),
        })
        .collect();
    // QP k goes to thread k % THREADS: QPs of one register land in different threads.
    for k in 0..THREADS * PER_THREAD {
        let w = &mut workers[k % THREADS];
        let mut q = pd.create_qp(&w.cq, &w.cq, caps).unwrap();
        let n = q.endpoint().unwrap();
        q.connect(&n).unwrap();
        w.qps.push(q);
    }
    let modes: Vec<_> = workers
        .iter()
        .flat_map(|w| w.qps.iter().map(|q| q.doorbell_mode().unwrap()))
        .collect();
    assert_eq!(
        modes
            .iter()
            .filter(|m| **m == DoorbellMode::Dedicated)
            .count(),
        4
    );
    let shared: Vec<u32> = workers
        .iter()
        .flat_map(|w| w.qps.iter().map(|q| q.qpn()))
        .filter(|&n| nic.qp_register(n).unwrap().0 == RegKind::Shared)
        .collect();
    assert_eq!(shared.len(), 10);
    assert!(shared.iter().all(|&n| nic.qp_register(n).unwrap().1 == 5));

    let start = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    // A failing thread records why and keeps meeting the barriers (no hang).
    let failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let handles: Vec<_> = workers
        .into_iter()
        .enumerate()
        .map(|(t, mut w)| {
            let (start, done, failure) = (start.clone(), done.clone(), failure.clone());
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    start.wait();
                    if failure.lock().unwrap().is_none() {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            one_round(&mut w, t, round)
                        }));
                        if let Err(e) = r {
                            let why = e
                                .downcast_ref::<String>()
                                .cloned()
                                .unwrap_or_else(|| "panic".into());
                            *failure.lock().unwrap() = Some(format!("thread {t}: {why}"));
                        }
                    }
                    done.wait();
                }
                w
            })
        })
        .collect();
    let mut total = mlx5::sim::RegisterCheck::default();
    for _ in 0..ROUNDS {
        start.wait();
        done.wait();
        if let Some(why) = failure.lock().unwrap().as_ref() {
            panic!("{why}");
        }
        let c = nic.check_registers();
        assert_eq!((c.torn, c.out_of_turn), (0, 0), "{c:?}");
        total.copies += c.copies;
        total.registers = c.registers;
    }
    let workers: Vec<Worker> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // Every register in use was seen, and BlueFlame copies were found in them.
    assert_eq!(total.registers, 4 + 2 + 2, "{total:?}");
    assert!(total.copies > ROUNDS, "{total:?}");
    drop(workers);
}

/// A register whose queues are all gone may be rung from either half by the next queue
/// that takes it (blueflame and UCX start at the first half of a register they take anew,
/// rdma-core goes on from its `bf->offset`): the software NIC said "out of turn".
#[test]
fn a_register_reused_after_its_queues_are_gone_starts_in_either_half() {
    // One shared register. QP a rings it once (half 0) and is dropped; QP b, created after,
    // gets the same register (rdma-core: the least used shared one; its `mlx5_bf`, with
    // `bf->offset`, lives as long as the context) and rings once.
    let dev = Device::sim_with(Default::default(), shared_only(1), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let m = pd.alloc_mr(4096, ALL).unwrap();
    let mut wc = [Completion::default(); 4];
    let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let na = a.endpoint().unwrap();
    a.connect(&na).unwrap();
    a.write_inline(&[1; 8], m.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    assert_eq!(cq.poll_n(&mut wc, 1, 1000), 1);
    let reg_a = nic(&dev).qp_register(na.qpn);
    drop(a);
    let mut b = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let nb = b.endpoint().unwrap();
    b.connect(&nb).unwrap();
    assert_eq!(nic(&dev).qp_register(nb.qpn), reg_a);
    b.write_inline(&[2; 8], m.remote(8).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    assert_eq!(cq.poll_n(&mut wc, 1, 1000), 1);
    let st = nic(&dev).qp_stats(nb.qpn).unwrap();
    assert_eq!((st.bf_copies, st.bf_out_of_turn), (1, 0), "{st:?}");
}

/// Doorbell-only queues share one register's 8-byte slot: two rings before the NIC looks
/// are two doorbells, neither missed (the software NIC counted the first as missed).
#[test]
fn two_doorbell_only_queues_ring_between_passes() {
    // No BlueFlame (rdma-core's `nc_uar`: every QP of the context rings one register, 8-byte
    // doorbells, no lock). Two QPs ring before the NIC looks: each 8-byte store is its own
    // doorbell to a ConnectX; neither is missed.
    let dev = Device::sim_with(Default::default(), shared_only(1), false);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let caps = QpCaps {
        bf_size: 0,
        ..QpCaps::default()
    };
    let mut a = pd.create_qp(&cq, &cq, caps).unwrap();
    let mut b = pd.create_qp(&cq, &cq, caps).unwrap();
    let (na, nb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
    assert_eq!(a.doorbell_mode(), Some(DoorbellMode::DoorbellOnly));
    assert_eq!(nic(&dev).qp_register(na.qpn), nic(&dev).qp_register(nb.qpn));
    a.connect(&na).unwrap();
    b.connect(&nb).unwrap();
    let m = pd.alloc_mr(4096, ALL).unwrap();
    let mut wc = [Completion::default(); 4];
    a.write_inline(&[1; 8], m.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    b.write_inline(&[2; 8], m.remote(8).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    dev.process();
    assert_eq!(cq.poll_n(&mut wc, 2, 1000), 2);
    for q in [na, nb] {
        let st = nic(&dev).qp_stats(q.qpn).unwrap();
        assert_eq!(st.doorbell_misses, 0, "QP {}: {st:?}", q.qpn);
    }
}

/// QPs created on a shared register while the last other queue on it leaves, from several
/// threads: a creation never fails. The register's shared state dies with its last queue;
/// a creation that found it still listed, then saw it die (the queue leaving on another
/// thread), refused the register as in use (`Error::RegisterInUse`), which is only for a
/// register claimed as some queue's own.
#[test]
fn queues_join_a_register_its_last_queue_leaves() {
    let dev = Device::sim_with(Default::default(), shared_only(1), false);
    let pd = dev.alloc_pd().unwrap();
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (dev, pd, start) = (dev.clone(), pd.clone(), start.clone());
            std::thread::spawn(move || {
                let cq = dev.create_cq(64).unwrap();
                let caps = QpCaps {
                    sq_blocks: 16,
                    rq_entries: 0,
                    ..QpCaps::default()
                };
                start.wait();
                for i in 0..20_000 {
                    match pd.create_qp(&cq, &cq, caps) {
                        Ok(q) => assert_eq!(q.doorbell_mode(), Some(DoorbellMode::SharedLocked)),
                        Err(e) => panic!("creation {i}: {e}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
