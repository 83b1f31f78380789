//! Requests that used to be accepted and then never complete (or complete somewhere else), on
//! the software NIC: a QP on another device's CQ, posts that bypass the QP's state check, and
//! memory-window binds the NIC is bound to fail. Each is refused before posting now, and a
//! bind's key advances only when the bind succeeded.

use crate::scenarios;

use blueflame::*;
use scenarios::Pair;

const REGION: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0
        | Access::MW_BIND.0,
);
const RW: Access = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

fn pair() -> Pair {
    Pair::new(
        &Device::sim_stepped(),
        REGION,
        scenarios::caps(),
        &Timing::default(),
    )
}

/// Polls `cq` (running its stepped NIC) until `n` completions arrived; panics after 100k
/// empty polls.
fn wait(cq: &mut Cq, n: usize) -> Vec<Completion> {
    let mut out = vec![Completion::default(); n];
    assert_eq!(cq.poll_n(&mut out, n, 100_000), n, "completions missing");
    out
}

/// A's signaled inline write of `data` to `rkey` at `addr`; returns its status.
fn write(p: &mut Pair, data: &[u8], addr: u64, rkey: u32, cookie: u64) -> WcStatus {
    p.a.write_inline(data, Remote { addr, rkey }, cookie, PostFlags::SIGNALED)
        .unwrap();
    let c = p.wait(false, 1)[0];
    assert_eq!(c.0, cookie);
    c.1
}

#[test]
fn a_qp_on_a_cq_of_another_device_is_refused() {
    let (dev_a, dev_b) = (Device::sim_stepped(), Device::sim_stepped());
    let mut cq_b = dev_b.create_cq(16).unwrap();
    let _cq_a = dev_a.create_cq(16).unwrap(); // the same CQ number on A
    let pd_b = dev_b.alloc_pd().unwrap();
    let mut qp_b = pd_b
        .create_qp(&cq_b, &cq_b, scenarios::caps())
        .expect("B's own QP");
    let pd_a = dev_a.alloc_pd().unwrap();
    let cq_a2 = dev_a.create_cq(16).unwrap();
    for (s, r) in [(&cq_b, &cq_a2), (&cq_a2, &cq_b)] {
        let e = pd_a.create_qp(s, r, scenarios::caps());
        assert!(
            matches!(e, Err(Error::InvalidHandle { value, .. }) if value == cq_b.cqn() as u64),
            "{e:?}"
        );
    }
    // B's QP (the same QP number as the refused one would have had) keeps its completions.
    qp_b.connect(&qp_b.endpoint().unwrap()).unwrap();
    let mr = pd_b.alloc_mr(64, REGION).unwrap();
    qp_b.write_inline(b"mine", mr.remote(0).unwrap(), 7, PostFlags::SIGNALED)
        .unwrap();
    let c = wait(&mut cq_b, 1)[0];
    assert_eq!(
        (c.cookie, c.status, c.qpn),
        (7, WcStatus::Success, qp_b.qpn())
    );
}

#[test]
fn a_bind_before_connect_is_refused() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mr = pd.alloc_mr(256, REGION).unwrap();
    let mut mw = pd.alloc_mw(MwType::Two).unwrap();
    let key = mw.rkey();
    let e = qp.bind_mw(&mut mw, &mr, 0, 64, RW, 1, PostFlags::SIGNALED);
    assert!(matches!(e, Err(Error::InvalidState { .. })), "{e:?}");
    assert_eq!(mw.rkey(), key);
    qp.connect(&qp.endpoint().unwrap()).unwrap();
    let k = qp
        .bind_mw(&mut mw, &mr, 0, 64, RW, 2, PostFlags::SIGNALED)
        .unwrap();
    let c = wait(&mut cq, 1)[0];
    assert_eq!(
        (c.cookie, c.status),
        (2, WcStatus::Success),
        "only the second bind"
    );
    assert_eq!(mw.rkey(), k);
}

