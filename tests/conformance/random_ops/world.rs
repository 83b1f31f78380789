//! The model of the random-operation test (`super`): the world of devices, CQs, QPs,
//! regions and windows, one random step, and the final drain with its checks. Shared with
//! the fuzz target `api` (`fuzz/fuzz_targets/api.rs`), which drives the same steps from the
//! fuzzer's bytes instead of a seed.

use blueflame::*;
use std::collections::HashMap;

/// The source of every choice: a seeded xorshift64* (small, no dependency), or a tape of
/// bytes a fuzzer writes (`fuzz/`, target `api`: four bytes a choice, zeros past the end).
pub(crate) struct Rng {
    state: u64,
    tape: Option<(Vec<u8>, usize)>,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng {
            state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            tape: None,
        }
    }
    /// Choices read from `bytes`.
    #[allow(dead_code)] // the fuzz target's
    pub(crate) fn from_bytes(bytes: &[u8]) -> Rng {
        Rng {
            state: 1,
            tape: Some((bytes.to_vec(), 0)),
        }
    }
    /// Whether a tape is read to its end.
    #[allow(dead_code)] // the fuzz target's
    pub(crate) fn exhausted(&self) -> bool {
        self.tape.as_ref().is_some_and(|(t, at)| *at >= t.len())
    }
    fn next(&mut self) -> u64 {
        if let Some((t, at)) = &mut self.tape {
            let mut b = [0u8; 4];
            for (k, x) in b.iter_mut().enumerate() {
                *x = t.get(*at + k).copied().unwrap_or(0);
            }
            *at += 4;
            let v = u64::from(u32::from_le_bytes(b));
            return v | v.rotate_left(29) << 32;
        }
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// What a completion of one cookie may be.
#[derive(Clone, Copy, Debug)]
struct Expect {
    qpn: u32,
    /// The CQ (by its id in this test) it must arrive on.
    cq: usize,
    signaled: bool,
    recv: bool,
    /// The QP or CQ is gone: it may never arrive.
    exempt: bool,
    done: bool,
}

struct CqSlot {
    id: usize,
    cq: Cq,
}

struct QpSlot {
    qp: Qp,
    send_cq: usize,
    recv_cq: usize,
    pd: usize,
    full_send: u32,
    full_recv: u32,
    /// Connected (by its own `connect`) or moved to error: `connect` again is a
    /// reconnect.
    used: bool,
    /// Cookies posted on it (send and receive).
    cookies: Vec<u64>,
}

struct SrqSlot {
    srq: Srq,
    pd: usize,
    /// The id of its CQ.
    cq: usize,
    /// Every QP number that ever took receives from it.
    qpns: Vec<u32>,
}

/// The QP of an SRQ receive's completion: any QP the SRQ serves.
const ANY_QPN: u32 = u32::MAX;

pub(crate) struct World {
    dev: Device,
    other: Device,
    pds: Vec<Pd>,
    cqs: Vec<Option<CqSlot>>,
    foreign_cq: Cq,
    qps: Vec<Option<QpSlot>>,
    mrs: Vec<Option<(usize, MemoryRegion)>>,
    mws: Vec<Option<(usize, MemoryWindow)>>,
    srqs: Vec<Option<SrqSlot>>,
    /// Which SRQ (slot) each SRQ receive's cookie was posted to.
    srq_cookies: HashMap<u64, usize>,
    /// The QP slots each window's accepted binds and unbinds went through: a window whose
    /// QP or send CQ is gone before its requests were polled cannot know its key.
    mw_qps: Vec<Vec<usize>>,
    expect: HashMap<u64, Expect>,
    refused: std::collections::HashSet<u64>,
    next_cookie: u64,
    next_cq_id: usize,
    qps_created: usize,
    pub(crate) log: Vec<String>,
    verbose: bool,
}

const REGION_RIGHTS: [Access; 4] = [
    Access(
        Access::LOCAL_WRITE.0
            | Access::REMOTE_WRITE.0
            | Access::REMOTE_READ.0
            | Access::REMOTE_ATOMIC.0
            | Access::MW_BIND.0,
    ),
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0 | Access::MW_BIND.0),
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0),
    Access::LOCAL_WRITE,
];

