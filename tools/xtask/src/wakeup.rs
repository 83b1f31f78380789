//! `cargo xtask wakeup`: the wake-up cost of event mode on the software NIC (thread mode),
//! on this machine: bfperf's send and write-with-immediate latency tests, busy polling and
//! `--events` alternating, [`ROUNDS`] runs each; prints the medians of the runs' typical and
//! 99th-percentile half round trips and the difference (events minus polling). The rxe
//! figures, beside perftest's `ib_send_lat -e`, come from `cargo xtask rxe-compare`.

use crate::compare::{json_value, median};
use crate::shell::{root, run};
use std::process::Command;

/// (label, bfperf subcommand and options)
const TESTS: &[(&str, &str)] = &[
    ("send latency, 8 B", "send-lat"),
    ("write-imm latency, 8 B", "write-lat --write-with-imm"),
];

/// Runs of each mode per test.
const ROUNDS: usize = 5;

/// Iterations per run.
const ITERS: u32 = 20_000;

fn bfperf(args: &str, events: bool) -> Option<(f64, f64)> {
    let exe = root().join("target/release/bfperf");
    let mut cmd = Command::new(exe);
    cmd.args(args.split_whitespace())
        .args(["--device", "sim", "--size", "8", "--json"])
        .args(["--iters", &ITERS.to_string()]);
    if events {
        cmd.arg("--events");
    }
    let out = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        eprintln!(
            "xtask: bfperf {args} failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some((
        json_value(&text, "t_typical_us")?,
        json_value(&text, "p99_us")?,
    ))
}

/// Runs the measurement; false when a run failed.
pub fn main() -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !run(
        "build bfperf",
        Command::new(&cargo).args(["build", "--release", "--locked", "-q", "-p", "bfperf"]),
    ) {
        return false;
    }
    println!(
        "{:<24} {:>16} {:>16} {:>12}   (software NIC, thread mode; half round trip, us)",
        "test", "poll typ / p99", "events typ / p99", "wake-up"
    );
    let mut ok = true;
    for &(label, args) in TESTS {
        let (mut poll, mut ev) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        for _ in 0..ROUNDS {
            for (events, into) in [(false, &mut poll), (true, &mut ev)] {
                match bfperf(args, events) {
                    Some((typ, p99)) => {
                        into.0.push(typ);
                        into.1.push(p99);
                    }
                    None => ok = false,
                }
            }
        }
        let show = |v: &(Vec<f64>, Vec<f64>)| match (median(v.0.clone()), median(v.1.clone())) {
            (Some(t), Some(p)) => format!("{t:.2} / {p:.2}"),
            _ => "n/a".into(),
        };
        let cost = match (median(poll.0.clone()), median(ev.0.clone())) {
            (Some(p), Some(e)) => format!("{:+.2}", e - p),
            _ => "n/a".into(),
        };
        println!(
            "{label:<24} {:>16} {:>16} {cost:>12}",
            show(&poll),
            show(&ev)
        );
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "  every run (typical): poll {}; events {}",
            list(&poll.0),
            list(&ev.0)
        );
    }
    println!(
        "(medians of {ROUNDS} alternating runs of {ITERS} iterations; wake-up = the event \
         mode's typical minus the polling typical)"
    );
    ok
}
