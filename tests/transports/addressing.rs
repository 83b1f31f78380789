//! Datagrams addressed and delivered as a ConnectX does: a UD receive never inside the CQE
//! (the kernel sets the responder's scatter-to-CQE for RC and UC only), and a DCI request
//! routed by its address vector, not by the DCT number alone.
#![cfg(feature = "sim")]

use crate::dc::wait;
use blueflame::*;

/// The guide: "without one [a GRH] they [the 40 bytes] are left as they were". With a
/// receive CQ of 128-byte CQEs the software NIC puts a datagram of up to 24 bytes inside the
/// CQE (a ConnectX never does for UD: the kernel sets `cs_res` for RC/UC only), with 40 zero
/// bytes in front, and the poller copies them over the receive's GRH area.
#[test]
fn no_grh_area_stays_as_it_was_with_128_byte_cqes() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mut cq_a = dev.create_cq(16).unwrap();
    let mut cq_b = dev
        .create_cq_with(&CqOptions::new(16).cqe_size(128))
        .unwrap();
    let mut a = pd.create_ud_qp(&cq_a, &cq_a, QpCaps::default(), 5).unwrap();
    let mut b = pd.create_ud_qp(&cq_b, &cq_b, QpCaps::default(), 5).unwrap();
    let eb = b.endpoint();
    let ah_local = pd.create_ah(AhAttr::from(&eb).local()).unwrap();
    mr.write(0, &[0xaa; 128]).unwrap();
    b.post_recv(&[mr.sge(0, 128).unwrap()], 2).unwrap();
    a.send_to(
        &ah_local,
        eb.qpn,
        5,
        Payload::Inline(b"xyz"),
        10,
        PostFlags::SIGNALED,
    )
    .unwrap();
    assert_eq!(wait(&dev, &mut cq_a, 1).len(), 1);
    let got = wait(&dev, &mut cq_b, 1);
    assert_eq!((got[0].cookie, got[0].grh, got[0].byte_len), (2, false, 43));
    let mut buf = [0u8; 43];
    mr.read(0, &mut buf).unwrap();
    assert_eq!(&buf[40..], b"xyz");
    assert!(
        buf[..40].iter().all(|&x| x == 0xaa),
        "GRH area overwritten: {:02x?}",
        &buf[..40]
    );
}

/// A UD datagram to a LID that is not the port's is lost (the software NIC checks the
/// address vector); a DCI request through an address vector to the same LID reaches the DCT
/// anyway: the DC path routes by DCT number and never looks at the AV. On a ConnectX the
/// request goes to LID 9 and no DCT answers it there (or another one does).
#[test]
fn a_dci_request_to_another_lid_is_not_answered_here() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let all = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
    let mr = pd.alloc_mr(4096, all).unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &srq, 7, Access::REMOTE_WRITE).unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let timing = Timing {
        timeout: 8,
        retry_cnt: 1,
        ..Timing::default()
    };
    let mut dci = pd.create_dci_with(&cq, QpCaps::default(), &timing).unwrap();
    // An address handle to a LID not this NIC's (each software NIC has its own): another
    // port, which runs none of this NIC's DCTs.
    let own = dev.nic().unwrap().port_attr().lid;
    let elsewhere = pd
        .create_ah(AhAttr {
            dlid: if own == 9 { 10 } else { 9 },
            ..AhAttr::default()
        })
        .unwrap();
    let peer = DcPeer::from_ah(&elsewhere, dct.dctn(), 7).unwrap();
    dci.to(&peer)
        .write_inline(b"far", mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(&dev, &mut cq, 1);
    let mut b = [0u8; 3];
    mr.read(0, &mut b).unwrap();
    assert_eq!(
        (got[0].status, b),
        (WcStatus::RetryExcErr, [0; 3]),
        "a request addressed to another LID was answered by this port's DCT"
    );
}

