//! `cargo xtask rxe-compare`: perftest and bfperf with the same parameters on rxe0, in one
//! boot of the rxe VM, side by side with the ratio per line. Timings under emulation are
//! only for comparing the two programs in the same run, and they are noisy (the emulated
//! CPUs are host threads): each test runs [`ROUNDS`] times, the two programs alternating,
//! and the line shows the median of each program's results, then every result.

use crate::{root, run};
use std::process::Command;

/// (label, perftest program, bfperf subcommand, size, iterations)
const TESTS: &[(&str, &str, &str, u32, u32)] = &[
    ("write latency, 8 B", "ib_write_lat", "write-lat", 8, 2000),
    ("read latency, 8 B", "ib_read_lat", "read-lat", 8, 2000),
    ("send latency, 8 B", "ib_send_lat", "send-lat", 8, 2000),
    (
        "write bandwidth, 64 KiB",
        "ib_write_bw",
        "write-bw",
        65536,
        2000,
    ),
];

/// Runs of each program per test.
const ROUNDS: usize = 3;

fn script() -> String {
    let mut s = String::from("cd target/rxe\n");
    for (i, &(_, pt, bf, size, iters)) in TESTS.iter().enumerate() {
        for r in 0..ROUNDS {
            s.push_str(&format!(
                "{pt} -F -d rxe0 -x 1 -s {size} -n {iters} > pt{i}_{r}.srv 2>&1 & sleep 2; \
                 {pt} -F -d rxe0 -x 1 -s {size} -n {iters} 10.77.0.1 > pt{i}_{r}.txt 2>&1; wait\n\
                 ../release/bfperf {bf} --device rxe0 --size {size} --iters {iters} --json > bf{i}_{r}.txt 2>&1\n"
            ));
        }
    }
    s
}

/// The median of the values (None when there are none).
fn median(mut v: Vec<f64>) -> Option<f64> {
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
fn perftest_value(out: &str, bw: bool) -> Option<f64> {
    let line = out.lines().find(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 5 && f[0].parse::<u64>().is_ok() && f[1].parse::<u64>().is_ok()
    })?;
    let f: Vec<&str> = line.split_whitespace().collect();
    // lat: #bytes #iter t_min t_max t_typical ...; bw: #bytes #iter BW_peak BW_avg MsgRate
    f.get(if bw { 3 } else { 4 })?.parse().ok()
}

fn json_value(out: &str, key: &str) -> Option<f64> {
    let i = out.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &out[i..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// Runs the comparison; false when the VM or a program failed.
pub fn main() -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !run(
        "build bfperf",
        Command::new(&cargo).args(["build", "--release", "--locked", "-q", "-p", "bfperf"]),
    ) {
        return false;
    }
    let Some((_, log)) = crate::rxe::run_in_vm(&script()) else {
        return false;
    };
    let dir = root().join("target/rxe");
    println!("{log}");
    println!(
        "{:<26} {:>14} {:>14} {:>8}",
        "test (rxe0, in the VM)", "perftest", "bfperf", "ratio"
    );
    let mut ok = true;
    let mut runs = Vec::new();
    for (i, &(label, _, _, _, _)) in TESTS.iter().enumerate() {
        let bw = label.contains("bandwidth");
        let (mut ps, mut bs) = (Vec::new(), Vec::new());
        for r in 0..ROUNDS {
            let read = |f: String| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let pt = read(format!("pt{i}_{r}.txt"));
            let bf = read(format!("bf{i}_{r}.txt"));
            match perftest_value(&pt, bw) {
                Some(v) => ps.push(v),
                None => {
                    ok = false;
                    eprintln!("xtask: no perftest result for {label}, round {r}:\n{pt}");
                }
            }
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
        let unit = if bw { "MB/s" } else { "us" };
        let show = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2} {unit}"));
        let ratio = match (p, b) {
            (Some(p), Some(b)) if p > 0.0 => format!("{:.2}", b / p),
            _ => "-".into(),
        };
        println!("{label:<26} {:>14} {:>14} {ratio:>8}", show(p), show(b));
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
         for latency, above 1.0 for bandwidth)\nevery run:\n{}",
        runs.join("\n")
    );
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

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
