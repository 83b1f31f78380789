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