/// An address that names no port: no LID on the (InfiniBand) port, or a global route with
/// an empty GID. A ConnectX takes such an address handle (rdma-core's `mlx5_create_ah`
/// copies `dlid` 0 into the AV's `rlid`; the kernel's `rdma_check_ah_attr` checks the port
/// and the GRH flag only) and every datagram sent to it goes to LID 0, InfiniBand's reserved
/// LID: lost, while its send completes with success. Refused now when the address handle is
/// made, typed, so nothing can be posted to it: the sender's queue keeps its room and no
/// completion comes. Multicast LIDs (0xc000..=0xfffe, with the group's GID) and the
/// permissive LID stay destinations; `ud::multicast_reaches_every_attached_qp_until_it_detaches`
/// sends to a group.
#[test]
fn an_address_without_a_lid_or_a_gid_is_refused_before_anything_is_posted() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let a = pd.create_ud_qp(&cq, &cq, QpCaps::default(), 5).unwrap();
    let b = pd.create_ud_qp(&cq, &cq, QpCaps::default(), 5).unwrap();
    let eb = b.endpoint();
    let free = a.free_send();
    let bare = UdEndpoint {
        qpn: eb.qpn,
        qkey: eb.qkey,
        ..UdEndpoint::default()
    };
    let empty_gid = AhAttr {
        grh: Some(GlobalRoute {
            hop_limit: DEFAULT_HOP_LIMIT,
            ..GlobalRoute::default()
        }),
        ..AhAttr::from(&eb)
    };
    for (name, to) in [
        ("a bare QP number", AhAttr::from(&bare)),
        (
            "a GID without a LID",
            AhAttr::from(&UdEndpoint { lid: 0, ..eb }),
        ),
        ("a global route with an empty GID", empty_gid),
    ] {
        match pd.create_ah(to) {
            Err(Error::InvalidParameter { what, .. }) if what.contains("address") => {}
            Ok(_) => panic!(
                "{name}: an address handle was made of it (a send to it goes to LID 0: lost, \
                 completed with success)"
            ),
            Err(other) => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(a.free_send(), free, "nothing was posted");
    dev.process();
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll(&mut out), 0, "no completion");
    // Multicast LIDs and the permissive LID are destinations; so is the peer's endpoint.
    for dlid in [0xc000, 0xfffe, 0xffff] {
        let to = AhAttr {
            dlid,
            ..AhAttr::default()
        };
        pd.create_ah(to)
            .unwrap_or_else(|e| panic!("LID {dlid:#x}: {e:?}"));
    }
    let mgid = [
        0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x42,
    ];
    pd.create_ah(AhAttr::multicast(mgid, 0xc042)).unwrap();
    pd.create_ah(eb).unwrap();
    pd.create_ah(AhAttr::from(&eb).local()).unwrap();
}

/// The 48-byte address vector of a DC peer with the destination LID `rlid`, the GRH bit
/// when `grh`, the next hop's MAC `rmac` (RoCE) and the destination GID `rgid`.
fn dc_av(rlid: u16, grh: bool, rmac: [u8; 6], rgid: [u8; 16]) -> [u8; 48] {
    let mut av = [0u8; 48];
    av[14..16].copy_from_slice(&rlid.to_be_bytes());
    av[20..26].copy_from_slice(&rmac);
    av[27] = 64; // hop limit
    if grh {
        av[28..32].copy_from_slice(&(1u32 << 30).to_be_bytes());
    }
    av[32..].copy_from_slice(&rgid);
    av
}

/// A DC peer whose address vector names no port (no LID on InfiniBand, a GRH or a RoCE
/// next hop with an empty GID): every DCI request to it would go to LID 0 and end in
/// RetryExcErr after the DCI's retries. Refused by `DcPeer::new`, typed, with the DCT
/// number, before any request names it; a peer with the port's LID reaches the DCT.
#[test]
fn a_dc_peer_without_an_address_is_refused() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd
        .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let tcq = dev.create_cq(16).unwrap();
    let srq = pd.create_srq(&tcq, SrqCaps::default()).unwrap();
    let dct = pd.create_dct(&tcq, &srq, 7, Access::REMOTE_WRITE).unwrap();
    let lid = dev.nic().unwrap().port_attr().lid;
    let gid = dev.nic().unwrap().port_attr().gid;
    let dctn = dct.dctn();
    for (name, av) in [
        ("all zero", [0u8; 48]),
        ("a GID without a LID", dc_av(0, true, [0; 6], gid)),
        ("a GRH with an empty GID", dc_av(lid, true, [0; 6], [0; 16])),
        (
            "a RoCE next hop with an empty GID",
            dc_av(0xc0de, false, [2, 0, 0, 0, 0, 1], [0; 16]),
        ),
    ] {
        match DcPeer::new(av, dctn, 7) {
            Err(Error::InvalidParameter { what, value }) if what.contains("address") => {
                assert_eq!(value, dctn as u64, "{name}: the error names the DCT")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let mut cq = dev.create_cq(16).unwrap();
    let mut dci = pd.create_dci(&cq, QpCaps::default()).unwrap();
    for (cookie, av) in [
        (1, dc_av(lid, false, [0; 6], [0; 16])),
        (2, dc_av(lid, true, [0; 6], gid)),
    ] {
        let peer = DcPeer::new(av, dctn, 7).unwrap();
        dci.to(&peer)
            .write_inline(b"here", mr.remote(0).unwrap(), cookie, PostFlags::SIGNALED)
            .unwrap();
        let got = wait(&dev, &mut cq, 1);
        assert_eq!((got[0].cookie, got[0].status), (cookie, WcStatus::Success));
    }
}
