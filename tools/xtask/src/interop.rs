//! The interop pairings of the rxe stage: bfperf against Debian's unmodified perftest on
//! rxe0, each latency test perftest's exchange is spoken for, both ways (bfperf client
//! with `--perftest` -> perftest server, perftest client -> bfperf server, which tells a
//! perftest client by its first bytes), each pairing one line with both programs'
//! figures: `interop <test> <client> -> <server>: ok`. A pairing fails when either
//! program fails or hangs (a timeout), or the side that measures prints no figure.

use crate::compare::{json_value, perftest_value};

/// The tests: bfperf's subcommand and perftest's program.
const TESTS: &[(&str, &str)] = &[
    ("write-lat", "ib_write_lat"),
    ("read-lat", "ib_read_lat"),
    ("send-lat", "ib_send_lat"),
];

/// Iterations of each pairing (about 20 ms each on rxe under emulation).
const ITERS: u32 = 300;

/// Seconds a program may take.
const LIMIT: u32 = 60;

/// The VM's commands (run from the repository's root; bfperf's release build is there).
pub fn script() -> String {
    let mut s = String::new();
    let pt = |p: &str, host: &str| {
        format!("timeout {LIMIT} {p} -F -d rxe0 -x $BLUEFLAME_GID_INDEX -s 8 -n {ITERS} {host}")
    };
    let bf = |t: &str, role: &str| {
        format!("timeout {LIMIT} target/release/bfperf {t} -d rxe0 -s 8 -n {ITERS} {role} --json")
    };
    for (t, p) in TESTS {
        for (label, server, client) in [
            (
                format!("{t} bfperf -> perftest"),
                pt(p, ""),
                bf(t, "--client 10.77.0.1 --perftest"),
            ),
            (
                format!("{t} perftest -> bfperf"),
                bf(t, "--server"),
                pt(p, "10.77.0.1"),
            ),
        ] {
            s.push_str(&format!(
                "echo '=== interop {label}'; \
                 {server} > target/rxe/io.srv 2>&1 & srv=$!; sleep 2; \
                 {client} > target/rxe/io.cli 2>&1; c=$?; wait $srv; s=$?; \
                 echo \"client rc $c, server rc $s\"; \
                 echo '--- client'; cat target/rxe/io.cli; echo '--- server'; cat target/rxe/io.srv; "
            ));
        }
    }
    s
}

/// The typical latency (us) in one program's output: bfperf's JSON or perftest's row.
fn figure(out: &str) -> Option<f64> {
    json_value(out, "t_typical_us").or_else(|| perftest_value(out, false))
}

/// Reads the pairings' sections of the stage's log; prints a line each. False when one
/// failed or did not run.
pub fn report(log: &str) -> bool {
    let mut ok = true;
    let sections: Vec<&str> = log.split("=== interop ").skip(1).collect();
    for part in &sections {
        let label = part.lines().next().unwrap_or("?").trim();
        let (client_name, server_name) = if label.contains("bfperf -> perftest") {
            ("bfperf", "perftest")
        } else {
            ("perftest", "bfperf")
        };
        let test = label.split_whitespace().next().unwrap_or("?");
        let rcs = part.lines().find(|l| l.starts_with("client rc "));
        let out = |which: &str| -> &str {
            let start = part
                .find(&format!("--- {which}\n"))
                .map_or(part.len(), |i| i + 5 + which.len());
            let rest = &part[start.min(part.len())..];
            rest.find("--- ").map_or(rest, |e| &rest[..e])
        };
        let (cli, srv) = (figure(out("client")), figure(out("server")));
        let fine = rcs == Some("client rc 0, server rc 0") && cli.is_some();
        let fig = |name: &str, v: Option<f64>| match v {
            Some(v) => format!("{name} {v:.2} us"),
            None => format!("{name} (no figure: its side does not measure)"),
        };
        println!(
            "interop {test} {client_name} -> {server_name}: {} ({}, {})",
            if fine { "ok" } else { "FAILED" },
            fig(client_name, cli),
            fig(server_name, srv),
        );
        if !fine {
            println!("  {}", rcs.unwrap_or("no exit codes: it did not finish"));
            ok = false;
        }
    }
    if sections.len() != 2 * TESTS.len() {
        eprintln!(
            "xtask: {} of {} interop pairings ran",
            sections.len(),
            2 * TESTS.len()
        );
        ok = false;
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(label: &str, rcs: &str, cli: &str, srv: &str) -> String {
        format!("=== interop {label}\n{rcs}\n--- client\n{cli}\n--- server\n{srv}\n")
    }

    #[test]
    fn every_pairing_with_both_figures_or_a_failure() {
        let row = " 8       300         22.35          254.34         24.05            28.48";
        let json = "{\"test\":\"write_lat\",\"t_typical_us\":24.210,\"t_avg_us\":29.0}";
        let mut log = String::new();
        for (t, _) in TESTS {
            log += &section(
                &format!("{t} bfperf -> perftest"),
                "client rc 0, server rc 0",
                json,
                row,
            );
            log += &section(
                &format!("{t} perftest -> bfperf"),
                "client rc 0, server rc 0",
                row,
                json,
            );
        }
        assert!(report(&log));
        assert_eq!(figure(json), Some(24.21));
        assert_eq!(figure(row), Some(24.05));
        // A hung server, a client without its figure, a pairing that never ran.
        let bad = log.replacen("client rc 0, server rc 0", "client rc 0, server rc 124", 1);
        assert!(!report(&bad));
        let bad = log.replacen(json, "bfperf: refused", 1);
        assert!(!report(&bad));
        let cut = log.rsplit_once("=== interop").unwrap().0.to_string();
        assert!(!report(&cut));
        assert!(script().matches("=== interop").count() == 6);
    }
}