#[test]
fn binding_a_bound_type2_window_is_refused_and_the_qp_lives() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let k1 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 128, RW, 1, PostFlags::SIGNALED)
            .unwrap();
    // Refused before posting, whether or not the first bind has completed yet.
    let free = p.b.free_send();
    let e =
        p.b.bind_mw(&mut mw, &p.mr_b, 128, 128, RW, 2, PostFlags::SIGNALED);
    assert!(
        matches!(e, Err(Error::WindowState { rkey, .. }) if rkey == k1),
        "{e:?}"
    );
    assert_eq!(p.b.free_send(), free, "nothing posted");
    assert_eq!(p.wait(true, 1)[0].0, 1);
    let e =
        p.b.bind_mw(&mut mw, &p.mr_b, 128, 128, RW, 3, PostFlags::SIGNALED);
    assert!(matches!(e, Err(Error::WindowState { .. })), "{e:?}");
    assert_eq!(mw.rkey(), k1, "the key did not move");
    // The QP and the window still work.
    let base = p.mr_b.addr();
    assert_eq!(write(&mut p, b"ok", base + 4, k1, 4), WcStatus::Success);
    assert!(p.nothing_more());
}

#[test]
fn a_failed_bind_keeps_the_windows_key() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let mut qp1 = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    let mut qp2 = pd.create_qp(&cq, &cq, scenarios::caps()).unwrap();
    qp1.connect(&qp1.endpoint().unwrap()).unwrap();
    qp2.connect(&qp2.endpoint().unwrap()).unwrap();
    let mr = pd.alloc_mr(256, REGION).unwrap();
    let mut mw = pd.alloc_mw(MwType::Two).unwrap();
    let k0 = mw.rkey();
    // The bind is flushed: the NIC never saw it.
    qp1.set_error().unwrap();
    let k1 = qp1
        .bind_mw(&mut mw, &mr, 0, 64, RW, 1, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(mw.rkey(), k1, "in flight: the key it will have");
    let c = wait(&mut cq, 1)[0];
    assert_eq!((c.cookie, c.status), (1, WcStatus::WrFlushErr));
    assert_eq!(mw.rkey(), k0, "failed: the key from before");
    assert!(!mw.is_bound());
    // The window is usable through another QP, with the key the NIC holds.
    let k2 = qp2
        .bind_mw(&mut mw, &mr, 0, 64, RW, 2, PostFlags::SIGNALED)
        .unwrap();
    let c = wait(&mut cq, 1)[0];
    assert_eq!((c.cookie, c.status), (2, WcStatus::Success));
    assert_eq!(mw.rkey(), k2);
    qp2.write_inline(
        b"via k2",
        Remote {
            addr: mr.addr(),
            rkey: k2,
        },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(wait(&mut cq, 1)[0].status, WcStatus::Success);
}

#[test]
fn an_unsignaled_bind_commits_with_a_later_completion() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    let k1 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 64, RW, 1, PostFlags::UNSIGNALED)
            .unwrap();
    p.b.write_inline(b"x", p.mr_a.remote(0).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(p.wait(true, 1)[0].0, 2);
    assert!(mw.is_bound());
    // Unbind (a local invalidate) and bind again through the same QP, nothing polled between.
    let k = p.b.unbind_mw(&mut mw, 3, PostFlags::UNSIGNALED).unwrap();
    assert_eq!(k, k1, "an invalidate keeps the key");
    let k2 =
        p.b.bind_mw(&mut mw, &p.mr_b, 64, 64, RW, 4, PostFlags::SIGNALED)
            .unwrap();
    assert_ne!(k2, k1);
    assert_eq!(
        p.wait(true, 1)[0],
        (4, WcStatus::Success, WcOpcode::BindMw, 0, None)
    );
    let base = p.mr_b.addr();
    assert_eq!(write(&mut p, b"k2", base + 64, k2, 5), WcStatus::Success);
    assert_eq!(write(&mut p, b"k1", base, k1, 6), WcStatus::RemAccessErr);
}

#[test]
fn type2_unbind_is_a_local_invalidate_and_is_checked() {
    let mut p = pair();
    let mut mw = p.b.pd().alloc_mw(MwType::Two).unwrap();
    // Not bound: refused (a ConnectX fails the invalidate's CHECK_QPN, the QP would die).
    let e = p.b.unbind_mw(&mut mw, 1, PostFlags::SIGNALED);
    assert!(matches!(e, Err(Error::WindowState { .. })), "{e:?}");
    let e =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 0, RW, 1, PostFlags::SIGNALED);
    assert!(
        matches!(e, Err(Error::WindowState { .. })),
        "zero length: {e:?}"
    );
    let k1 =
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 64, RW, 2, PostFlags::SIGNALED)
            .unwrap();
    // Bound through B: A cannot unbind it.
    let e = p.a.unbind_mw(&mut mw, 3, PostFlags::SIGNALED);
    assert!(matches!(e, Err(Error::WindowState { .. })), "{e:?}");
    assert_eq!(
        p.b.bind_mw(&mut mw, &p.mr_b, 0, 0, RW, 4, PostFlags::SIGNALED)
            .unwrap(),
        k1
    );
    let got: Vec<_> = p.wait(true, 2).iter().map(|c| (c.0, c.1, c.2)).collect();
    assert_eq!(
        got,
        vec![
            (2, WcStatus::Success, WcOpcode::BindMw),
            (4, WcStatus::Success, WcOpcode::LocalInv)
        ]
    );
    assert!(!mw.is_bound());
    let base = p.mr_b.addr();
    assert_eq!(write(&mut p, b"no", base, k1, 5), WcStatus::RemAccessErr);
}

