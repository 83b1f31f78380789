//! bfperf: perftest-style RDMA microbenchmark over blueflame.
//!
//! `bfperf <write-lat|read-lat|send-lat|atomic-lat|write-bw|read-bw|send-bw> [options]`
//! (`bfperf --help` lists them). By default both sides run in this process (a connected
//! pair of QPs, the responder in its own thread, as perftest's two processes); `--server` /
//! `--client HOST` run one side each, connected over the out-of-band TCP exchange. The data
//! path is the device's: direct on the software NIC and mlx5, verbs on other devices.

mod bw;
mod csv;
mod dmabuf;
mod hist;
mod hwts;
mod lat;
mod mmap_file;
mod opts;
mod out_json;
mod perftest;
mod plot;
mod probe;
mod probe_verbs;
mod progress;
mod rc_pingpong;
mod setup;
mod stats;
mod ud;
mod window;

use opts::{Atomic, Connection, Opts};

/// Pins the calling thread to `core`, if given.
pub fn pin(core: Option<usize>) {
    let Some(core) = core else { return };
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

/// Runs the process on `cpus` (perftest's `--pin_cores`, its `set_process_affinity`): the
/// calling thread's affinity, which the threads it starts after inherit (call it first).
///
/// # Errors
/// The system's refusal (`EINVAL`: none of the CPUs may be used here), naming the list.
pub fn pin_cores(list: &str, cpus: &[usize]) -> blueflame::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (each CPU
    // is below CPU_SETSIZE, checked when the list was parsed); sched_setaffinity reads
    // `size_of::<cpu_set_t>()` bytes of it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return Err(blueflame::Error::Io(std::io::Error::new(
            e.kind(),
            format!("--pin_cores={list}: cannot run on these CPUs: {e}"),
        )));
    }
    Ok(())
}

enum Test {
    Lat(lat::Lat, &'static str),
    Bw(bw::Bw, &'static str),
}

/// The test a command names, as its options ask for it.
fn test_for(name: &str, o: &Opts) -> Option<Test> {
    Some(match name {
        "write-lat" if o.write_imm => Test::Lat(lat::Lat::WriteImm, "write_imm_lat"),
        "write-lat" => Test::Lat(lat::Lat::Write, "write_lat"),
        "read-lat" => Test::Lat(lat::Lat::Read, "read_lat"),
        "send-lat" => Test::Lat(lat::Lat::Send, "send_lat"),
        // The atomic `-A` names (fetch-and-add ran whatever was asked: a review's finding).
        "atomic-lat" => Test::Lat(lat::Lat::Atomic(o.atomic), "atomic_lat"),
        "write-bw" => Test::Bw(bw::Bw::Write, "write_bw"),
        "read-bw" => Test::Bw(bw::Bw::Read, "read_bw"),
        "send-bw" => Test::Bw(bw::Bw::Send, "send_bw"),
        "atomic-bw" => Test::Bw(bw::Bw::Atomic(o.atomic), "atomic_bw"),
        _ => return None,
    })
}

/// The test's title, perftest's words ("Bidirectional" before "BW" with `-b`).
fn title(t: &Test, o: &Opts) -> String {
    let base = match t {
        Test::Lat(lat::Lat::Atomic(_), _) if o.atomic == Atomic::CompareSwap => {
            "Atomic CMP_AND_SWAP Latency Test"
        }
        Test::Lat(lat::Lat::Atomic(_), _) => "Atomic FETCH_AND_ADD Latency Test",
        Test::Lat(lat::Lat::Write, _) => "RDMA_Write Latency Test",
        Test::Lat(lat::Lat::WriteImm, _) => "RDMA_Write_Imm Latency Test",
        Test::Lat(lat::Lat::Read, _) => "RDMA_Read Latency Test",
        Test::Lat(lat::Lat::Send, _) => "Send Latency Test",
        Test::Bw(bw::Bw::Write, _) => "RDMA_Write BW Test",
        Test::Bw(bw::Bw::Read, _) => "RDMA_Read BW Test",
        Test::Bw(bw::Bw::Send, _) => "Send BW Test",
        Test::Bw(bw::Bw::Atomic(Atomic::FetchAdd), _) => "Atomic FETCH_AND_ADD BW Test",
        Test::Bw(bw::Bw::Atomic(Atomic::CompareSwap), _) => "Atomic CMP_AND_SWAP BW Test",
    };
    match t {
        Test::Bw(..) if o.bidirectional => base.replace(" BW Test", " Bidirectional BW Test"),
        _ => base.to_string(),
    }
}

/// Turns a file error of `--csv` / `--plot` into the run's error, naming the file.
fn file_err(path: &std::path::Path) -> impl Fn(std::io::Error) -> blueflame::Error + '_ {
    move |e| {
        blueflame::Error::Io(std::io::Error::new(
            e.kind(),
            format!("{}: {e}", path.display()),
        ))
    }
}

/// How the receiver learns of completions: the JSON `mode` and the header line.
fn mode(o: &Opts) -> &'static str {
    if o.events {
        "event"
    } else {
        "poll"
    }
}

