//! Criterion benches of the direct path on software-NIC rings: posts (8-byte inline write,
//! 3-entry gather write, read, atomic, batches of 16 and 32) and polls (one CQE, 16 CQEs,
//! an empty CQ). The software NIC runs outside the timed sections.

#![allow(missing_docs)] // criterion_group! generates an undocumented function

use blueflame::*;
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::{Duration, Instant};

struct Rig {
    dev: Device,
    qp: Qp,
    cq: Cq,
    mr: MemoryRegion,
}

fn rig() -> Rig {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let caps = QpCaps {
        sq_blocks: 4096,
        rq_entries: 0,
        ..QpCaps::default()
    };
    let mut qp = pd.create_qp(&cq, &cq, caps).unwrap();
    let me = qp.endpoint().unwrap();
    qp.connect(&me).unwrap();
    let mr = pd.alloc_mr(1 << 16, Access(1 | 2 | 4 | 8)).unwrap();
    Rig { dev, qp, cq, mr }
}

impl Rig {
    /// Lets the NIC run everything posted and empties the CQ (untimed).
    fn settle(&mut self) {
        self.dev.process();
        let mut out = [Completion::default(); 64];
        while self.cq.poll(&mut out) > 0 {}
    }
}

/// Times `iters` posts made by `post`, in chunks the ring holds, settling between chunks.
fn bench_posts(c: &mut Criterion, name: &str, per: u64, mut post: impl FnMut(&mut Rig, u64)) {
    let mut r = rig();
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let n = (iters - done).min(1024 / per);
                let t = Instant::now();
                for i in 0..n {
                    post(&mut r, i);
                }
                total += t.elapsed();
                done += n;
                r.settle();
            }
            total
        })
    });
}

fn posts(c: &mut Criterion) {
    let flags = |i: u64| {
        if i % 64 == 63 {
            PostFlags::SIGNALED
        } else {
            PostFlags::UNSIGNALED
        }
    };
    bench_posts(c, "post/write_inline_8B", 1, |r, i| {
        r.qp.write_inline(black_box(b"12345678"), r.mr.remote(0).unwrap(), i, flags(i))
            .unwrap()
    });
    bench_posts(c, "post/write_sgl_3", 1, |r, i| {
        let sgl = [
            r.mr.sge(0, 64).unwrap(),
            r.mr.sge(128, 64).unwrap(),
            r.mr.sge(256, 64).unwrap(),
        ];
        r.qp.write(black_box(&sgl), r.mr.remote(4096).unwrap(), i, flags(i))
            .unwrap()
    });
    bench_posts(c, "post/read_64B", 1, |r, i| {
        let sgl = [r.mr.sge(0, 64).unwrap()];
        r.qp.read(black_box(&sgl), r.mr.remote(4096).unwrap(), i, flags(i))
            .unwrap()
    });
    bench_posts(c, "post/fetch_add", 1, |r, i| {
        let local = r.mr.sge(0, 8).unwrap();
        r.qp.fetch_add(r.mr.remote(8192).unwrap(), 1, local, i, flags(i))
            .unwrap()
    });
    for n in [16u64, 32] {
        bench_posts(c, &format!("post/batch_{n}_inline_8B"), n, |r, i| {
            let remote = r.mr.remote(0).unwrap();
            let mut b = r.qp.batch();
            for k in 0..n {
                let f = if k + 1 == n {
                    PostFlags::SIGNALED
                } else {
                    PostFlags::UNSIGNALED
                };
                b.push(
                    &Request::Write {
                        remote,
                        data: Payload::Inline(b"12345678"),
                    },
                    i,
                    f,
                )
                .unwrap();
            }
            b.ring().unwrap();
        });
    }
}

fn polls(c: &mut Criterion) {
    for k in [1usize, 16] {
        let mut r = rig();
        c.bench_function(&format!("poll/{k}_cqe"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut out = [Completion::default(); 16];
                for i in 0..iters {
                    for j in 0..k as u64 {
                        r.qp.write_inline(
                            b"x",
                            r.mr.remote(0).unwrap(),
                            i * 16 + j,
                            PostFlags::SIGNALED,
                        )
                        .unwrap();
                    }
                    r.dev.process();
                    let t = Instant::now();
                    let n = r.cq.poll(black_box(&mut out[..k]));
                    total += t.elapsed();
                    assert_eq!(n, k);
                }
                total
            })
        });
    }
    let mut r = rig();
    let mut out = [Completion::default(); 1];
    c.bench_function("poll/empty", |b| {
        b.iter(|| black_box(r.cq.poll(black_box(&mut out))))
    });
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = posts, polls
}
criterion_main!(benches);