#[test]
fn the_nic_checks_the_qp_of_a_zero_length_type2_bind() {
    // A raw zero-length type-2 bind (rdma-core's form of an unbind: CHECK_QPN) of a window
    // bound through another QP fails on a ConnectX; the software NIC does the same. A QP's
    // own queue refuses raw binds (`Qp::bind_mw` / `Qp::unbind_mw` are the way): the WQEs
    // are posted through send queues over the NIC's raw rings.
    use blueflame::raw::SendQueue;
    use mlx5::sim::{Nic, QpCaps as RawCaps, QpState};
    let nic = Nic::new();
    let pd = nic.alloc_pd();
    let (cq_a, cq_b) = (
        nic.create_cq(16, 64).unwrap(),
        nic.create_cq(16, 64).unwrap(),
    );
    let qa = nic
        .create_qp(pd, cq_a.cqn, cq_a.cqn, RawCaps::default())
        .unwrap();
    let qb = nic
        .create_qp(pd, cq_b.cqn, cq_b.cqn, RawCaps::default())
        .unwrap();
    nic.init_qp(qa.qpn).unwrap();
    nic.init_qp(qb.qpn).unwrap();
    nic.connect(qa.qpn, nic.path_to(qb.qpn)).unwrap();
    nic.connect(qb.qpn, nic.path_to(qa.qpn)).unwrap();
    let mr = nic.alloc_mr(pd, 4096, REGION).unwrap();
    let rkey = nic.alloc_mw(pd, MwType::Two).unwrap();
    // SAFETY: the rings belong to the NIC's QPs, which live as long as `nic` (dropped after
    // the queues) and which nothing else posts to.
    let (mut sa, mut sb) = unsafe { (SendQueue::new(&qa).unwrap(), SendQueue::new(&qb).unwrap()) };
    let next = |k: u32| (k & !0xff) | (k.wrapping_add(1) & 0xff);
    let k1 = next(rkey);
    let bind = BindMw {
        mw_rkey: rkey,
        new_rkey: k1,
        mw_type: MwType::Two,
        mr_lkey: mr.lkey,
        addr: mr.addr,
        len: 64,
        access: RW,
    };
    sb.post(&Request::BindMw(bind), 1, PostFlags::SIGNALED)
        .unwrap();
    nic.drain();
    assert_eq!(nic.mw_state(rkey), Some((k1, true)), "bound through B");
    let raw = BindMw {
        mw_rkey: k1,
        new_rkey: next(k1) | 1,
        mw_type: MwType::Two,
        mr_lkey: 0,
        addr: 0,
        len: 0,
        access: Access::NONE,
    };
    sa.post(&Request::BindMw(raw), 2, PostFlags::SIGNALED)
        .unwrap();
    nic.drain();
    // A's error completion (its first entry): a memory-window bind error; A is in error.
    // SAFETY: the CQ's first 64-byte entry, in the NIC's live ring, written and idle.
    let cqe = unsafe { std::slice::from_raw_parts(cq_a.buf, 64) };
    let cqe = <mlx5::cqe::Cqe64 as zerocopy::FromBytes>::read_from_bytes(cqe).unwrap();
    assert_eq!(cqe.as_err().syndrome(), mlx5::Syndrome::MwBind);
    assert_eq!(nic.qp_state(qa.qpn), Some(QpState::Error));
    // The window is still bound through B, with its key: B's invalidate of it succeeds.
    assert_eq!(nic.mw_state(rkey), Some((k1, true)));
    sb.post(
        &Request::LocalInvalidate { rkey: k1 },
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    nic.drain();
    assert_eq!(nic.mw_state(rkey), Some((k1, false)), "unbound by B");
    assert_eq!(nic.qp_state(qb.qpn), Some(QpState::Rts));
}