/// Where the receives are posted: the JSON / CSV `recv`.
fn recv(o: &Opts) -> &'static str {
    if o.srq {
        "srq"
    } else {
        "rq"
    }
}

fn mode_line(o: &Opts) -> &'static str {
    if o.events {
        "events (the receiver sleeps on the completion channel, as perftest -e)"
    } else {
        "busy polling"
    }
}

/// The unit latency tests report their times in: CPU cycles with `-C`, else microseconds.
fn unit(o: &Opts) -> stats::Unit {
    stats::Unit::of(o.cycles)
}

/// The header's line about `-C` (None without it, or in a bandwidth test): the table's
/// times are the TSC's cycles under perftest's `[usec]` header (perftest prints its
/// `RESULT_FMT_LAT` unchanged with `-C`), and the TSC's rate, calibrated here, to convert
/// them; a timed run (`-D`) reports microseconds, as perftest's duration report.
fn times_line(t: &Test, o: &Opts) -> Option<String> {
    if !o.cycles || !matches!(t, Test::Lat(..)) {
        return None;
    }
    if opts::duration(o).is_some() {
        return Some(
            " Times          : microseconds: -C does not apply to a timed run (-D), as perftest's duration report"
                .into(),
        );
    }
    // Calibrates the TSC once (50 ms) for its rate: the cycles themselves are raw.
    let _ = stats::Clock::new();
    let mhz = stats::clock_mhz().map_or("unknown".into(), |m| format!("{m:.3} MHz"));
    Some(format!(
        " Times          : CPU cycles (-C), under perftest's [usec] header; TSC at {mhz}"
    ))
}

