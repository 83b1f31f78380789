//! CQEs libmlx5 parses that the scenarios never make it parse (responder
//! completions and errors on an SRQ, 128-byte CQEs), on the direct path over mlx5_0, on the
//! verbs path (libmlx5's own poll), and on the software NIC's own run: all must agree.

use crate::Case;
use blueflame::*;

type Row = (u64, WcStatus, WcOpcode, u32, Option<u32>, u32, bool);

fn row(c: &Completion) -> Row {
    (
        c.cookie, c.status, c.opcode, c.byte_len, c.imm, c.src_qp, c.grh,
    )
}

struct Fan {
    dev: Device,
    scq: Cq,
    rcq: Cq,
    srq: Srq,
    s: Qp,
    c: Qp,
    mr_s: MemoryRegion,
    mr_c: MemoryRegion,
    _pd: Pd,
}

fn fan(dev: &Device, rcqe: u32) -> Fan {
    let pd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(64).unwrap();
    // The verbs path takes 128-byte entries from MLX5_CQE_SIZE=128 only.
    let size = if dev.to_string().contains("mlx5_0") {
        64
    } else {
        rcqe
    };
    let rcq = dev
        .create_cq_with(&CqOptions::new(64).cqe_size(size))
        .unwrap();
    let srq = pd
        .create_srq(
            &rcq,
            SrqCaps {
                entries: 15,
                max_sge: 2,
            },
        )
        .unwrap();
    let caps = crate::scenarios::caps();
    let mut s = pd.create_qp_with_srq(&scq, &srq, caps).unwrap();
    let mut c = pd.create_qp(&scq, &scq, caps).unwrap();
    let (es, ec) = (s.endpoint().unwrap(), c.endpoint().unwrap());
    s.connect_with(&ec, &Timing::default()).unwrap();
    c.connect_with(&es, &Timing::default()).unwrap();
    let mr_s = pd.alloc_mr(8192, crate::scenarios::RIGHTS).unwrap();
    let mr_c = pd.alloc_mr(8192, crate::scenarios::RIGHTS).unwrap();
    Fan {
        dev: dev.clone(),
        scq,
        rcq,
        srq,
        s,
        c,
        mr_s,
        mr_c,
        _pd: pd,
    }
}

/// Posts `req` (signaled) on the client `c` and waits for its completion and the server's
/// receive completion, their rows appended to `rows` (sends, receives). A `Fan`'s fields
/// apart: `req` borrows its client's region.
fn post_and_wait(
    (c, dev, scq, rcq): (&mut Qp, &Device, &mut Cq, &mut Cq),
    req: &Request<'_>,
    cookie: u64,
    rows: &mut (Vec<Row>, Vec<Row>),
) {
    c.post(req, cookie, PostFlags::SIGNALED).unwrap();
    rows.0
        .extend(crate::scenarios::wait_on(dev, scq, 1).iter().map(row));
    rows.1
        .extend(crate::scenarios::wait_on(dev, rcq, 1).iter().map(row));
}

/// What a user sees: completions (send side, receive side) and the server's bytes.
fn srq_run(dev: &Device, rcqe: u32) -> (Vec<Row>, Vec<Row>, Vec<u8>) {
    let mut f = fan(dev, rcqe);
    let pat: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
    f.mr_c.write(0, &pat).unwrap();
    for i in 0..6u64 {
        let at = i as usize * 512;
        f.srq
            .post_recv(&[f.mr_s.sge(at, 100).unwrap()], 900 + i)
            .unwrap();
    }
    let mut rows = (Vec::new(), Vec::new());
    let sge = |n| f.mr_c.sge(0, n).unwrap();
    // A write with immediate into memory, a receive of the SRQ consumed.
    let write_imm = Request::WriteImm {
        remote: f.mr_s.remote(4000).unwrap(),
        data: Payload::Sgl(&[sge(77)]),
        imm: 0xa1b2_c3d4,
    };
    post_and_wait(
        (&mut f.c, &f.dev, &mut f.scq, &mut f.rcq),
        &write_imm,
        1,
        &mut rows,
    );
    // Sends of 20, 50 and 64 bytes (in the CQE when the QP scatters to it).
    for (k, n) in [20usize, 50, 64].into_iter().enumerate() {
        let send = Request::SendImm {
            data: Payload::Sgl(&[sge(n as u32)]),
            imm: 0x0102_0300 + k as u32,
        };
        post_and_wait(
            (&mut f.c, &f.dev, &mut f.scq, &mut f.rcq),
            &send,
            2 + k as u64,
            &mut rows,
        );
    }
    // A send longer than the receive: a responder error on the SRQ's WQE.
    let long = Request::Send {
        data: Payload::Sgl(&[sge(150)]),
    };
    post_and_wait(
        (&mut f.c, &f.dev, &mut f.scq, &mut f.rcq),
        &long,
        9,
        &mut rows,
    );
    let mut data = vec![0u8; 4096];
    f.mr_s.read(0, &mut data).unwrap();
    let _ = &f.s;
    (rows.0, rows.1, data)
}

fn compare(dev: &Device, rcqe: u32) -> Result<(), String> {
    let verbs = crate::verbs_device()?;
    let sim = srq_run(&Device::sim(), rcqe);
    let mut out = String::new();
    for (label, d) in [("direct mlx5_0", dev), ("verbs mlx5_0", verbs)] {
        let got = srq_run(d, rcqe);
        if got.0 != sim.0 {
            out += &format!("{label} sends {:?}\n   sim sends {:?}\n", got.0, sim.0);
        }
        if got.1 != sim.1 {
            out += &format!("{label} recvs {:?}\n   sim recvs {:?}\n", got.1, sim.1);
        }
        if got.2 != sim.2 {
            out += &format!("{label} data differ\n");
        }
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(out)
    }
}

pub fn all() -> Vec<Case> {
    vec![
        (
            "cqe::srq_cqes_64".into(),
            Box::new(|d: &Device| compare(d, 64)),
        ),
        (
            "cqe::srq_cqes_128".into(),
            Box::new(|d: &Device| compare(d, 128)),
        ),
    ]
}
