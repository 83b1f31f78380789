//! bfperf: perftest-style latency over blueflame's direct data path.
//!
//! `bfperf write-lat [--device auto|sim|sim-stepped|NAME] [--size N] [--iters N] [--warmup N]
//! [--pin CORE] [--json]`
//!
//! An RDMA-write ping-pong as `ib_write_lat` runs it: side A writes `size` bytes into B's
//! buffer, B sees the last byte change and writes back; the latency of one write is half the
//! round trip. Both sides run in this process (one thread), through the device's data path:
//! direct on the software NIC (WQEs into the ring, BlueFlame doorbell, CQ polled from the
//! ring), verbs on other rdma-core devices (rxe, ...).

mod probe;
mod stats;

use blueflame::{Access, Completion, Device, Payload, PostFlags, QpCaps, Sge};
use std::time::Instant;

struct Opts {
    device: String,
    size: usize,
    iters: usize,
    warmup: usize,
    pin: Option<usize>,
    json: bool,
}

fn usage() -> ! {
    eprintln!("usage: bfperf write-lat [--device auto|sim|sim-stepped|NAME] [--size N] [--iters N] [--warmup N] [--pin CORE] [--json]");
    std::process::exit(2)
}

fn parse(args: &[String]) -> Opts {
    let mut o = Opts {
        device: "auto".into(),
        size: 8,
        iters: 10_000,
        warmup: 1000,
        pin: None,
        json: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match a.as_str() {
            "--device" | "-d" => o.device = val(),
            "--size" | "-s" => o.size = num(val()),
            "--iters" | "-n" => o.iters = num(val()),
            "--warmup" => o.warmup = num(val()),
            "--pin" => o.pin = Some(num(val())),
            "--json" => o.json = true,
            _ => usage(),
        }
    }
    if o.size == 0 || o.iters == 0 {
        usage();
    }
    o
}

fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it, and
    // sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "bfperf: cannot pin to core {core}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Which device runs, and a line saying why.
fn open(name: &str) -> Result<(Device, String), blueflame::Error> {
    let dev = match name {
        "sim" => Device::sim(),
        "sim-stepped" => Device::sim_stepped(),
        "auto" => Device::open_default()?,
        other => Device::open(other, None)?,
    };
    let why = match (name, dev.nic().is_some()) {
        ("auto", true) => format!("no RDMA device present: {}", dev.describe()),
        _ => dev.describe(),
    };
    let why = format!("{why}, {:?} data path", dev.data_path());
    Ok((dev, why))
}

fn write_lat(o: &Opts) -> Result<(), blueflame::Error> {
    if let Some(c) = o.pin {
        pin(c);
    }
    let (dev, why) = open(&o.device)?;
    let pd = dev.alloc_pd()?;
    let caps = QpCaps {
        max_inline: 256,
        ..QpCaps::default()
    };
    let mut cq_a = dev.create_cq(256)?;
    let mut cq_b = dev.create_cq(256)?;
    let mut a = pd.create_qp(&cq_a, &cq_a, caps)?;
    let mut b = pd.create_qp(&cq_b, &cq_b, caps)?;
    let (ea, eb) = (a.endpoint()?, b.endpoint()?);
    a.connect(eb)?;
    if dev.nic().is_none() {
        b.connect(ea)?;
    }
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mr_a = pd.alloc_mr(o.size * 2, rights)?;
    let mr_b = pd.alloc_mr(o.size * 2, rights)?;
    let inline = o.size <= caps.max_inline as usize;
    let mut msg = vec![0u8; o.size];
    let mut done = [Completion::default(); 16];
    let total = o.warmup + o.iters;
    let mut samples = Vec::with_capacity(o.iters);
    let stepped = o.device == "sim-stepped";
    let wait = |mr: &blueflame::MemoryRegion, tag: u8| {
        let mut spins = 0u64;
        while mr.read_volatile_u8(o.size - 1).expect("in region") != tag {
            if stepped {
                dev.process();
            }
            spins += 1;
            if spins > 2_000_000_000 {
                eprintln!("bfperf: no progress (tag {tag})");
                std::process::exit(1);
            }
            std::hint::spin_loop();
        }
    };
    for i in 0..total {
        let tag = (i % 255) as u8 + 1;
        *msg.last_mut().expect("size > 0") = tag;
        let t0 = Instant::now();
        for (qp, cq, src, dst) in [
            (&mut a, &mut cq_a, &mr_a, &mr_b),
            (&mut b, &mut cq_b, &mr_b, &mr_a),
        ] {
            if inline {
                qp.write_inline(&msg, dst.remote(0), i as u64, PostFlags::UNSIGNALED)?;
            } else {
                src.write(o.size, &msg)?;
                let sge = [Sge {
                    addr: src.addr() + o.size as u64,
                    len: o.size as u32,
                    lkey: src.lkey(),
                }];
                qp.post(
                    &blueflame::Request::Write {
                        remote: dst.remote(0),
                        data: Payload::Sgl(&sge),
                    },
                    i as u64,
                    PostFlags::UNSIGNALED,
                )?;
            }
            wait(dst, tag);
            // Reclaims ring space (the driver signals one WQE in half a ring); nothing is
            // reported unless something failed.
            if cq.poll(&mut done) > 0 {
                eprintln!("bfperf: unexpected completion {:?}", done[0]);
                std::process::exit(1);
            }
        }
        let rtt = t0.elapsed().as_nanos() as f64;
        if i >= o.warmup {
            samples.push(rtt / 2.0);
        }
    }
    let s = stats::summarize(&mut samples);
    if o.json {
        println!(
            "{}",
            stats::json("write_lat", &o.device, o.size, o.iters, &s)
        );
    } else {
        println!("---------------------------------------------------------------------------------------");
        println!("                    RDMA_Write Latency Test (blueflame direct path)");
        println!(" Device         : {why}");
        println!(
            " Transport      : RC, {} ({} bytes)",
            if inline { "inline" } else { "scatter list" },
            o.size
        );
        println!(" Measured       : half the round trip of a write ping-pong, after {} warm-up iterations", o.warmup);
        println!("---------------------------------------------------------------------------------------");
        println!("{}", stats::HEADER);
        println!("{}", stats::row(o.size, o.iters, &s));
        println!("---------------------------------------------------------------------------------------");
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("write-lat") => {
            let o = parse(&args[1..]);
            if let Err(e) = write_lat(&o) {
                eprintln!("bfperf: {e}");
                std::process::exit(1);
            }
        }
        Some("icount-probe") => {
            let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
            if let Err(e) = probe::run(n) {
                eprintln!("bfperf: {e}");
                std::process::exit(1);
            }
        }
        _ => usage(),
    }
}