fn run(t: Test, o: &Opts) -> blueflame::Result<()> {
    // The side that measures writes the files: the client, or this process.
    let measures = !o.server;
    let mut csv = match (&o.csv, measures) {
        (Some(p), true) => {
            let header = match t {
                Test::Lat(..) if opts::duration(o).is_some() => csv::LAT_DUR_HEADER.into(),
                Test::Lat(..) => csv::lat_header(unit(o)),
                Test::Bw(..) => csv::BW_HEADER.into(),
            };
            Some(csv::Csv::create(p, &header).map_err(file_err(p))?)
        }
        _ => None,
    };
    if let Some((list, cpus)) = &o.pin_cores {
        // Before the device: the software NIC's thread inherits it.
        pin_cores(list, cpus)?;
    }
    let (dev, what) = setup::open(o)?;
    let line = stats::RESULT_LINE;
    if !o.json {
        // perftest's words (`force_dependecies`), before its header, where it turns the peak
        // off itself (a counted run above 20000 iterations, a timed run), not where -N did.
        if matches!(t, Test::Bw(..)) && !o.no_peak && !bw::measures_peak(o) {
            println!(" WARNING: BW peak won't be measured in this run.");
        }
        if let Some(d) = opts::duration(o) {
            if o.run_infinitely {
                println!(" Duration       : until killed, a row every {d} s (--run_infinitely)");
            } else {
                println!(
                    " Duration       : {d} s, the middle {} s measured (-f {})",
                    d - 2 * opts::margin(o).unwrap_or(0),
                    opts::margin(o).unwrap_or(0)
                );
            }
        }
        println!(
            "{line}\n                    {} (blueflame)\n Device         : {what}",
            title(&t, o)
        );
        println!(
            " Mode           : {}",
            if o.server {
                "server"
            } else if o.client.is_some() {
                "client"
            } else {
                "both sides in this process"
            }
        );
        match o.connection {
            Connection::Rc if o.rdma_cm => println!(
                " Connection     : RC, the QPs created and connected through rdma_cm (-R: rdma_cm port {}, bfperf's TCP connection on {})",
                u32::from(o.port) + 1,
                o.port
            ),
            Connection::Rc => {
                println!(" Connection     : {}", o.connection.name());
                println!(" Doorbell       : {}", setup::doorbell_mode(&dev, o)?);
            }
            Connection::Dc => println!(
                " Connection     : DC (a DCI a side, aimed at the other's DCT; DC key {:#x})",
                setup::DC_KEY
            ),
            Connection::Ud => println!(
                " Connection     : UD (Q_Key 0x11111111; messages up to the path MTU, {} bytes; receives 40 bytes larger for the GRH)",
                ud::mtu(&dev, o)?
            ),
        }
        if let Some((list, _)) = &o.pin_cores {
            println!(" CPU affinity   : {list} (--pin_cores)");
        }
        if o.qps > 1 {
            // perftest's header line "Number of qps".
            println!(" Number of qps  : {} per side (-q)", o.qps);
        }
        if o.bidirectional {
            println!(
                " Direction      : both sides send at once (-b); the row is the sum of both sides' results"
            );
        }
        println!(" Completions    : {}", mode_line(o));
        if let Some(f) = o.cqe_zip {
            println!(" CQE compression: {f}");
        }
        if o.srq {
            println!(" Receives       : a shared receive queue (--srq)");
        }
        if o.odp {
            println!(" Memory         : on-demand paging (--odp)");
        }
        if o.hugepages {
            println!(" Memory         : 2 MiB huge pages (--use_hugepages)");
        }
        if let Some(f) = &o.mmap {
            println!(
                " Memory         : {} from byte {} (--mmap)",
                f.display(),
                o.mmap_offset.unwrap_or(0)
            );
        }
        if o.dmabuf {
            println!(
                " Memory         : dma-buf from {}, registered with ibv_reg_dmabuf_mr (--use_dmabuf)",
                dmabuf::exporter(&dev)
            );
        }
        println!(
            " Inline         : up to {} bytes, post list {}, tx depth {}",
            o.inline, o.post_list, o.tx_depth
        );
        if let Some(times) = times_line(&t, o) {
            println!("{times}");
        }
        println!("{line}");
        match t {
            Test::Lat(..) if opts::duration(o).is_some() => println!("{}", stats::HEADER_DUR),
            Test::Lat(..) => println!("{}", stats::HEADER),
            Test::Bw(..) => println!("{}", bw_header(o)),
        }
    }
    let sizes = match o.connection {
        Connection::Rc | Connection::Dc => opts::sizes(o),
        Connection::Ud => match ud::sizes(o, ud::mtu(&dev, o)?) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "bfperf: -c ud: {e}: a datagram is one packet (perftest's -c UD caps its size at the MTU the same way); use --size at most the MTU"
                );
                std::process::exit(1);
            }
        },
    };
    // With -a every size runs, in one process or across two (one connection per size: the
    // server listens again, the client dials again, both walking the same sizes).
    let sweep = o.all;
    let progress = progress::Progress::new(sizes.len(), sweep);
    for (i, &size) in sizes.iter().enumerate() {
        progress.step(i, size);
        let atomic = matches!(
            t,
            Test::Lat(lat::Lat::Atomic(_), _) | Test::Bw(bw::Bw::Atomic(_), _)
        );
        if atomic && size != 8 {
            eprintln!("bfperf: atomics move 8 bytes; --size is ignored");
        }
        let size = if atomic { 8 } else { size };
        if o.connection == Connection::Ud {
            run_ud(&t, o, &dev, size, csv.as_mut(), &progress)?;
            continue;
        }
        let test_name = match t {
            Test::Lat(_, name) | Test::Bw(_, name) => name,
        };
        let s = setup::setup(o, &dev, test_name, size)?;
        match t {
            Test::Lat(kind, name) if opts::duration(o).is_some() => {
                if let Some(r) = lat::run_timed(o, kind, s, size)? {
                    report_lat_dur(&t, o, name, size, &r, csv.as_mut(), &progress)?;
                }
            }
            Test::Lat(kind, name) => {
                if let Some((samples, split)) = lat::run(o, kind, s, size)? {
                    report_lat(&t, o, name, size, samples, csv.as_mut(), &progress)?;
                    if let Some(sp) = split {
                        if o.json {
                            println!("{}", sp.json(&name.replace('-', "_"), size));
                        } else {
                            println!("{}", sp.line());
                        }
                    }
                }
            }
            Test::Bw(kind, name) => {
                let r = {
                    // --run_infinitely: a row per period, from inside the run.
                    let mut each =
                        |r: &bw::BwResult| report_bw(&t, o, name, size, r, csv.as_mut(), &progress);
                    bw::run(o, kind, s, size, &mut each)?
                };
                if let Some(r) = r {
                    report_bw(&t, o, name, size, &r, csv.as_mut(), &progress)?;
                }
            }
        }
    }
    progress.clear();
    if !o.json {
        println!("{line}");
    }
    Ok(())
}

