//! No CQ-accounting livelock: a queue refused for want of CQ entries (`Error::CqFull`) has
//! a completion on its way, so polling frees room, even when the user posts nothing
//! signaled. Before: with a CQ smaller than about half the send ring, every outstanding
//! request could be unsignaled (the forced signal came every half ring only), and the QP
//! waited for ever on a completion nothing would produce.

use crate::common;

use blueflame::*;
use common::*;

fn caps() -> QpCaps {
    QpCaps {
        sq_blocks: 16,
        max_inline: 28,
        ..QpCaps::default()
    }
}

/// Posts `n` unsignaled one-byte writes on each QP in turn, then a signaled NOP on each
/// (what gives a QP's entries back once it stops: its unsignaled tail retires with it); on
/// `CqFull` runs the NIC and polls, then goes on. Panics when a whole round of the QPs
/// still posting is refused twice in a row with the CQ polled in between: nothing was on
/// its way (the livelock). A QP with nothing of its own outstanding may be refused while
/// the others hold the CQ's entries (their completions free them).
fn unsignaled_round_robin(dev: &Device, cq: &mut Cq, qps: &mut [Qp], mr: &MemoryRegion, n: usize) {
    let mut out = [Completion::default(); 16];
    let mut seen = Vec::new();
    let mut next = vec![0usize; qps.len()];
    let mut idle_rounds = 0;
    while next.iter().any(|&i| i <= n) {
        let mut progress = false;
        for (k, qp) in qps.iter_mut().enumerate() {
            let i = next[k];
            let at = k * n + i;
            let r = match i.cmp(&n) {
                core::cmp::Ordering::Greater => continue,
                core::cmp::Ordering::Less => {
                    let remote = mr.remote(at).unwrap();
                    qp.write_inline(&[k as u8 + 1], remote, at as u64, PostFlags::UNSIGNALED)
                }
                core::cmp::Ordering::Equal => qp.post(&Request::Nop, k as u64, PostFlags::SIGNALED),
            };
            match r {
                Ok(()) => {
                    next[k] += 1;
                    progress = true;
                }
                Err(Error::CqFull { .. }) => {
                    dev.process();
                    // Forced signals are not reported: only the NOPs are.
                    let got = cq.poll(&mut out);
                    seen.extend(out[..got].iter().map(|c| (c.cookie, c.opcode)));
                }
                Err(e) => panic!("QP {k} post {i}: {e}"),
            }
        }
        idle_rounds = if progress { 0 } else { idle_rounds + 1 };
        assert!(
            idle_rounds < 2,
            "stuck at posts {next:?}: nothing signaled in flight"
        );
    }
    dev.process();
    let got = cq.poll(&mut out);
    seen.extend(out[..got].iter().map(|c| (c.cookie, c.opcode)));
    seen.sort_by_key(|s| s.0);
    let nops: Vec<_> = (0..qps.len() as u64).map(|k| (k, WcOpcode::Nop)).collect();
    assert_eq!(seen, nops);
    assert!(!nic(dev).cq_overrun(cq.cqn()));
    for k in 0..qps.len() {
        assert_eq!(bytes(mr, k * n, n), vec![k as u8 + 1; n], "QP {k}");
    }
}

#[test]
fn an_unsignaled_stream_on_a_cq_smaller_than_half_the_ring_never_stalls() {
    // The report: a CQ of 8, a 16-block ring, unsignaled posts: stuck at post 3.
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(8).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, caps()).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    unsignaled_round_robin(&dev, &mut cq, std::slice::from_mut(&mut qp), &mr, 200);
}

#[test]
fn qps_sharing_a_small_cq_all_unsignaled_never_stall() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(8).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let mut qps: Vec<Qp> = (0..3)
        .map(|_| {
            let mut qp = pd.create_qp(&cq, &cq, caps()).unwrap();
            let q = qp.endpoint().unwrap();
            qp.connect(&q).unwrap();
            qp
        })
        .collect();
    unsignaled_round_robin(&dev, &mut cq, &mut qps, &mr, 100);
}

#[test]
fn a_long_unsignaled_stream_on_default_caps_and_a_cq_of_16_never_stalls() {
    // Default caps: 256-block ring (forced signal every 128 blocks), WQEs up to 6 blocks.
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let q = qp.endpoint().unwrap();
    qp.connect(&q).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    unsignaled_round_robin(&dev, &mut cq, std::slice::from_mut(&mut qp), &mr, 1000);
}