fn caps(r: &mut Rng) -> QpCaps {
    QpCaps {
        sq_blocks: r.pick(&[16, 32, 64]),
        rq_entries: r.pick(&[0, 4, 16]),
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline: r.pick(&[0, 28, 64]),
        bf_size: r.pick(&[0, 256]),
        rnr_retry: r.pick(&[0, 1, 7]),
        scatter_to_cqe: r.chance(70),
    }
}

impl World {
    pub(crate) fn new(verbose: bool) -> World {
        let dev = Device::sim_stepped();
        let other = Device::sim_stepped();
        let foreign_cq = other.create_cq(64).expect("foreign cq");
        World {
            pds: vec![dev.alloc_pd().unwrap(), dev.alloc_pd().unwrap()],
            dev,
            other,
            cqs: Vec::new(),
            foreign_cq,
            qps: Vec::new(),
            mrs: Vec::new(),
            mws: Vec::new(),
            srqs: Vec::new(),
            srq_cookies: HashMap::new(),
            mw_qps: Vec::new(),
            expect: HashMap::new(),
            refused: Default::default(),
            next_cookie: 1,
            next_cq_id: 0,
            qps_created: 0,
            log: Vec::new(),
            verbose,
        }
    }

    fn note(&mut self, s: String) {
        if self.verbose {
            println!("{s}");
        }
        self.log.push(s);
        if self.log.len() > 60 {
            self.log.remove(0);
        }
    }

    fn live<T>(v: &[Option<T>]) -> Vec<usize> {
        (0..v.len()).filter(|&i| v[i].is_some()).collect()
    }

    fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie
    }

    /// Records the outcome of a post of `cookie` on QP slot `q`.
    fn posted(&mut self, q: usize, cookie: u64, signaled: bool, recv: bool, r: &Result<()>) {
        let s = self.qps[q].as_mut().expect("qp");
        match r {
            Ok(()) => {
                let cq = if recv { s.recv_cq } else { s.send_cq };
                let exempt = !self.cqs.iter().flatten().any(|c| c.id == cq);
                s.cookies.push(cookie);
                self.expect.insert(
                    cookie,
                    Expect {
                        qpn: s.qp.qpn(),
                        cq,
                        signaled,
                        recv,
                        exempt,
                        done: false,
                    },
                );
            }
            Err(_) => {
                self.refused.insert(cookie);
            }
        }
    }

    /// A random remote buffer: a region's or a window's key, sometimes wrong or past the end.
    fn remote(&mut self, r: &mut Rng, len: u64) -> Remote {
        let mrs = Self::live(&self.mrs);
        if mrs.is_empty() || r.chance(5) {
            return Remote {
                addr: 0x1000,
                rkey: r.next() as u32,
            };
        }
        let (_, mr) = self.mrs[r.pick(&mrs)].as_ref().expect("mr");
        let mut rkey = mr.rkey();
        let mws = Self::live(&self.mws);
        if !mws.is_empty() && r.chance(30) {
            rkey = self.mws[r.pick(&mws)].as_ref().expect("mw").1.rkey();
        }
        if r.chance(5) {
            rkey ^= 0x100;
        }
        let room = (mr.len() as u64).saturating_sub(len);
        let off = if r.chance(5) {
            mr.len() as u64 - len.min(mr.len() as u64) / 2 // runs past the end
        } else if room == 0 {
            0
        } else {
            r.next() % room
        };
        Remote {
            addr: mr.addr() + off,
            rkey,
        }
    }

    /// A random gather/scatter list (sometimes invalid: past the end, foreign key).
    fn sgl(&mut self, r: &mut Rng, pd: usize) -> Vec<Sge> {
        let n = r.pick(&[0usize, 1, 1, 2, 3, 5]);
        let mrs: Vec<usize> = Self::live(&self.mrs)
            .into_iter()
            .filter(|&i| r.chance(90) || self.mrs[i].as_ref().unwrap().0 == pd)
            .collect();
        let mut out = Vec::new();
        for _ in 0..n {
            if mrs.is_empty() {
                break;
            }
            let (_, mr) = self.mrs[r.pick(&mrs)].as_ref().expect("mr");
            let len = r.pick(&[0u32, 1, 8, 64, 300]);
            let off = r.below(mr.len() + 8);
            match mr.sge(off, len) {
                Ok(s) => out.push(s),
                Err(_) => {
                    let mut s = mr.sge(0, 8).expect("sge");
                    s.lkey ^= 0x200;
                    out.push(s);
                }
            }
        }
        out
    }

    pub(crate) fn step(&mut self, r: &mut Rng) {
        let qps = Self::live(&self.qps);
        let cqs = Self::live(&self.cqs);
        match r.below(108) {
            100 | 101 if !cqs.is_empty() && self.srqs.len() < 4 => {
                let pd = r.below(self.pds.len());
                let cq = r.pick(&cqs);
                let caps = SrqCaps {
                    entries: r.pick(&[1u32, 8, 32]),
                    max_sge: r.pick(&[1u32, 4]),
                };
                let slot = self.cqs[cq].as_ref().unwrap();
                let res = self.pds[pd].create_srq(&slot.cq, caps);
                let id = slot.id;
                self.note(format!(
                    "create_srq pd {pd} cq {id} {caps:?}: {:?}",
                    res.as_ref().map(|s| s.srqn())
                ));
                let srq = res.expect("create_srq");
                self.srqs.push(Some(SrqSlot {
                    srq,
                    pd,
                    cq: id,
                    qpns: Vec::new(),
                }));
            }
            102 if r.chance(40) => {
                let srqs = Self::live(&self.srqs);
                if !srqs.is_empty() {
                    // Its QPs keep it alive; its receives may complete or not from now on
                    // (they are exempt from the start: an SRQ's receives are not flushed
                    // when its QPs go to error).
                    let i = r.pick(&srqs);
                    self.note(format!("drop srq {i}"));
                    self.srqs[i] = None;
                }
            }
            103 | 104 if !cqs.is_empty() && self.qps_created < 16 => {
                let srqs = Self::live(&self.srqs);
                if srqs.is_empty() {
                    return;
                }
                self.qps_created += 1;
                let i = r.pick(&srqs);
                let s = r.pick(&cqs);
                let own_pd = self.srqs[i].as_ref().unwrap().pd;
                let pd = if r.chance(85) {
                    own_pd
                } else {
                    r.below(self.pds.len())
                };
                let c = caps(r);
                let res = self.pds[pd].create_qp_with_srq(
                    &self.cqs[s].as_ref().unwrap().cq,
                    &self.srqs[i].as_ref().unwrap().srq,
                    c,
                );
                let sid = self.cqs[s].as_ref().unwrap().id;
                match res {
                    Ok(qp) => {
                        assert_eq!(pd, own_pd, "a QP on an SRQ of another PD was accepted");
                        self.note(format!("create_qp_with_srq {:#x} srq {i} {c:?}", qp.qpn()));
                        let srq = self.srqs[i].as_mut().unwrap();
                        srq.qpns.push(qp.qpn());
                        let rid = srq.cq;
                        self.add_qp(qp, sid, rid, pd);
                    }
                    Err(e) => {
                        self.note(format!("create_qp_with_srq refused: {e}"));
                        assert!(
                            (pd != own_pd && matches!(e, Error::InvalidHandle { .. }))
                                || matches!(e, Error::Sim(_) | Error::InvalidParameter { .. }),
                            "unexpected refusal: {e}"
                        );
                    }
                }
            }
            105..=107 => {
                let srqs = Self::live(&self.srqs);
                if srqs.is_empty() {
                    return;
                }
                let i = r.pick(&srqs);
                let pd = self.srqs[i].as_ref().unwrap().pd;
                let sgl = self.sgl(r, pd);
                let cookie = self.cookie();
                let res = self.srqs[i].as_mut().unwrap().srq.post_recv(&sgl, cookie);
                self.note(format!(
                    "srq {i} post_recv {cookie} {} sge: {res:?}",
                    sgl.len()
                ));
                match res {
                    Ok(()) => {
                        let cq = self.srqs[i].as_ref().unwrap().cq;
                        self.srq_cookies.insert(cookie, i);
                        self.expect.insert(
                            cookie,
                            Expect {
                                qpn: ANY_QPN,
                                cq,
                                signaled: true,
                                recv: true,
                                exempt: true,
                                done: false,
                            },
                        );
                    }
                    Err(_) => {
                        self.refused.insert(cookie);
                    }
                }
            }
            0..=3 => {
                // Room for every CQE of every QP the run may create (at most 16 QPs of up
                // to 64 + 16 entries): an overrun is the user's error, not a lost completion.
                let size = r.pick(&[2048u32, 4096]);
                let cq = self.dev.create_cq(size).expect("create_cq");
                let id = self.next_cq_id;
                self.next_cq_id += 1;
                self.note(format!("create_cq {size} -> id {id}"));
                self.cqs.push(Some(CqSlot { id, cq }));
            }
            4 if r.chance(5) => {
                // Sizes a CQ cannot have (none, more than the device has) and regions a
                // device cannot register: typed errors, never a panic.
                let size = r.pick(&[0u32, u32::MAX]);
                let res = self.dev.create_cq(size);
                self.note(format!(
                    "create_cq {size}: {:?}",
                    res.as_ref().map(|c| c.cqn())
                ));
                if let Ok(cq) = res {
                    assert!(size != u32::MAX, "a CQ of u32::MAX entries: {cq:?}");
                }
                let len = r.pick(&[usize::MAX, usize::MAX / 2 + 1]);
                let access = Access(r.next() as u32 & 0xff);
                let pd = r.below(self.pds.len());
                let res = self.pds[pd].alloc_mr(len, access);
                self.note(format!("alloc_mr {len:#x} {access:?}: {res:?}"));
                assert!(res.is_err(), "a region of {len:#x} bytes");
            }
            4 if !cqs.is_empty() && r.chance(30) => {
                let i = r.pick(&cqs);
                let id = self.cqs[i].as_ref().unwrap().id;
                self.note(format!("drop cq id {id}"));
                self.cqs[i] = None;
                for e in self.expect.values_mut() {
                    if e.cq == id {
                        e.exempt = true;
                    }
                }
            }
            5..=8 if !cqs.is_empty() && self.qps_created < 16 => {
                self.qps_created += 1;
                let (s, rc) = (r.pick(&cqs), r.pick(&cqs));
                let pd = r.below(self.pds.len());
                let c = caps(r);
                let foreign = r.chance(10);
                let res = {
                    let scq = &self.cqs[s].as_ref().unwrap().cq;
                    let rcq = if foreign {
                        &self.foreign_cq
                    } else {
                        &self.cqs[rc].as_ref().unwrap().cq
                    };
                    self.pds[pd].create_qp(scq, rcq, c)
                };
                let (sid, rid) = (
                    self.cqs[s].as_ref().unwrap().id,
                    self.cqs[rc].as_ref().unwrap().id,
                );
                match res {
                    Ok(qp) => {
                        assert!(!foreign, "a QP on another device's CQ was accepted");
                        self.note(format!("create_qp {:#x} cq {sid}/{rid} {c:?}", qp.qpn()));
                        self.add_qp(qp, sid, rid, pd);
                    }
                    Err(e) => {
                        self.note(format!("create_qp refused: {e}"));
                        assert!(
                            foreign || matches!(e, Error::Sim(_) | Error::InvalidParameter { .. }),
                            "unexpected refusal: {e}"
                        );
                    }
                }
            }
            9 if !qps.is_empty() && r.chance(40) => {
                let i = r.pick(&qps);
                let s = self.qps[i].take().unwrap();
                self.note(format!("drop qp {:#x}", s.qp.qpn()));
                for c in &s.cookies {
                    if let Some(e) = self.expect.get_mut(c) {
                        e.exempt = true;
                    }
                }
            }
            10..=13 if !qps.is_empty() => {
                let (a, b) = (r.pick(&qps), r.pick(&qps));
                let again = self.qps[a].as_ref().unwrap().used;
                let ep = self.qps[b].as_ref().unwrap().qp.endpoint().unwrap();
                let res = self.qps[a].as_mut().unwrap().qp.connect(&ep);
                let to = ep.qpn;
                let qpn = self.qps[a].as_ref().unwrap().qp.qpn();
                self.note(format!("connect {qpn:#x} -> {to:#x}: {res:?}"));
                if again {
                    // Connected already, or in error: a QP connects only from INIT.
                    assert!(
                        matches!(res, Err(Error::InvalidState { .. })),
                        "reconnect {qpn:#x} -> {to:#x}: {res:?}"
                    );
                } else {
                    // From INIT a QP connects to any peer, whatever the peer's state (a
                    // ConnectX's RTR writes only the QP's own context); its requests reach
                    // the peer once the peer is connected to it too (expecting its PSN),
                    // else its retries run out.
                    assert!(res.is_ok(), "connect {qpn:#x} -> {to:#x}: {res:?}");
                    self.qps[a].as_mut().unwrap().used = true;
                }
            }
            14 if !qps.is_empty() => {
                let a = r.pick(&qps);
                self.qps[a].as_mut().unwrap().used = true;
                let res = self.qps[a].as_mut().unwrap().qp.set_error();
                let qpn = self.qps[a].as_ref().unwrap().qp.qpn();
                self.note(format!("set_error {qpn:#x}: {res:?}"));
                assert!(res.is_ok());
            }
            15..=18 => {
                let pd = r.below(self.pds.len());
                let len = r.pick(&[64usize, 256, 4096]);
                let access = r.pick(&REGION_RIGHTS);
                let mr = self.pds[pd].alloc_mr(len, access).expect("alloc_mr");
                self.note(format!(
                    "alloc_mr pd {pd} {len} {access:?} -> {:#x}",
                    mr.lkey()
                ));
                self.mrs.push(Some((pd, mr)));
            }
            19 | 20 => {
                let mrs = Self::live(&self.mrs);
                if !mrs.is_empty() {
                    let i = r.pick(&mrs);
                    self.note(format!(
                        "drop mr {:#x}",
                        self.mrs[i].as_ref().unwrap().1.lkey()
                    ));
                    self.mrs[i] = None;
                }
            }
            21 | 22 => {
                let pd = r.below(self.pds.len());
                let t = r.pick(&[MwType::One, MwType::Two]);
                let mw = self.pds[pd].alloc_mw(t).expect("alloc_mw");
                self.note(format!("alloc_mw pd {pd} {t:?} -> {:#x}", mw.rkey()));
                self.mws.push(Some((pd, mw)));
                self.mw_qps.push(Vec::new());
            }
            23 => {
                let mws = Self::live(&self.mws);
                if !mws.is_empty() {
                    let i = r.pick(&mws);
                    self.note(format!(
                        "drop mw {:#x}",
                        self.mws[i].as_ref().unwrap().1.rkey()
                    ));
                    self.mws[i] = None;
                }
            }
            24..=30 if !qps.is_empty() => {
                let q = r.pick(&qps);
                self.window_op(r, q)
            }
            31..=40 if !qps.is_empty() => {
                let q = r.pick(&qps);
                let pd = self.qps[q].as_ref().unwrap().pd;
                let sgl = self.sgl(r, pd);
                let cookie = self.cookie();
                let res = self.qps[q].as_mut().unwrap().qp.post_recv(&sgl, cookie);
                self.note(format!("post_recv {cookie} {} sge: {res:?}", sgl.len()));
                self.posted(q, cookie, true, true, &res);
            }
            41..=79 if !qps.is_empty() => {
                let q = r.pick(&qps);
                self.post(r, q)
            }
            80..=84 if !qps.is_empty() => {
                let q = r.pick(&qps);
                let n = 1 + r.below(4);
                let pd = self.qps[q].as_ref().unwrap().pd;
                let mut reqs = Vec::new();
                for _ in 0..n {
                    let sgl = self.sgl(r, pd);
                    let remote = self.remote(r, 64);
                    let cookie = self.cookie();
                    reqs.push((sgl, remote, cookie, r.chance(60)));
                }
                let ring = r.chance(85);
                let qp = &mut self.qps[q].as_mut().unwrap().qp;
                let mut b = qp.batch();
                let mut results = Vec::new();
                for (sgl, remote, cookie, signaled) in &reqs {
                    let req = Request::Write {
                        remote: *remote,
                        data: Payload::Sgl(sgl),
                    };
                    let f = if *signaled {
                        PostFlags::SIGNALED
                    } else {
                        PostFlags::UNSIGNALED
                    };
                    results.push((*cookie, *signaled, b.push(&req, *cookie, f)));
                }
                let rung = if ring {
                    b.ring()
                } else {
                    drop(b);
                    Ok(())
                };
                self.note(format!("batch of {n}, rung {ring}: {rung:?}"));
                for (cookie, signaled, res) in results {
                    let res = if ring && rung.is_ok() {
                        res
                    } else {
                        Err(Error::Unsupported("not rung"))
                    };
                    self.posted(q, cookie, signaled, false, &res);
                }
            }
            85..=99 => self.poll(r),
            _ => {
                self.dev.process();
            }
        }
        if r.chance(50) {
            self.dev.process();
        }
    }

    /// A QP just created, on the CQs of ids `send_cq` and `recv_cq`, in domain `pd`.
    fn add_qp(&mut self, qp: Qp, send_cq: usize, recv_cq: usize, pd: usize) {
        self.qps.push(Some(QpSlot {
            full_send: qp.free_send(),
            full_recv: qp.free_recv(),
            qp,
            send_cq,
            recv_cq,
            pd,
            used: false,
            cookies: Vec::new(),
        }));
    }

    /// Runs the NIC and polls every live CQ (checking each completion) until nothing
    /// happens three times in a row.
    fn drain(&mut self) {
        let mut idle = 0;
        while idle < 3 {
            let mut any = self.dev.process();
            for i in Self::live(&self.cqs) {
                let mut out = [Completion::default(); 64];
                let (id, got) = {
                    let c = self.cqs[i].as_mut().unwrap();
                    (c.id, c.cq.poll(&mut out))
                };
                any += got;
                for c in &out[..got] {
                    self.check(id, c);
                }
            }
            idle = if any == 0 { idle + 1 } else { 0 };
        }
    }

    fn window_op(&mut self, r: &mut Rng, q: usize) {
        let mws = Self::live(&self.mws);
        let mrs = Self::live(&self.mrs);
        if mws.is_empty() || mrs.is_empty() {
            return;
        }
        let (wi, mi) = (r.pick(&mws), r.pick(&mrs));
        let cookie = self.cookie();
        let signaled = r.chance(70);
        let f = if signaled {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        let kind = r.below(4);
        let res: Result<()> = {
            let qp = &mut self.qps[q].as_mut().unwrap().qp;
            let mw = &mut self.mws[wi].as_mut().unwrap().1;
            let mr = &self.mrs[mi].as_ref().unwrap().1;
            match kind {
                0 | 1 => {
                    let len = r.pick(&[0usize, 8, 64, 256]);
                    let off = r.below(mr.len());
                    let rights = r.pick(&[
                        Access::REMOTE_READ,
                        Access::REMOTE_READ | Access::REMOTE_WRITE,
                        Access::REMOTE_ATOMIC,
                        Access::REMOTE_WRITE | Access::ZERO_BASED,
                    ]);
                    qp.bind_mw(mw, mr, off, len, rights, cookie, f).map(|_| ())
                }
                _ => qp.unbind_mw(mw, cookie, f).map(|_| ()),
            }
        };
        let qpn = self.qps[q].as_ref().unwrap().qp.qpn();
        self.note(format!(
            "window op {kind} on mw {wi} via qp {qpn:#x}, cookie {cookie}: {res:?}"
        ));
        if res.is_ok() {
            self.mw_qps[wi].push(q);
        }
        self.posted(q, cookie, signaled, false, &res);
    }

    fn post(&mut self, r: &mut Rng, q: usize) {
        let pd = self.qps[q].as_ref().unwrap().pd;
        let sgl = self.sgl(r, pd);
        let remote = self.remote(r, 64);
        let cookie = self.cookie();
        let signaled = r.chance(65);
        let mut f = if signaled {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        if r.chance(10) {
            f = f.fence(Fence::SmallAndFence);
        }
        let inline: Vec<u8> = vec![0x5a; r.pick(&[0usize, 8, 28, 29, 64, 65])];
        let local8 = sgl.first().copied().map(|s| Sge { len: 8, ..s });
        let kind = r.below(10);
        let qp = &mut self.qps[q].as_mut().unwrap().qp;
        let res = match kind {
            0 => qp.write(&sgl, remote, cookie, f),
            1 => qp.write_inline(&inline, remote, cookie, f),
            2 => qp.write_imm(Payload::Sgl(&sgl), remote, 7, cookie, f),
            3 => qp.read(&sgl, remote, cookie, f),
            4 => qp.send(Payload::Inline(&inline), cookie, f),
            5 => qp.send(Payload::Sgl(&sgl), cookie, f),
            6 => match local8 {
                Some(l) => qp.compare_swap(remote, 1, 2, l, cookie, f),
                None => Err(Error::Unsupported("no local buffer")),
            },
            7 => match local8 {
                Some(l) => qp.fetch_add(remote, 1, l, cookie, f),
                None => Err(Error::Unsupported("no local buffer")),
            },
            8 => qp.post(
                &Request::SendInv {
                    data: Payload::Inline(&inline),
                    rkey: remote.rkey,
                },
                cookie,
                f,
            ),
            _ => qp.write(&sgl, remote, cookie, f),
        };
        let qpn = qp.qpn();
        self.note(format!(
            "post kind {kind} on {qpn:#x} cookie {cookie} signaled {signaled}: {res:?}"
        ));
        self.posted(q, cookie, signaled, false, &res);
    }

    /// Polls a random live CQ (or all of them) and checks every completion.
    fn poll(&mut self, r: &mut Rng) {
        self.dev.process();
        let all = r.chance(30);
        let cqs = Self::live(&self.cqs);
        for i in cqs {
            if !all && r.chance(50) {
                continue;
            }
            let n = r.pick(&[1usize, 4, 16]);
            let mut out = vec![Completion::default(); n];
            let (id, got) = {
                let c = self.cqs[i].as_mut().unwrap();
                (c.id, c.cq.poll(&mut out))
            };
            for c in &out[..got] {
                self.check(id, c);
            }
        }
    }

    fn check(&mut self, cq: usize, c: &Completion) {
        let ctx = || format!("completion {c:?} on cq {cq}");
        assert!(
            !self.refused.contains(&c.cookie),
            "{}: a refused request completed",
            ctx()
        );
        let e = self
            .expect
            .get_mut(&c.cookie)
            .unwrap_or_else(|| panic!("{}: unknown cookie", ctx()));
        assert!(!e.done, "{}: completed twice", ctx());
        e.done = true;
        let e = *e;
        self.note(format!(
            "  completion {} {:?} qpn {:#x}",
            c.cookie, c.status, c.qpn
        ));
        assert_eq!(e.cq, cq, "{}: on the wrong CQ ({e:?})", ctx());
        if e.qpn == ANY_QPN {
            // An SRQ's receive: from a QP the SRQ served (the slot is kept while its QPs
            // live, as they keep the SRQ).
            let served = self
                .srq_cookies
                .get(&c.cookie)
                .and_then(|&i| self.srqs[i].as_ref().map(|s| s.qpns.contains(&c.qpn)));
            assert!(
                served != Some(false),
                "{}: an SRQ receive completed on a QP it does not serve",
                ctx()
            );
        } else {
            assert_eq!(e.qpn, c.qpn, "{}: from the wrong QP ({e:?})", ctx());
        }
        assert!(
            e.signaled || c.status != WcStatus::Success,
            "{}: an unsignaled request reported success",
            ctx()
        );
        let _ = e.recv;
    }

    /// Every QP to error, everything drained, then the exactly-once and free-count checks.
    pub(crate) fn finish(&mut self) {
        for q in Self::live(&self.qps) {
            self.qps[q]
                .as_mut()
                .unwrap()
                .qp
                .set_error()
                .expect("set_error");
        }
        // What completed before the error is polled first: a queue the run left full has
        // room again for the request below only once its completions are taken (the
        // fuzzer's finding: without this drain the request was refused as QueueFull, and
        // the unsignaled WQE at the ring's end stayed unretired).
        self.drain();
        for q in Self::live(&self.qps) {
            // A signaled request last: its (flush) completion retires the unsignaled ones
            // before it, which complete without a completion of their own when they
            // succeeded (completion moderation: no device reports them).
            let cookie = self.cookie();
            let res =
                self.qps[q]
                    .as_mut()
                    .unwrap()
                    .qp
                    .post(&Request::Nop, cookie, PostFlags::SIGNALED);
            self.posted(q, cookie, true, false, &res);
        }
        self.drain();
        for (cookie, e) in &self.expect {
            if e.signaled && !e.exempt {
                assert!(e.done, "cookie {cookie} never completed: {e:?}");
            }
        }
        let live_cqs: Vec<usize> = self.cqs.iter().flatten().map(|c| c.id).collect();
        for s in self.qps.iter().flatten() {
            if live_cqs.contains(&s.send_cq) {
                assert_eq!(
                    s.qp.free_send(),
                    s.full_send,
                    "QP {:#x}: send queue not back to full",
                    s.qp.qpn()
                );
            }
            if live_cqs.contains(&s.recv_cq) {
                assert_eq!(
                    s.qp.free_recv(),
                    s.full_recv,
                    "QP {:#x}: receive queue not back to full",
                    s.qp.qpn()
                );
            }
        }
        let nic = self.dev.nic().expect("software NIC");
        for c in self.cqs.iter().flatten() {
            assert!(!nic.cq_overrun(c.cq.cqn()), "CQ id {} overran", c.id);
        }
        for (i, mw) in self.mws.iter().enumerate() {
            let Some((_, mw)) = mw else { continue };
            let knowable = self.mw_qps[i].iter().all(|&q| {
                self.qps[q]
                    .as_ref()
                    .is_some_and(|s| live_cqs.contains(&s.send_cq))
            });
            if !knowable {
                continue;
            }
            let on_nic = nic.mw_state(mw.rkey()).map(|s| s.0);
            assert_eq!(
                on_nic,
                Some(mw.rkey()),
                "window {mw:?}: the crate's key is not the NIC's"
            );
        }
        let _ = &self.other;
    }
}
