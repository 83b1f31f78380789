//! The post and poll calls of the direct path never allocate: a counting global allocator
//! measures each call (the software NIC's processing, which allocates, runs outside the
//! measured calls).

use crate::alloc_count;
use crate::common;

use alloc_count::allocs;
use blueflame::*;
use common::*;

/// Runs `f`, adding the allocations it made to `total`.
#[inline(always)]
fn measured<R>(total: &mut u64, f: impl FnOnce() -> R) -> R {
    let before = allocs();
    let r = f();
    *total += allocs() - before;
    r
}

#[test]
fn post_and_poll_never_allocate() {
    // The counter itself works.
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 10]);
    assert_eq!(allocs() - before, 1);
    drop(v);

    let mut s = Setup::loopback(QpCaps::default());
    let m = s.mr(8192, ALL);
    let q = s.a.qpn();
    let data = [0x5au8; 64];
    let mut out = [Completion::default(); 64];
    let mut total = 0u64;
    let mut completions = 0usize;
    let mut recvs = 0usize;
    // Iteration 0 is the warm-up: the poller learns its QPs (once per attach).
    const N: u64 = 2000;
    for it in 0..=N {
        let mut t = 0u64;
        let sgl = [m.sge(0, 16).unwrap(), m.sge(100, 32).unwrap()];
        let rsgl = [m.sge(1000, 8).unwrap(), m.sge(1100, 24).unwrap()];
        let local = m.sge(2048, 8).unwrap();
        let rbuf = [m.sge(4000, 64).unwrap()];
        measured(&mut t, || s.a.post_recv(&rbuf, it)).unwrap();
        measured(&mut t, || {
            s.a.write_inline(&data[..8], m.remote(3000).unwrap(), it, PostFlags::SIGNALED)
        })
        .unwrap();
        measured(&mut t, || {
            s.a.write(&sgl, m.remote(3100).unwrap(), it, PostFlags::UNSIGNALED)
        })
        .unwrap();
        measured(&mut t, || {
            s.a.read(&rsgl, m.remote(3200).unwrap(), it, PostFlags::SIGNALED)
        })
        .unwrap();
        measured(&mut t, || {
            s.a.fetch_add(m.remote(2000).unwrap(), 1, local, it, PostFlags::SIGNALED)
        })
        .unwrap();
        measured(&mut t, || {
            s.a.compare_swap(
                m.remote(2000).unwrap(),
                it,
                it,
                local,
                it,
                PostFlags::UNSIGNALED,
            )
        })
        .unwrap();
        measured(&mut t, || {
            s.a.send(Payload::Inline(&data[..20]), it, PostFlags::SIGNALED)
        })
        .unwrap();
        measured(&mut t, || {
            let mut b = s.a.batch();
            for k in 0..16u64 {
                let req = Request::Write {
                    remote: m.remote(5000 + 64 * k as usize).unwrap(),
                    data: Payload::Inline(&data[..40]),
                };
                let flags = if k == 15 {
                    PostFlags::SIGNALED
                } else {
                    PostFlags::UNSIGNALED
                };
                b.push(&req, it, flags).unwrap();
            }
            b.ring().rung();
        });
        // A dropped batch (rewound) allocates nothing either.
        measured(&mut t, || {
            let mut b = s.a.batch();
            b.push(&Request::Nop, it, PostFlags::SIGNALED).unwrap();
        });
        // An empty poll.
        let n = measured(&mut t, || s.cq_a.poll(&mut out));
        assert_eq!(n, 0);

        // The NIC runs outside the measured calls (the stepped sim allocates).
        s.dev.process();

        let mut got = 0;
        loop {
            let n = measured(&mut t, || s.cq_a.poll(&mut out[..7]));
            if n == 0 {
                break;
            }
            for c in &out[..n] {
                assert!(c.is_ok(), "{c:?}");
                assert_eq!(c.cookie, it);
                if c.opcode == WcOpcode::Recv {
                    recvs += 1;
                }
            }
            got += n;
        }
        // inline write, read, fetch-add, send, batch tail; plus the receive.
        assert_eq!(got, 6, "iteration {it}");
        assert_eq!(free_send(&mut s.a), 256);
        if it > 0 {
            total += t;
            completions += got;
        }
    }
    assert_eq!(total, 0, "allocations in {N} iterations of post + poll");
    assert_eq!(completions, 6 * N as usize);
    assert_eq!(recvs, N as usize + 1);
    assert_eq!(m.read_u64(2000).unwrap(), N + 1);
    let st = nic(&s.dev).qp_stats(q).unwrap();
    assert_eq!(st.wqes, (N + 1) * 22);
}
