//! `cargo xtask rxe-compare`: perftest and bfperf with the same parameters on rxe0, in one
//! boot of the rxe VM, side by side with the ratio per line. Timings under emulation are
//! only for comparing the two programs in the same run, and they are noisy (the emulated
//! CPUs are host threads): each test runs [`ROUNDS`] times, the two programs alternating,
//! and the line shows the median of each program's results, then every result.
//!
//! Both programs run as two processes, a server and a client on rxe0 (bfperf's `--server` /
//! `--client`; over UD bfperf keeps both sides in one process: it has no server mode there).
//!
//! `cargo xtask rxe-compare LABEL...` runs only the tests whose label contains one of the
//! words (`cargo xtask rxe-compare send write-imm`: the event-mode comparison alone).
//! `--script` prints the commands the VM runs instead (to run them in a boot shared with
//! other commands, `cargo xtask rxe -- bash FILE`), `--report` prints the table of the
//! results the last boot left in `target/rxe` without booting.
//!
//! UD (perftest's `-c UD`, bfperf's `-c ud`): send latency and bandwidth over UD QPs
//! (`cargo xtask rxe-compare UD` runs those two alone).
//!
//! Event mode (perftest's `-e`, bfperf's `--events`: the receiver sleeps on the completion
//! channel) runs beside busy polling in the same boot; the wake-up cost of each program is
//! the difference of its two medians. Debian's perftest 4.5 has no write with immediate
//! (`--write_with_imm`), so that test runs bfperf alone.

use crate::shell::{root, run};
use std::process::Command;

/// One comparison: its label, perftest's program and options (none: bfperf alone),
/// bfperf's subcommand and options, size and iterations.
struct Test {
    label: &'static str,
    perftest: Option<(&'static str, &'static str)>,
    bfperf: (&'static str, &'static str),
    size: u32,
    iters: u32,
}

const fn t(
    label: &'static str,
    perftest: Option<(&'static str, &'static str)>,
    bfperf: (&'static str, &'static str),
    size: u32,
    iters: u32,
) -> Test {
    Test {
        label,
        perftest,
        bfperf,
        size,
        iters,
    }
}

const TESTS: &[Test] = &[
    t(
        "write latency, 8 B",
        Some(("ib_write_lat", "")),
        ("write-lat", ""),
        8,
        2000,
    ),
    t(
        "read latency, 8 B",
        Some(("ib_read_lat", "")),
        ("read-lat", ""),
        8,
        2000,
    ),
    t(
        "send latency, 8 B",
        Some(("ib_send_lat", "")),
        ("send-lat", ""),
        8,
        2000,
    ),
    t(
        "send latency, 8 B, events",
        Some(("ib_send_lat", "-e")),
        ("send-lat", "-e"),
        8,
        2000,
    ),
    t(
        "write-imm latency, 8 B",
        None,
        ("write-lat", "--write-with-imm"),
        8,
        2000,
    ),
    t(
        "write-imm latency, 8 B, events",
        None,
        ("write-lat", "--write-with-imm -e"),
        8,
        2000,
    ),
    t(
        "write bandwidth, 64 KiB",
        Some(("ib_write_bw", "")),
        ("write-bw", ""),
        65536,
        2000,
    ),
    t(
        "UD send latency, 8 B",
        Some(("ib_send_lat", "-c UD")),
        ("send-lat", "-c ud"),
        8,
        2000,
    ),
    t(
        "UD send bandwidth, 1 KiB",
        Some(("ib_send_bw", "-c UD")),
        ("send-bw", "-c ud"),
        1024,
        2000,
    ),
];

/// Wake-up cost rows: (label, the busy-polling test, the event-mode test), indices in [`TESTS`].
const WAKEUPS: &[(&str, usize, usize)] = &[
    ("send latency, 8 B", 2, 3),
    ("write-imm latency, 8 B", 4, 5),
];

/// Runs of each program per test (5: a single run under emulation varies by up to 2.5
/// times within a boot, and a median of 3 moved with one disturbed run).
const ROUNDS: usize = 5;

