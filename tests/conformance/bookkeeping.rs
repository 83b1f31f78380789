//! A focused random harness for the shared queue bookkeeping: several QPs
//! (and an SRQ) completing on one CQ, signaled / unsignaled / long unsignaled runs,
//! batches rung / dropped / forgotten, WQEs of 1..16 blocks, polls of random sizes, QP
//! drops with work in flight, set_error mid-stream. Checks: every completion of an
//! accepted request at most once, per QP in post order; refusals typed and leaving
//! nothing posted; no CqFull on a CQ sized generously; no overrun; after the drain every
//! signaled request completed and the send queues are back to full. 200 seeds of 600
//! steps by default; `BLUEFLAME_BOOKS_SEEDS=N` for more, `BLUEFLAME_BOOKS_SEED=S` to replay
//! one (a review ran 6,000).

use blueflame::*;
use std::collections::{HashMap, HashSet};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

struct Q {
    qp: Qp,
    caps: QpCaps,
    srq: bool,
    /// Send cookies accepted, in post order; index of the last completed one.
    sends: Vec<u64>,
    last_send: Option<usize>,
    recvs: Vec<u64>,
    last_recv: Option<usize>,
    /// Receives available for loopback sends.
    avail: i64,
    sig_pct: u64,
    errored: bool,
}

#[derive(Clone, Copy, Debug)]
struct Exp {
    q: usize,
    signaled: bool,
    recv: bool,
    done: bool,
    dropped: bool,
    srq: bool,
}

struct W {
    dev: Device,
    pd: Pd,
    mr: MemoryRegion,
    cq: Cq,
    srq: Option<Srq>,
    srq_avail: i64,
    qs: Vec<Option<Q>>,
    exp: HashMap<u64, Exp>,
    refused: HashSet<u64>,
    next: u64,
    generous: bool,
    log: Vec<String>,
}

fn caps(r: &mut Rng) -> QpCaps {
    QpCaps {
        sq_blocks: r.pick(&[16, 32, 64]),
        rq_entries: r.pick(&[0, 4, 16]),
        max_send_sge: r.pick(&[1, 2, 4, 8, 16]),
        max_recv_sge: 2,
        max_inline: r.pick(&[0, 28, 64, 128, 256, 512]),
        bf_size: r.pick(&[0, 256]),
        rnr_retry: 7,
        scatter_to_cqe: r.chance(50),
    }
}

