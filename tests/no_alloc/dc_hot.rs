//! The DCI's posts and the polls of its completions never allocate (a counting global
//! allocator measures each call; the software NIC's processing runs outside them), and DC
//! runs on the software NIC's own thread (thread mode) as in stepped mode.

use crate::alloc_count;

use alloc_count::allocs;
use blueflame::*;

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
const DCT_ALL: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

#[test]
fn dci_posts_and_polls_never_allocate() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut tcq = dev.create_cq(256).unwrap();
    let mut srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dcts: Vec<Dct> = (0..2)
        .map(|k| pd.create_dct(&tcq, &srq, 40 + k, DCT_ALL).unwrap())
        .collect();
    let peers: Vec<DcPeer> = dcts.iter().map(|d| d.peer().unwrap()).collect();
    let mr = pd.alloc_mr(8192, ALL).unwrap();
    let mut cq = dev.create_cq(256).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let data = [0x5au8; 64];
    let mut out = [Completion::default(); 64];
    let (mut total, mut done, mut recvs) = (0u64, 0usize, 0usize);
    const N: u64 = 500;
    for it in 0..=N {
        let mut t = 0u64;
        let p = &peers[(it % 2) as usize];
        let m = |f: &mut dyn FnMut() -> Result<()>, t: &mut u64| {
            let before = allocs();
            f().unwrap();
            *t += allocs() - before;
        };
        let sge = mr.sge(0, 64).unwrap();
        let remote = mr.remote(1024).unwrap();
        let before = allocs();
        srq.post_recv(&[mr.sge(4096, 64).unwrap()], it).unwrap();
        t += allocs() - before;
        m(
            &mut || {
                dci.to(p)
                    .write_inline(&data[..8], remote, 1, PostFlags::UNSIGNALED)
            },
            &mut t,
        );
        m(
            &mut || dci.to(p).write(&[sge], remote, 2, PostFlags::UNSIGNALED),
            &mut t,
        );
        m(
            &mut || {
                dci.to(p).read(
                    &[mr.sge(2048, 64).unwrap()],
                    remote,
                    3,
                    PostFlags::UNSIGNALED,
                )
            },
            &mut t,
        );
        m(
            &mut || {
                dci.to(p)
                    .send(Payload::Inline(&data[..16]), 4, PostFlags::UNSIGNALED)
            },
            &mut t,
        );
        let reply = mr.sge(3072, 8).unwrap();
        m(
            &mut || {
                dci.to(p)
                    .fetch_add(mr.remote(512).unwrap(), 1, reply, 5, PostFlags::SIGNALED)
            },
            &mut t,
        );
        let before = allocs();
        let mut b = dci.batch();
        b.push(
            p,
            &Request::Write {
                remote,
                data: Payload::Inline(&data[..8]),
            },
            6,
            PostFlags::UNSIGNALED,
        )
        .unwrap();
        b.push(
            p,
            &Request::Write {
                remote,
                data: Payload::Inline(&data[..8]),
            },
            7,
            PostFlags::SIGNALED,
        )
        .unwrap();
        b.ring();
        t += allocs() - before;
        dev.process();
        let before = allocs();
        let k = cq.poll(&mut out);
        let r = tcq.poll(&mut out);
        t += allocs() - before;
        assert!(out[..r].iter().all(|c| c.status == WcStatus::Success));
        done += k;
        recvs += r;
        if it > 0 {
            // Iteration 0 is the warm-up: the pollers learn their queues (once per attach).
            total += t;
        }
    }
    assert_eq!(
        total, 0,
        "allocations in {N} iterations of DCI posts and polls"
    );
    assert_eq!(done as u64, 2 * (N + 1));
    assert_eq!(recvs as u64, N + 1);
    assert_eq!(mr.read_u64(512).unwrap(), N + 1);
}

#[test]
fn dc_runs_on_the_software_nics_thread() {
    let dev = Device::sim();
    let pd = dev.alloc_pd().unwrap();
    let mut tcq = dev.create_cq(64).unwrap();
    let mut srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &srq, 9, DCT_ALL).unwrap();
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    let peer = dct.peer().unwrap();
    let mut out = [Completion::default(); 8];
    for i in 0..200u64 {
        srq.post_recv(&[mr.sge(2048, 64).unwrap()], i).unwrap();
        dci.to(&peer)
            .write_inline(
                &i.to_ne_bytes(),
                mr.remote(0).unwrap(),
                i,
                PostFlags::UNSIGNALED,
            )
            .unwrap();
        dci.to(&peer)
            .send(Payload::Inline(&i.to_ne_bytes()), i, PostFlags::SIGNALED)
            .unwrap();
        let t0 = std::time::Instant::now();
        let (mut s, mut r) = (0, 0);
        while s < 1 || r < 1 {
            s += cq.poll(&mut out[..1]);
            if s == 1 {
                assert_eq!((out[0].cookie, out[0].status), (i, WcStatus::Success));
            }
            let k = tcq.poll(&mut out[1..2]);
            if k == 1 {
                assert_eq!((out[1].cookie, out[1].qpn), (i, dct.dctn()));
            }
            r += k;
            assert!(t0.elapsed().as_secs() < 30, "no completion for request {i}");
        }
        assert_eq!(
            mr.read_u64(0).unwrap(),
            i,
            "the write landed before the send completed"
        );
    }
}
