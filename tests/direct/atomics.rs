//! Atomics as a real device does them (issue 10, item 2): refused before posting when the
//! device lacks them (rdma-core's `_mlx5_post_send`: EOPNOTSUPP without `atomic_cap`), a
//! local entry of exactly the operand's size, and replies in the device's byte order read
//! back in host order through one call, `Qp::atomic_result`.

use crate::common;

use blueflame::*;
use common::*;

fn setup(caps: AtomicCaps) -> Setup {
    // The stepped NIC of a fresh Setup: its caps are set before the QPs read them.
    let dev = Device::sim_stepped();
    nic(&dev).set_atomic_caps(caps);
    let pd = dev.alloc_pd().unwrap();
    let cq_a = dev.create_cq(1024).unwrap();
    let mut a = pd.create_qp(&cq_a, &cq_a, QpCaps::default()).unwrap();
    let q = a.endpoint().unwrap();
    a.connect(&q).unwrap();
    Setup {
        dev,
        pd,
        cq_a,
        cq_b: None,
        a,
        b: None,
    }
}

fn cs32(old: u32, new: u32) -> MaskedAtomic {
    MaskedAtomic::Cs32 {
        swap: new,
        compare: old,
        swap_mask: !0,
        compare_mask: !0,
    }
}

/// No `atomic_cap`: compare-swap and fetch-add are refused with `Error::Unsupported` before
/// anything is written; without masked atomics the masked ones are (and the standard ones
/// still run).
#[test]
fn atomics_the_device_lacks_are_refused_before_posting() {
    let mut s = setup(AtomicCaps::NONE);
    let m = s.mr(64, ALL);
    let free = s.a.free_send();
    let r = s.a.compare_swap(
        m.remote(0).unwrap(),
        0,
        1,
        m.sge(8, 8).unwrap(),
        1,
        PostFlags::SIGNALED,
    );
    assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
    let r = s.a.fetch_add(
        m.remote(0).unwrap(),
        1,
        m.sge(8, 8).unwrap(),
        2,
        PostFlags::SIGNALED,
    );
    assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
    assert_eq!(s.a.free_send(), free);
    s.run_expect(0, 0);
    assert_eq!(nic(&s.dev).qp_stats(s.a.qpn()).unwrap().wqes, 0);

    let mut s = setup(AtomicCaps {
        masked: false,
        ..AtomicCaps::CONNECTX
    });
    let m = s.mr(64, ALL);
    let r = s.a.post(
        &Request::Masked {
            remote: m.remote(0).unwrap(),
            op: cs32(0, 1),
            local: m.sge(8, 4).unwrap(),
        },
        3,
        PostFlags::SIGNALED,
    );
    assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
    s.a.fetch_add(
        m.remote(0).unwrap(),
        7,
        m.sge(8, 8).unwrap(),
        4,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_ok(&c[0], 4, WcOpcode::FetchAdd, 8, s.a.qpn());
    assert_eq!(m.read_u64(0).unwrap(), 7);
}

/// A driver that posts an atomic the device lacks (the QP was created before the device
/// lost them here) gets a local QP operation error from the software NIC.
#[test]
fn software_nic_fails_atomics_it_lacks() {
    let mut s = setup(AtomicCaps::CONNECTX);
    let m = s.mr(64, ALL);
    nic(&s.dev).set_atomic_caps(AtomicCaps::NONE);
    s.a.fetch_add(
        m.remote(0).unwrap(),
        1,
        m.sge(8, 8).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let (c, _) = s.run_expect(1, 0);
    assert_err(&c[0], 1, WcStatus::LocQpOpErr, 0x02, s.a.qpn());
    assert_eq!(m.read_u64(0).unwrap(), 0);
}

/// A 4-byte entry for an 8-byte atomic used to receive 8 bytes; an 8-byte entry for a
/// 32-bit masked one, 4. Both are refused before posting, naming the length.
#[test]
fn local_entry_must_be_exactly_the_operand_size() {
    let mut s = Setup::loopback(QpCaps::default());
    let m = s.mr(64, ALL);
    fill(&m, 0x5a);
    m.write(0, &1u64.to_ne_bytes()).unwrap();
    let free = s.a.free_send();
    for len in [4u32, 16, 0] {
        let local = Sge {
            len,
            ..m.sge(32, 8).unwrap()
        };
        let r =
            s.a.fetch_add(m.remote(0).unwrap(), 1, local, 1, PostFlags::SIGNALED);
        let e = format!("{r:?}");
        assert_eq!(e, format!("Err(AtomicLength {{ len: {len}, size: 8 }})"));
        let r =
            s.a.compare_swap(m.remote(0).unwrap(), 1, 2, local, 2, PostFlags::SIGNALED);
        assert_eq!(
            format!("{r:?}"),
            format!("Err(AtomicLength {{ len: {len}, size: 8 }})")
        );
    }
    let r = s.a.post(
        &Request::Masked {
            remote: m.remote(8).unwrap(),
            op: cs32(0x5a5a_5a5a, 3),
            local: m.sge(32, 8).unwrap(),
        },
        3,
        PostFlags::SIGNALED,
    );
    assert_eq!(format!("{r:?}"), "Err(AtomicLength { len: 8, size: 4 })");
    // Nothing was posted, nothing moved.
    assert_eq!(s.a.free_send(), free);
    s.run_expect(0, 0);
    assert_eq!(m.read_u64(0).unwrap(), 1);
    assert_eq!(bytes(&m, 32, 16), vec![0x5a; 16]);
}

/// Both reply modes of a ConnectX. The default (what Linux selects: 8-byte endianness mode
/// one) writes 8-byte replies in host order and 4-byte masked ones big-endian; mode zero
/// writes every reply big-endian. The NIC writes the bytes as the hardware would, and
/// `Qp::atomic_result` gives the same host-order value in both.
#[test]
fn replies_in_both_byte_orders_read_back_in_host_order() {
    for caps in [AtomicCaps::CONNECTX, AtomicCaps::CONNECTX_BIG_ENDIAN] {
        let mut s = setup(caps);
        assert_eq!(s.a.atomic_caps(), caps);
        let m = s.mr(128, ALL);
        let q = s.a.qpn();
        let old8 = 0x0102_0304_0506_0708u64;
        m.write(0, &old8.to_ne_bytes()).unwrap();
        s.a.fetch_add(
            m.remote(0).unwrap(),
            1,
            m.sge(64, 8).unwrap(),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let old4 = 0xa1b2_c3d4u32;
        m.write(8, &old4.to_ne_bytes()).unwrap();
        s.a.post(
            &Request::Masked {
                remote: m.remote(8).unwrap(),
                op: cs32(old4, 9),
                local: m.sge(72, 4).unwrap(),
            },
            2,
            PostFlags::SIGNALED,
        )
        .unwrap();
        m.write(16, &old8.to_ne_bytes()).unwrap();
        s.a.post(
            &Request::Masked {
                remote: m.remote(16).unwrap(),
                op: MaskedAtomic::Fa64 {
                    add: 2,
                    field_boundary: 0,
                },
                local: m.sge(80, 8).unwrap(),
            },
            3,
            PostFlags::SIGNALED,
        )
        .unwrap();
        let (c, _) = s.run_expect(3, 0);
        assert_ok(&c[0], 1, WcOpcode::FetchAdd, 8, q);
        assert_ok(&c[1], 2, WcOpcode::MaskedCompSwap, 4, q);
        assert_ok(&c[2], 3, WcOpcode::MaskedFetchAdd, 8, q);
        // The target memory is operated on in host order.
        assert_eq!(m.read_u64(0).unwrap(), old8 + 1);
        assert_eq!(bytes(&m, 8, 4), 9u32.to_ne_bytes());
        assert_eq!(m.read_u64(16).unwrap(), old8 + 2);
        // The reply bytes as the hardware writes them.
        let raw8 = if caps.reply8_be {
            old8.to_be_bytes()
        } else {
            old8.to_ne_bytes()
        };
        assert_eq!(bytes(&m, 64, 8), raw8, "{caps:?}");
        assert_eq!(bytes(&m, 72, 4), old4.to_be_bytes(), "always big-endian");
        assert_eq!(bytes(&m, 80, 8), raw8, "{caps:?}");
        // One call gives the value in host order.
        assert_eq!(s.a.atomic_result(&bytes(&m, 64, 8)).unwrap(), old8);
        assert_eq!(s.a.atomic_result(&bytes(&m, 72, 4)).unwrap(), old4 as u64);
        assert_eq!(s.a.atomic_result(&bytes(&m, 80, 8)).unwrap(), old8);
        assert!(matches!(
            s.a.atomic_result(&bytes(&m, 64, 6)),
            Err(Error::InvalidParameter { value: 6, .. })
        ));
    }
    // The software NIC's default is the ConnectX default.
    assert_eq!(Device::sim_stepped().atomic_caps(), AtomicCaps::CONNECTX);
}

/// A DC target asked for remote atomic rights on a device without atomics is refused,
/// typed, as mlx5_ib refuses the DCT's INIT (`mlx5_ib_modify_dct`: `get_atomic_mode`,
/// EOPNOTSUPP); without the right it is made, and with atomics the right is taken. (The
/// software NIC made the DCT whatever its atomics.)
#[test]
fn dct_atomic_rights_need_atomics() {
    for (caps, refused) in [(AtomicCaps::NONE, true), (AtomicCaps::CONNECTX, false)] {
        let dev = Device::sim_stepped();
        nic(&dev).set_atomic_caps(caps);
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let srq = pd.create_srq(&cq, SrqCaps::default()).unwrap();
        let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        match pd.create_dct(&cq, &srq, 7, all) {
            Err(Error::Capability(Capability::RemoteAtomics)) if refused => {}
            Ok(_) if !refused => {}
            other => panic!("{caps:?}: {other:?}"),
        }
        pd.create_dct(&cq, &srq, 7, Access::REMOTE_WRITE | Access::REMOTE_READ)
            .unwrap();
    }
}
