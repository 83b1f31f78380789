//! DC through rdma-core's provider (`mlx5dv_create_qp` with the DC attributes: the kernel
//! model makes the target at RTR and returns its number, the initiator's ring is the
//! provider's), against the software NIC's own creation path: one DCI writing, reading,
//! running atomics on and sending to two DCTs in turn.

use crate::scenarios::wait_on;
use blueflame::*;

/// Local write and every remote right (`scenarios::RIGHTS`); a target takes the remote ones.
const ALL: Access = crate::scenarios::RIGHTS;

/// What a run shows: the initiator's completions, the targets' receives, the bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct DcObserved {
    sent: Vec<(u64, WcStatus, WcOpcode, u32)>,
    received: Vec<(u64, WcStatus, WcOpcode, u32, Option<u32>)>,
    bytes: Vec<Vec<u8>>,
}

/// The traffic on `dev`.
pub fn traffic(dev: &Device) -> DcObserved {
    let pd_t = dev.alloc_pd().expect("target pd");
    let mut tcq = dev.create_cq(64).expect("target cq");
    let mut srq = pd_t.create_srq(&tcq, SrqCaps::default()).expect("srq");
    let targets: Vec<(Dct, MemoryRegion)> = (0..2u64)
        .map(|i| {
            let dct = pd_t
                .create_dct(
                    &tcq,
                    &srq,
                    0x1000 + i,
                    Access(ALL.0 & !Access::LOCAL_WRITE.0),
                )
                .expect("dct");
            let mr = pd_t.alloc_mr(4096, ALL).expect("target mr");
            mr.write(512, &(100 * i).to_ne_bytes()).expect("counter");
            (dct, mr)
        })
        .collect();
    let recv_mr = pd_t.alloc_mr(4096, ALL).expect("recv mr");
    for i in 0..4 {
        srq.post_recv(&[recv_mr.sge(256 * i, 256).expect("sge")], 700 + i as u64)
            .expect("srq recv");
    }
    let pd = dev.alloc_pd().expect("pd");
    // The targets' port address, as a user gets it: a UD QP's endpoint, and an address
    // handle to it (a DC destination on a ConnectX is an AV, the DCT number and key).
    let probe_cq = dev.create_cq(8).expect("probe cq");
    let probe_caps = QpCaps {
        sq_blocks: 16,
        rq_entries: 1,
        ..QpCaps::default()
    };
    let probe = pd_t
        .create_ud_qp(&probe_cq, &probe_cq, probe_caps, 1)
        .expect("ud qp");
    let ah = pd.create_ah(probe.endpoint()).expect("ah");
    let mut cq = dev.create_cq(64).expect("cq");
    let mut dci = pd.create_dci(&cq, QpCaps::default()).expect("dci");
    let local = pd.alloc_mr(4096, ALL).expect("local mr");
    local.write(0, b"0123456789abcdef").expect("local");
    let fl = PostFlags::SIGNALED;
    let mut cookie = 0u64;
    for round in 0..2usize {
        for (i, (dct, mr)) in targets.iter().enumerate() {
            let peer = DcPeer::from_ah(&ah, dct.dctn(), 0x1000 + i as u64).expect("peer");
            let off = 64 * round;
            let mut to = dci.to(&peer);
            to.write(
                &[local.sge(0, 16).unwrap()],
                mr.remote(off).unwrap(),
                cookie,
                fl,
            )
            .expect("write");
            cookie += 1;
            let mut to = dci.to(&peer);
            to.write_inline(&[i as u8; 8], mr.remote(off + 16).unwrap(), cookie, fl)
                .expect("write inline");
            cookie += 1;
            let into = local.sge(1024 + 64 * (2 * round + i), 24).unwrap();
            dci.to(&peer)
                .read(&[into], mr.remote(off).unwrap(), cookie, fl)
                .expect("read");
            cookie += 1;
            let reply = local.sge(2048 + 8 * (2 * round + i), 8).unwrap();
            dci.to(&peer)
                .fetch_add(mr.remote(512).unwrap(), 1, reply, cookie, fl)
                .expect("fetch add");
            cookie += 1;
            let imm_payload = [round as u8 * 2 + i as u8; 40];
            dci.to(&peer)
                .send(Payload::Inline(&imm_payload), cookie, fl)
                .expect("send");
            cookie += 1;
        }
    }
    let sent = wait_on(dev, &mut cq, cookie as usize)
        .iter()
        .map(|c| (c.cookie, c.status, c.opcode, c.byte_len))
        .collect();
    let received = wait_on(dev, &mut tcq, 4)
        .iter()
        .map(|c| (c.cookie, c.status, c.opcode, c.byte_len, c.imm))
        .collect();
    let read = |mr: &MemoryRegion, off: usize, len: usize| {
        let mut v = vec![0u8; len];
        mr.read(off, &mut v).expect("read back");
        v
    };
    let mut bytes = vec![read(&local, 0, 4096), read(&recv_mr, 0, 1024)];
    bytes.extend(targets.iter().map(|(_, mr)| read(mr, 0, 1024)));
    DcObserved {
        sent,
        received,
        bytes,
    }
}