impl W {
    fn note(&mut self, s: String) {
        self.log.push(s);
        if self.log.len() > 80 {
            self.log.remove(0);
        }
    }
    fn cookie(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
    fn live(&self) -> Vec<usize> {
        (0..self.qs.len())
            .filter(|&i| self.qs[i].is_some())
            .collect()
    }
    fn add_qp(&mut self, r: &mut Rng) {
        let c = caps(r);
        let use_srq = self.srq.is_some() && r.chance(40);
        let res = if use_srq {
            self.pd
                .create_qp_with_srq(&self.cq, self.srq.as_ref().unwrap(), c)
        } else {
            self.pd.create_qp(&self.cq, &self.cq, c)
        };
        let mut qp = match res {
            Ok(q) => q,
            Err(e) => {
                self.note(format!("create refused {e}"));
                return;
            }
        };
        let n = qp.endpoint().unwrap();
        qp.connect(&n).unwrap();
        self.note(format!("qp {:#x} {c:?} srq {use_srq}", n.qpn));
        self.qs.push(Some(Q {
            qp,
            caps: c,
            srq: use_srq,
            sends: vec![],
            last_send: None,
            recvs: vec![],
            last_recv: None,
            avail: 0,
            sig_pct: r.pick(&[0, 3, 30, 100]),
            errored: false,
        }));
    }

    fn accept(&mut self, q: usize, cookie: u64, signaled: bool, recv: bool, srq: bool) {
        self.exp.insert(
            cookie,
            Exp {
                q,
                signaled,
                recv,
                done: false,
                dropped: false,
                srq,
            },
        );
        let s = self.qs[q].as_mut().unwrap();
        if recv {
            if !srq {
                s.recvs.push(cookie);
            }
        } else {
            s.sends.push(cookie);
        }
    }

    fn check_refusal(&mut self, q: usize, cookie: u64, e: &Error, free_before: u32) {
        let s = self.qs[q].as_mut().unwrap();
        let free_after = s.qp.free_send();
        assert_eq!(free_before, free_after, "refusal {e} changed free_send");
        match e {
            Error::QueueFull { needed, free, unit } => {
                if *unit == QueueUnit::SendBlocks {
                    assert!(needed > free, "{e}");
                    assert_eq!(*free, free_before, "QueueFull free vs free_send: {e}");
                }
            }
            Error::CqFull { .. } => {
                assert!(!self.generous, "CqFull on a generously sized CQ: {e}");
            }
            Error::TooManySge { .. }
            | Error::InlineTooLong { .. }
            | Error::WqeTooLarge { .. }
            | Error::InvalidParameter { .. }
            | Error::InvalidState { .. } => {}
            other => panic!("unexpected refusal {other:?}"),
        }
        self.refused.insert(cookie);
    }

    /// A receive refused (of a QP or the SRQ): for want of room in its queue or its CQ, the
    /// latter never on a generously sized CQ; its cookie is then never to complete.
    fn check_recv_refusal(&mut self, cookie: u64, e: &Error) {
        assert!(
            matches!(e, Error::QueueFull { .. } | Error::CqFull { .. }),
            "{e}"
        );
        if matches!(e, Error::CqFull { .. }) {
            assert!(!self.generous, "{e}");
        }
        self.refused.insert(cookie);
    }

    /// One request for QP q: (request builder inputs)
    fn make_req<'a>(
        r: &mut Rng,
        caps: QpCaps,
        sgl: &'a mut Vec<Sge>,
        inline: &'a mut Vec<u8>,
        mr: &MemoryRegion,
        recv_ok: bool,
    ) -> Request<'a> {
        let remote = mr.remote(65536 + r.below(4096)).unwrap();
        let kind = r.below(7);
        let n = 1 + r.below(caps.max_send_sge as usize + 1);
        sgl.clear();
        for i in 0..n {
            sgl.push(mr.sge(i * 64, 1 + r.below(64) as u32).unwrap());
        }
        inline.clear();
        let il = r.below(caps.max_inline as usize + 20);
        inline.resize(il, 0x33);
        match kind {
            0 => Request::Nop,
            1 | 2 => Request::Write {
                remote,
                data: Payload::Inline(inline),
            },
            3 => Request::Write {
                remote,
                data: Payload::Sgl(sgl),
            },
            4 => Request::Read { remote, sgl },
            5 if recv_ok => Request::Send {
                data: Payload::Inline(inline),
            },
            6 if recv_ok => Request::Send {
                data: Payload::Sgl(sgl),
            },
            _ => Request::Write {
                remote,
                data: Payload::Sgl(&sgl[..1]),
            },
        }
    }

    fn recv_ok(&self, q: usize) -> bool {
        let s = self.qs[q].as_ref().unwrap();
        if s.srq {
            self.srq_avail > 0
        } else {
            s.avail > 0
        }
    }
    fn took_recv(&mut self, q: usize, req: &Request<'_>) {
        if matches!(req, Request::Send { .. }) {
            if self.qs[q].as_ref().unwrap().srq {
                self.srq_avail -= 1;
            } else {
                self.qs[q].as_mut().unwrap().avail -= 1;
            }
        }
    }

    fn post(&mut self, r: &mut Rng, q: usize) {
        let (mut sgl, mut inline) = (Vec::new(), Vec::new());
        let recv_ok = self.recv_ok(q);
        let cookie = self.cookie();
        let s = self.qs[q].as_ref().unwrap();
        let signaled = r.chance(s.sig_pct);
        let req = Self::make_req(r, s.caps, &mut sgl, &mut inline, &self.mr, recv_ok);
        let f = if signaled {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        };
        let s = self.qs[q].as_mut().unwrap();
        let free = s.qp.free_send();
        let res = s.qp.post(&req, cookie, f);
        let qpn = s.qp.qpn();
        self.note(format!(
            "post {qpn:#x} {cookie} sig {signaled} {req:?}: {res:?} free {free}"
        ));
        match res {
            Ok(()) => {
                self.took_recv(q, &req);
                self.accept(q, cookie, signaled, false, false)
            }
            Err(e) => self.check_refusal(q, cookie, &e, free),
        }
    }

    fn batch(&mut self, r: &mut Rng, q: usize) {
        let n = 1 + r.below(12);
        let how = r.below(10); // 0..6 ring, 7..8 drop, 9 forget
        let mut accepted = Vec::new();
        let mut kept_avail = 0i64;
        {
            let recv_ok0 = self.recv_ok(q);
            let mut recv_left = if recv_ok0 { 1 } else { 0 };
            let sig = self.qs[q].as_ref().unwrap().sig_pct;
            let mut reqs = Vec::new();
            for _ in 0..n {
                let cookie = self.cookie();
                reqs.push((cookie, r.chance(sig), r.next()));
            }
            let W { qs, mr, .. } = self;
            let s = qs[q].as_mut().unwrap();
            let caps = s.caps;
            let mut b = s.qp.batch();
            for (cookie, signaled, seed) in reqs {
                let mut rr = Rng(seed | 1);
                let (mut sgl, mut inline) = (Vec::new(), Vec::new());
                let req = Self::make_req(&mut rr, caps, &mut sgl, &mut inline, mr, recv_left > 0);
                let f = if signaled {
                    PostFlags::SIGNALED
                } else {
                    PostFlags::UNSIGNALED
                };
                let res = b.push(&req, cookie, f);
                if res.is_ok() && matches!(req, Request::Send { .. }) {
                    recv_left -= 1;
                    kept_avail += 1;
                }
                accepted.push((cookie, signaled, res));
            }
            match how {
                0..=6 => b.ring().unwrap(),
                7 | 8 => drop(b),
                _ => std::mem::forget(b),
            }
        }
        let posted = how <= 6 || how == 9;
        self.note(format!("batch on q{q} of {n}, how {how}: {accepted:?}"));
        for (cookie, signaled, res) in accepted {
            match res {
                Ok(()) if posted => self.accept(q, cookie, signaled, false, false),
                Ok(()) => {
                    self.refused.insert(cookie);
                }
                Err(e) => {
                    // A refusal inside a batch: typed.
                    match e {
                        Error::QueueFull { .. }
                        | Error::CqFull { .. }
                        | Error::TooManySge { .. }
                        | Error::InlineTooLong { .. }
                        | Error::WqeTooLarge { .. }
                        | Error::InvalidParameter { .. } => {}
                        other => panic!("unexpected batch refusal {other:?}"),
                    }
                    if let Error::CqFull { .. } = e {
                        assert!(!self.generous, "CqFull in a batch on a generous CQ: {e}");
                    }
                    self.refused.insert(cookie);
                }
            }
        }
        if posted && kept_avail > 0 {
            if self.qs[q].as_ref().unwrap().srq {
                self.srq_avail -= kept_avail;
            } else {
                self.qs[q].as_mut().unwrap().avail -= kept_avail;
            }
        }
    }

    fn post_recv(&mut self, r: &mut Rng, q: usize) {
        let cookie = self.cookie();
        let sge = self.mr.sge(8192 + r.below(8) * 1024, 1024).unwrap();
        let s = self.qs[q].as_mut().unwrap();
        if s.srq {
            let res = self.srq.as_mut().unwrap().post_recv(&[sge], cookie);
            self.note(format!("srq recv {cookie}: {res:?}"));
            match res {
                Ok(()) => {
                    self.srq_avail += 1;
                    self.accept(q, cookie, true, true, true)
                }
                Err(e) => self.check_recv_refusal(cookie, &e),
            }
            return;
        }
        if s.caps.rq_entries == 0 {
            return;
        }
        let res = s.qp.post_recv(&[sge], cookie);
        let qpn = s.qp.qpn();
        self.note(format!("recv {qpn:#x} {cookie}: {res:?}"));
        match res {
            Ok(()) => {
                self.qs[q].as_mut().unwrap().avail += 1;
                self.accept(q, cookie, true, true, false)
            }
            Err(e) => self.check_recv_refusal(cookie, &e),
        }
    }

    fn poll(&mut self, n: usize) -> usize {
        let mut out = vec![Completion::default(); n];
        let got = self.cq.poll(&mut out);
        for c in &out[..got] {
            self.check(c);
        }
        got
    }

    fn check(&mut self, c: &Completion) {
        self.note(format!(
            "  got {} {:?} {:?} qpn {:#x}",
            c.cookie, c.opcode, c.status, c.qpn
        ));
        assert!(
            !self.refused.contains(&c.cookie),
            "refused request completed {c:?}"
        );
        let e = *self
            .exp
            .get(&c.cookie)
            .unwrap_or_else(|| panic!("unknown cookie {c:?}"));
        assert!(!e.done, "completed twice {c:?}");
        assert!(
            !e.dropped,
            "completion of a dropped QP's request after the drop {c:?}"
        );
        assert!(
            e.signaled || c.status != WcStatus::Success,
            "unsignaled success {c:?}"
        );
        self.exp.get_mut(&c.cookie).unwrap().done = true;
        if e.srq {
            return;
        }
        let s = self.qs[e.q].as_mut().unwrap();
        assert_eq!(s.qp.qpn(), c.qpn, "wrong QP {c:?}");
        if e.recv {
            if e.srq {
                return;
            }
            let i = s.recvs.iter().position(|&k| k == c.cookie).unwrap();
            assert!(
                s.last_recv.map_or(true, |l| i > l),
                "receive out of order {c:?}"
            );
            s.last_recv = Some(i);
        } else {
            let i = s.sends.iter().position(|&k| k == c.cookie).unwrap();
            assert!(
                s.last_send.map_or(true, |l| i > l),
                "send out of order {c:?}"
            );
            // Every signaled request before it has completed (a later completion retires
            // everything before it).
            for k in &s.sends[s.last_send.map_or(0, |l| l + 1)..i] {
                let x = self.exp[k];
                assert!(!x.signaled || x.done, "signaled {k} skipped by {c:?}");
            }
            s.last_send = Some(i);
        }
    }

    fn drain(&mut self) {
        let mut idle = 0;
        while idle < 3 {
            let a = self.dev.process();
            let b = self.poll(64);
            idle = if a + b == 0 { idle + 1 } else { 0 };
        }
    }

    fn step(&mut self, r: &mut Rng) {
        let live = self.live();
        if live.is_empty() || (live.len() < 5 && r.chance(3)) {
            self.add_qp(r);
            return;
        }
        let q = r.pick(&live);
        match r.below(100) {
            0..=39 => self.post(r, q),
            40..=49 => self.batch(r, q),
            50..=59 => self.post_recv(r, q),
            60..=61 => {
                let s = self.qs[q].as_mut().unwrap();
                let res = s.qp.set_error();
                s.errored = true;
                self.note(format!("set_error q{q}: {res:?}"));
            }
            62..=63 => {
                let s = self.qs[q].take().unwrap();
                self.note(format!("drop q{q} {:#x}", s.qp.qpn()));
                drop(s.qp);
                for e in self.exp.values_mut() {
                    if e.q == q && !e.done && !e.srq {
                        e.dropped = true;
                    }
                }
            }
            64..=89 => {
                let n = r.pick(&[1, 2, 3, 7, 16, 64]);
                self.poll(n);
            }
            _ => {
                self.dev.process();
            }
        }
    }

    fn finish(&mut self) {
        for q in self.live() {
            let _ = self.qs[q].as_mut().unwrap().qp.set_error();
        }
        self.drain();
        let mut checked: Vec<usize> = vec![];
        for q in self.live() {
            if self.qs[q].is_none() {
                continue;
            }
            let cookie = self.cookie();
            let mut qf_retried = false;
            loop {
                let res = self.qs[q].as_mut().unwrap().qp.post(
                    &Request::Nop,
                    cookie,
                    PostFlags::SIGNALED,
                );
                self.note(format!("final nop q{q}: {res:?}"));
                match res {
                    Ok(()) => break,
                    Err(Error::CqFull { .. }) => {
                        assert!(!self.generous, "final NOP CqFull on a generous CQ");
                        self.drain();
                        // The documented idle-queue limit: free a checked QP's charge.
                        let k = match checked.pop() {
                            Some(k) => k,
                            None => {
                                let others: Vec<usize> =
                                    self.live().into_iter().filter(|&k| k != q).collect();
                                let srq_out =
                                    self.exp.values().filter(|e| e.srq && !e.done).count();
                                let k = *others.last().unwrap_or_else(|| {
                                    panic!("CqFull with every other QP gone; SRQ receives outstanding: {srq_out}, srq free {:?}", self.srq.as_ref().map(|s| s.free()))
                                });
                                for e in self.exp.values_mut() {
                                    if e.q == k && !e.done && !e.srq {
                                        e.dropped = true;
                                    }
                                }
                                k
                            }
                        };
                        self.note(format!("finish: drop q{k} for room"));
                        self.qs[k] = None;
                    }
                    Err(Error::QueueFull { .. }) if !qf_retried => {
                        // A forgotten batch that filled the ring: the refusal rang it.
                        qf_retried = true;
                        self.drain();
                    }
                    Err(e) => panic!("final NOP {e}"),
                }
            }
            self.accept(q, cookie, true, false, false);
            self.drain();
            for (k, e) in &self.exp {
                if e.q == q && e.signaled && !e.dropped && !e.srq {
                    assert!(e.done, "cookie {k} never completed: {e:?}");
                }
            }
            let s = self.qs[q].as_ref().unwrap();
            assert_eq!(
                s.qp.free_send(),
                s.caps.sq_blocks,
                "send room not back, q{q}"
            );
            if !s.srq {
                assert_eq!(
                    s.qp.free_recv(),
                    s.qp.recv_depth(),
                    "recv room not back, q{q}"
                );
            }
            checked.push(q);
        }
        assert!(
            !self.dev.nic().unwrap().cq_overrun(self.cq.cqn()),
            "CQ overran"
        );
    }
}