/// One size of a UD test (`-c ud`): send latency or bandwidth, reported as the RC tests.
fn run_ud(
    t: &Test,
    o: &Opts,
    dev: &blueflame::Device,
    size: usize,
    csv: Option<&mut csv::Csv>,
    progress: &progress::Progress,
) -> blueflame::Result<()> {
    match *t {
        Test::Lat(_, name) => {
            let samples = ud::latency(o, dev, size)?;
            report_lat(t, o, name, size, samples, csv, progress)
        }
        Test::Bw(_, name) => {
            let r = ud::bandwidth(o, dev, size)?;
            report_bw(t, o, name, size, &r, csv, progress)
        }
    }
}

/// Reports one size of a latency test (RC or UD): its CSV row, its plot, then its JSON
/// line or table row.
fn report_lat(
    t: &Test,
    o: &Opts,
    name: &str,
    size: usize,
    mut samples: Vec<f64>,
    csv: Option<&mut csv::Csv>,
    progress: &progress::Progress,
) -> blueflame::Result<()> {
    let csv_err = || file_err(o.csv.as_deref().unwrap_or(".".as_ref()));
    progress.clear();
    // perftest's print_report_lat: the unsorted samples, then (sorted) the histogram's,
    // then the row, all in the unit of -C (samples in nanoseconds, or cycles).
    let unit = unit(o);
    if o.unsorted {
        print!("{}", stats::sample_lines(&samples, unit));
    }
    let sum = stats::summarize(&mut samples, unit);
    if let Some(path) = &o.out_json {
        let reads = matches!(t, Test::Lat(lat::Lat::Read | lat::Lat::Atomic(_), _));
        out_json::lat(o, &title(t, o), reads, size, o.iters, &sum).map_err(file_err(path))?;
    }
    if o.histogram {
        // The sorted samples less the two largest (`LAT_MEASURE_TAIL`), as the statistics.
        print!(
            "{}",
            stats::sample_lines(&samples[..stats::kept(samples.len())], unit)
        );
    }
    if o.unsorted || o.histogram {
        // perftest prints the table's line and header again before the row (`--json`
        // refuses -U and -H).
        println!("{}\n{}", stats::RESULT_LINE, stats::HEADER);
    }
    if let Some(c) = csv {
        c.lat(
            name,
            &o.device,
            size,
            o.iters,
            &sum,
            mode(o),
            recv(o),
            o.connection.name(),
        )
        .map_err(csv_err())?;
    }
    if let Some(p) = &o.plot {
        let file = plot::path_for(p, size, o.all);
        let us: Vec<f64> = samples.iter().map(|&v| unit.of_sample(v)).collect();
        let title = format!("{} {size} bytes", title(t, o));
        plot::write_svg(&file, &title, &us, &sum, unit).map_err(file_err(&file))?;
    }
    if o.json {
        println!(
            "{}",
            stats::json(
                name,
                &o.device,
                (mode(o), recv(o), o.connection.name()),
                size,
                o.iters,
                &sum,
                unit,
            )
        );
    } else {
        println!("{}", stats::row(size, o.iters, &sum));
    }
    Ok(())
}

/// Reports a timed latency run (`-D`) as perftest's `print_report_lat_duration`: its
/// `--out_json` file, its CSV row, then its JSON line or table row.
fn report_lat_dur(
    t: &Test,
    o: &Opts,
    name: &str,
    size: usize,
    r: &stats::Timed,
    csv: Option<&mut csv::Csv>,
    progress: &progress::Progress,
) -> blueflame::Result<()> {
    progress.clear();
    if let Some(path) = &o.out_json {
        let reads = matches!(t, Test::Lat(lat::Lat::Read | lat::Lat::Atomic(_), _));
        out_json::lat_dur(o, &title(t, o), reads, size, r).map_err(file_err(path))?;
    }
    let fields = (mode(o), recv(o), o.connection.name());
    if let Some(c) = csv {
        c.lat_dur(name, &o.device, size, r, fields)
            .map_err(file_err(o.csv.as_deref().unwrap_or(".".as_ref())))?;
    }
    if o.json {
        println!("{}", stats::json_dur(name, &o.device, fields, size, r));
    } else {
        println!("{}", stats::row_dur(size, r));
    }
    Ok(())
}