/// Seconds one run may take: a run that hangs (a ping-pong whose QP failed under a stalled
/// VM spins for ever on a byte that never comes) loses its round instead of the boot.
const LIMIT: u32 = 240;

/// Whether test `t` runs: every test without filters, else those whose label contains one.
fn selected(t: &Test, filters: &[String]) -> bool {
    filters.is_empty() || filters.iter().any(|f| t.label.contains(f.as_str()))
}

fn script(filters: &[String]) -> String {
    // perftest converts TSC ticks to microseconds with this figure (see `clock_line`).
    let mut s = String::from(
        "cd target/rxe\ngrep -m1 'cpu MHz' /proc/cpuinfo > cpu_mhz.txt; \
         cat /sys/devices/system/clocksource/clocksource0/current_clocksource >> cpu_mhz.txt\n",
    );
    for (i, t) in TESTS.iter().enumerate() {
        if !selected(t, filters) {
            continue;
        }
        let (size, iters) = (t.size, t.iters);
        for r in 0..ROUNDS {
            if let Some((pt, px)) = t.perftest {
                s.push_str(&format!(
                    "timeout {LIMIT} {pt} {px} -F -d rxe0 -x $BLUEFLAME_GID_INDEX -s {size} -n {iters} > pt{i}_{r}.srv 2>&1 & sleep 2; \
                     timeout {LIMIT} {pt} {px} -F -d rxe0 -x $BLUEFLAME_GID_INDEX -s {size} -n {iters} 10.77.0.1 > pt{i}_{r}.txt 2>&1; wait\n"
                ));
            }
            s.push_str(&bfperf_line(t, i, r));
        }
    }
    s
}

/// The command line of bfperf's run `r` of test `i`: over RC, a server and a client process
/// on rxe0 as perftest runs (each program then has the same process layout, one busy thread
/// per process); over UD, bfperf's both sides in one process (it refuses `--server` /
/// `--client` with `-c ud`).
fn bfperf_line(t: &Test, i: usize, r: usize) -> String {
    let (size, iters) = (t.size, t.iters);
    let (bf, bx) = t.bfperf;
    let common = format!("{bf} {bx} --device rxe0 --size {size} --iters {iters}");
    if bx.contains("-c ud") {
        format!("timeout {LIMIT} ../release/bfperf {common} --json > bf{i}_{r}.txt 2>&1\n")
    } else {
        format!(
            "timeout {LIMIT} ../release/bfperf {common} --server > bf{i}_{r}.srv 2>&1 & sleep 2; \
             timeout {LIMIT} ../release/bfperf {common} --client 10.77.0.1 --json > bf{i}_{r}.txt 2>&1; wait\n"
        )
    }
}

/// The median of the values (None when there are none).
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// The typical latency (usec) or average bandwidth (MB/s) of perftest's result line.
pub(crate) fn perftest_value(out: &str, bw: bool) -> Option<f64> {
    let line = out.lines().find(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 5 && f[0].parse::<u64>().is_ok() && f[1].parse::<u64>().is_ok()
    })?;
    let f: Vec<&str> = line.split_whitespace().collect();
    // lat: #bytes #iter t_min t_max t_typical ...; bw: #bytes #iter BW_peak BW_avg MsgRate
    f.get(if bw { 3 } else { 4 })?.parse().ok()
}