fn run(seed: u64, steps: usize) {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let generous = r.chance(30);
    let entries = if generous {
        4096
    } else {
        r.pick(&[16, 32, 64, 128])
    };
    let cq = dev.create_cq(entries).unwrap();
    let mr = pd
        .alloc_mr(
            1 << 17,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let srq = if r.chance(50) {
        Some(
            pd.create_srq(
                &cq,
                SrqCaps {
                    entries: 3,
                    max_sge: 2,
                },
            )
            .unwrap(),
        )
    } else {
        None
    };
    let mut w = W {
        dev,
        pd,
        mr,
        cq,
        srq,
        srq_avail: 0,
        qs: vec![],
        exp: HashMap::new(),
        refused: HashSet::new(),
        next: 0,
        generous,
        log: vec![],
    };
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for _ in 0..steps {
            w.step(&mut r);
        }
        w.finish();
    }));
    if let Err(e) = out {
        eprintln!("seed {seed} (CQ {entries}) failed; last operations:");
        for l in &w.log {
            eprintln!("  {l}");
        }
        std::panic::resume_unwind(e);
    }
}

#[test]
fn queue_bookkeeping_under_random_legal_use() {
    if let Some(s) = std::env::var("BLUEFLAME_BOOKS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return run(s, 600);
    }
    let n: u64 = std::env::var("BLUEFLAME_BOOKS_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    for seed in 0..n {
        run(seed, 600);
    }
}