/// Reports one size of a bandwidth test (RC or UD): its CSV row, then its JSON line or
/// table row.
fn report_bw(
    t: &Test,
    o: &Opts,
    name: &str,
    size: usize,
    r: &bw::BwResult,
    csv: Option<&mut csv::Csv>,
    progress: &progress::Progress,
) -> blueflame::Result<()> {
    let csv_err = || file_err(o.csv.as_deref().unwrap_or(".".as_ref()));
    progress.clear();
    if let Some(path) = &o.out_json {
        // perftest writes the report in the table's unit.
        let unit = bw::table_unit(o);
        let reads = matches!(t, Test::Bw(bw::Bw::Read | bw::Bw::Atomic(_), _));
        out_json::bw(
            o,
            &title(t, o),
            reads,
            size,
            r.iters,
            r.peak * unit,
            r.avg * unit,
            r.mpps,
        )
        .map_err(file_err(path))?;
    }
    if let Some(c) = csv {
        c.bw(
            name,
            &o.device,
            size,
            r.iters as usize,
            r.peak,
            r.avg,
            r.mpps,
            mode(o),
            recv(o),
            o.connection.name(),
        )
        .map_err(csv_err())?;
    }
    if o.json {
        println!(
            "{{\"test\":\"{name}\",\"device\":\"{}\",\"bytes\":{size},\"iterations\":{},\"bw_peak_mb_s\":{:.3},\"bw_avg_mb_s\":{:.3},\"msg_rate_mpps\":{:.6},\"mode\":\"{}\",\"recv\":\"{}\",\"connection\":\"{}\"}}",
            o.device, r.iters, r.peak, r.avg, r.mpps, mode(o), recv(o), o.connection.name()
        );
    } else {
        // perftest's --report_gbits: bits per second over 10^9 (MB/s is 2^20 bytes).
        let unit = bw::table_unit(o);
        let row = |iters: u64, peak: f64, avg: f64, mpps: f64| {
            // perftest's `inc_accuracy` (`print_full_bw_report`): in Gb/s, an average below
            // 0.1 is printed with six decimals (`REPORT_FMT_EXT`), else two.
            let prec = if o.gbits && avg * unit < 0.1 { 6 } else { 2 };
            println!(
                " {:<10} {:<14} {:<18.prec$} {:<20.prec$} {:.6}",
                size,
                iters,
                peak * unit,
                avg * unit,
                mpps
            )
        };
        row(r.iters, r.peak, r.avg, r.mpps);
        // perftest's --report-both: after the summed row of a -b run, each side's apart.
        if let (true, Some(sides)) = (o.report_both, r.sides) {
            let line = stats::RESULT_LINE;
            for (name, f) in ["Local", "Remote"].iter().zip(sides) {
                println!("{line}\n\n {name} results: \n{line}\n{}", bw_header(o));
                row(f.iters, f.peak, f.avg, f.mpps);
            }
        }
    }
    Ok(())
}

/// The bandwidth table's header line.
fn bw_header(o: &Opts) -> &'static str {
    if o.gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().map(String::as_str).unwrap_or("");
    if name == "icount-probe" {
        let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
        if let Err(e) = probe::run(n) {
            eprintln!("bfperf: {e}");
            std::process::exit(1);
        }
        return;
    }
    if name == "icount-verbs" {
        let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200);
        if let Err(e) = probe_verbs::run(n) {
            eprintln!("bfperf: {e}");
            std::process::exit(1);
        }
        return;
    }
    if matches!(name, "-h" | "--help" | "help") {
        println!("{}", opts::USAGE);
        return;
    }
    let o = match opts::parse(args.get(1..).unwrap_or(&[])).and_then(|mut o| {
        opts::check_for(name, &o)?;
        // perftest's defaults of the test, where -I, -s and -n were not given.
        opts::resolve(name, &mut o);
        Ok(o)
    }) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("bfperf: {e}\n{}", opts::USAGE);
            std::process::exit(2);
        }
    };
    let Some(test) = test_for(name, &o) else {
        eprintln!("{}", opts::USAGE);
        std::process::exit(2);
    };
    if let Err(e) = run(test, &o) {
        eprintln!("bfperf: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::{test_for, Atomic, Opts, Test};

    #[test]
    fn atomic_lat_runs_the_atomic_asked_for() {
        for atomic in [Atomic::FetchAdd, Atomic::CompareSwap] {
            let o = Opts {
                atomic,
                ..Opts::default()
            };
            match test_for("atomic-lat", &o) {
                Some(Test::Lat(crate::lat::Lat::Atomic(a), _)) => assert_eq!(a, atomic),
                _ => panic!("atomic-lat"),
            }
        }
        assert!(test_for("nope", &Opts::default()).is_none());
    }
}