/// The number after `"key":` in a bfperf JSON line.
pub(crate) fn json_value(out: &str, key: &str) -> Option<f64> {
    let i = out.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &out[i..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// The "cpu MHz" of `/proc/cpuinfo` in `cpu_mhz.txt`'s text (the VM's first CPU).
fn cpuinfo_mhz(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("cpu MHz"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// The clock note: perftest turns TSC ticks into microseconds with `/proc/cpuinfo`'s "cpu
/// MHz" (`get_cpu_mhz`; its own sampling only when the two differ by more than 2%), bfperf
/// with its own calibration against the OS clock (`clock_mhz` in its JSON). The same
/// ticks then read as different microseconds: `bfperf's figure * bfperf_mhz / cpuinfo_mhz`
/// is bfperf's latency on perftest's clock. None without both figures.
fn clock_factor(cpuinfo: Option<f64>, bfperf: &[f64]) -> Option<f64> {
    let b = median(bfperf.to_vec())?;
    let c = cpuinfo.filter(|c| *c > 0.0)?;
    Some(b / c)
}

/// Runs the comparison (of the tests whose label contains one of `filters`, all without);
/// false when the VM or a program failed. With `--script`, prints the VM's commands; with
/// `--report`, the table of the last boot's results (see the module docs).
pub fn main(args: &[String]) -> bool {
    let flag = |f: &str| args.iter().any(|a| a == f);
    let filters: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .collect();
    if flag("--script") {
        print!("{}", script(&filters));
        return true;
    }
    if flag("--report") {
        return report(&filters);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !run(
        "build bfperf",
        Command::new(&cargo).args(["build", "--release", "--locked", "-q", "-p", "bfperf"]),
    ) {
        return false;
    }
    let Some((_, log)) = crate::vm::run_in_vm(&script(&filters), crate::vm::LONG_SECS) else {
        return false;
    };
    println!("{log}");
    report(&filters)
}

/// Prints the table of the results in `target/rxe` (of the tests `filters` select); false
/// when one is missing.
fn report(filters: &[String]) -> bool {
    let dir = root().join("target/rxe");
    println!(
        "{:<30} {:>14} {:>14} {:>8}",
        "test (rxe0, in the VM)", "perftest", "bfperf", "ratio"
    );
    let mut ok = true;
    let mut runs = Vec::new();
    let mut medians = Vec::new();
    let mut clocks = Vec::new();
    let mut on_one_clock = Vec::new();
    for (i, test) in TESTS.iter().enumerate() {
        if !selected(test, filters) {
            medians.push((None, None));
            continue;
        }
        let label = test.label;
        let bw = label.contains("bandwidth");
        let (mut ps, mut bs) = (Vec::new(), Vec::new());
        for r in 0..ROUNDS {
            let read = |f: String| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let pt = read(format!("pt{i}_{r}.txt"));
            let bf = read(format!("bf{i}_{r}.txt"));
            match perftest_value(&pt, bw) {
                Some(v) => ps.push(v),
                None if test.perftest.is_none() => {}
                None => {
                    ok = false;
                    eprintln!("xtask: no perftest result for {label}, round {r}:\n{pt}");
                }
            }
            clocks.extend(json_value(&bf, "clock_mhz"));
            match json_value(&bf, if bw { "bw_avg_mb_s" } else { "t_typical_us" }) {
                Some(v) => bs.push(v),
                None => {
                    ok = false;
                    eprintln!(
                        "xtask: no bfperf result for {label}, round {r}: {}",
                        bf.lines().last().unwrap_or("")
                    );
                }
            }
        }
        let (p, b) = (median(ps.clone()), median(bs.clone()));
        medians.push((p, b));
        let unit = if bw { "MB/s" } else { "us" };
        let show = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2} {unit}"));
        let ratio = match (p, b) {
            (Some(p), Some(b)) if p > 0.0 => format!("{:.2}", b / p),
            _ => "-".into(),
        };
        println!("{label:<30} {:>14} {:>14} {ratio:>8}", show(p), show(b));
        if let (Some(p), Some(b), false) = (p, b, bw) {
            on_one_clock.push((label, b / p));
        }
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        runs.push(format!(
            "  {label}: perftest {}; bfperf {}",
            list(&ps),
            list(&bs)
        ));
    }
    println!(
        "(medians of {ROUNDS} alternating runs; ratio = bfperf / perftest: below 1.0 is better \
         for latency, above 1.0 for bandwidth)"
    );
    let cpu = std::fs::read_to_string(dir.join("cpu_mhz.txt")).unwrap_or_default();
    match clock_factor(cpuinfo_mhz(&cpu), &clocks) {
        Some(f) => {
            println!(
                "clock: perftest converts ticks with /proc/cpuinfo's {} MHz ({}), bfperf with \
                 its calibration, median {:.3} MHz: on perftest's clock bfperf's latencies \
                 are x{f:.4}; latency ratios on one clock:",
                cpuinfo_mhz(&cpu).unwrap_or_default(),
                cpu.lines().nth(1).unwrap_or("clocksource ?").trim(),
                median(clocks.clone()).unwrap_or_default(),
            );
            for (label, r) in &on_one_clock {
                println!("  {label:<28} {:.3}", r * f);
            }
        }
        None => println!("clock: no cpu MHz or bfperf clock_mhz in this boot's results"),
    }
    println!(
        "\n{:<30} {:>14} {:>14}",
        "wake-up cost (events - poll)", "perftest", "bfperf"
    );
    for &(label, poll, event) in WAKEUPS {
        if !selected(&TESTS[poll], filters) || !selected(&TESTS[event], filters) {
            continue;
        }
        // Medians are (perftest, bfperf); `side` picks one program.
        let cost = |side: usize| {
            let pick = |m: &(Option<f64>, Option<f64>)| if side == 0 { m.0 } else { m.1 };
            match (pick(&medians[poll]), pick(&medians[event])) {
                (Some(p), Some(e)) => format!("{:+.2} us", e - p),
                _ => "n/a".into(),
            }
        };
        println!("{label:<30} {:>14} {:>14}", cost(0), cost(1));
    }
    println!(
        "(half round trip, medians: the event mode's median minus the polling median of the \
         same program in the same boot)\nevery run:\n{}",
        runs.join("\n")
    );
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// perftest's microseconds come from /proc/cpuinfo's MHz, bfperf's from its own
    /// calibration: the factor that puts bfperf on perftest's clock, and the script records
    /// the figure perftest uses.
    #[test]
    fn bfperf_is_put_on_perftest_s_clock() {
        let cpu = "cpu MHz\t\t: 2445.428\ntsc\n";
        assert_eq!(cpuinfo_mhz(cpu), Some(2445.428));
        assert_eq!(cpuinfo_mhz("model name : x"), None);
        // bfperf counted 2400 ticks per us where perftest assumes 2445.428: the same ticks
        // are fewer microseconds for perftest.
        let f = clock_factor(Some(2445.428), &[2400.0, 2401.0, 2399.0]).unwrap();
        assert!((f - 2400.0 / 2445.428).abs() < 1e-12);
        assert_eq!(clock_factor(None, &[2400.0]), None);
        assert_eq!(clock_factor(Some(2445.0), &[]), None);
        assert!(script(&[])
            .starts_with("cd target/rxe\ngrep -m1 'cpu MHz' /proc/cpuinfo > cpu_mhz.txt"));
    }

    #[test]
    fn wake_up_rows_pair_a_polling_test_with_its_event_mode() {
        for &(label, poll, event) in WAKEUPS {
            let (p, e) = (&TESTS[poll], &TESTS[event]);
            assert!(p.label.starts_with(label) && e.label.starts_with(label));
            assert!(!p.bfperf.1.contains("-e") && e.bfperf.1.contains("-e"));
            assert_eq!(p.perftest.is_some(), e.perftest.is_some());
            if let (Some(pp), Some(pe)) = (p.perftest, e.perftest) {
                assert_eq!((pp.0, pp.1, pe.1), (pe.0, "", "-e"));
            }
        }
        let s = script(&[]);
        assert!(s.contains("ib_send_lat -e -F -d rxe0"));
        let only = script(&["send latency".into()]);
        assert!(only.contains("ib_send_lat -e -F") && only.contains("bfperf send-lat "));
        assert!(!only.contains("ib_write_lat") && !only.contains("write-lat"));
        assert!(s.contains("bfperf send-lat -e --device rxe0"));
        assert!(s.contains("bfperf write-lat --write-with-imm -e --device rxe0"));
    }

    #[test]
    fn parses_perftest_and_bfperf_lines() {
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]\n 8       2000          20.10          95.00        25.90              26.50        2.00\n";
        assert_eq!(perftest_value(lat, false), Some(25.90));
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      2000             120.50             118.25               0.001892\n";
        assert_eq!(perftest_value(bw, true), Some(118.25));
        assert_eq!(
            json_value("{\"t_typical_us\":21.500,\"p99_us\":3}", "t_typical_us"),
            Some(21.5)
        );
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
