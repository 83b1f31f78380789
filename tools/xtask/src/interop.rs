//! The interop pairings of the rxe stage: bfperf against Debian's unmodified perftest on
//! rxe0, each test perftest's exchange is spoken for (write, read and send latency and
//! bandwidth, and `send-lat` against rdma-core's `ibv_rc_pingpong`), both ways (bfperf client
//! with `--perftest` -> perftest server, perftest client -> bfperf server, which tells a
//! perftest client by its first bytes), each pairing one line with both programs'
//! figures: `interop <test> <client> -> <server>: ok`. A pairing fails when either
//! program fails or hangs (a timeout), or the side that measures prints no figure.

use crate::compare::{json_value, perftest_value};

/// The tests: bfperf's subcommand, the other program, the message size and iterations
/// (under emulation a latency pairing takes about 20 ms on rxe, a bandwidth one about 0.3 s),
/// and a flag of bfperf's (the huge pages the script reserves first: `--use_hugepages`
/// registered on a real device).
const TESTS: &[(&str, &str, u32, u32, &str)] = &[
    ("write-lat", "ib_write_lat", 8, 300, ""),
    ("read-lat", "ib_read_lat", 8, 300, ""),
    ("send-lat", "ib_send_lat", 8, 300, ""),
    ("write-bw", "ib_write_bw", 4096, 1000, ""),
    ("read-bw", "ib_read_bw", 4096, 1000, ""),
    ("send-bw", "ib_send_bw", 4096, 1000, ""),
    ("send-lat", "ibv_rc_pingpong", 8, 300, ""),
    ("write-lat", "ib_write_lat", 8, 300, "--use_hugepages"),
];

/// How bfperf is named in a pairing's label: with its extra flag, if any.
fn me(extra: &str) -> String {
    if extra.is_empty() {
        "bfperf".into()
    } else {
        format!("bfperf[{extra}]")
    }
}

/// Seconds a program may take.
const LIMIT: u32 = 60;

/// The VM's commands (run from the repository's root; bfperf's release build is there).
pub fn script() -> String {
    // Huge pages for `--use_hugepages` (the VM's own kernel, as root).
    let mut s = String::from("echo 16 > /proc/sys/vm/nr_hugepages; ");
    for &(t, p, size, iters, extra) in TESTS {
        let me = me(extra);
        // rdma-core's example takes the GID index as -g and has no -F; bfperf is told the
        // server's program with --rc-pingpong instead of --perftest.
        let (gid, f, told) = if p == "ibv_rc_pingpong" {
            ("-g", "", "--rc-pingpong")
        } else {
            ("-x", "-F ", "--perftest")
        };
        let pt = |host: &str| {
            format!(
                "timeout {LIMIT} {p} {f}-d rxe0 {gid} $BLUEFLAME_GID_INDEX -s {size} -n {iters} {host}"
            )
        };
        let bf = |role: &str| {
            format!(
                "timeout {LIMIT} target/release/bfperf {t} -d rxe0 -s {size} -n {iters} {role} {extra} --json"
            )
        };
        for (label, server, client) in [
            (
                format!("{t} {me} -> {p}"),
                pt(""),
                bf(&format!("--client 10.77.0.1 {told}")),
            ),
            (format!("{t} {p} -> {me}"), bf("--server"), pt("10.77.0.1")),
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

/// The figure of one program's output: the typical latency (us) or the average bandwidth
/// (MB/s), from bfperf's JSON or perftest's row; `ibv_rc_pingpong`'s microseconds per
/// iteration (a whole round trip: "300 iters in 0.02 seconds = 66.67 usec/iter").
fn figure(out: &str, bw: bool) -> Option<f64> {
    let key = if bw { "bw_avg_mb_s" } else { "t_typical_us" };
    let rc = || {
        let l = out.lines().find(|l| l.ends_with(" usec/iter"))?;
        l.trim_end_matches(" usec/iter")
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    };
    json_value(out, key)
        .or_else(|| perftest_value(out, bw))
        .or_else(rc)
}

/// Reads the pairings' sections of the stage's log; prints a line each. False when one
/// failed or did not run.
pub fn report(log: &str) -> bool {
    let mut ok = true;
    let sections: Vec<&str> = log.split("=== interop ").skip(1).collect();
    for part in &sections {
        let label = part.lines().next().unwrap_or("?").trim();
        // "<test> <client> -> <server>"
        let words: Vec<&str> = label.split_whitespace().collect();
        let (test, client_name, server_name) = match words[..] {
            [t, c, "->", s] => (t, c, s),
            _ => (label, "?", "?"),
        };
        let (bw, unit) = if test.ends_with("-bw") {
            (true, "MB/s")
        } else {
            (false, "us")
        };
        let rcs = part.lines().find(|l| l.starts_with("client rc "));
        let out = |which: &str| side_output(part, which);
        let (cli, srv) = (figure(out("client"), bw), figure(out("server"), bw));
        let fine = rcs == Some("client rc 0, server rc 0") && cli.is_some();
        let fig = |name: &str, v: Option<f64>| match v {
            Some(v) if name == "ibv_rc_pingpong" => format!("{name} {v:.2} us per round trip"),
            Some(v) => format!("{name} {v:.2} {unit}"),
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

/// What a pairing's section of the log holds after its `--- client` or `--- server` line, up
/// to the next such line: that program's output.
pub(crate) fn side_output<'a>(part: &'a str, which: &str) -> &'a str {
    let start = part
        .find(&format!("--- {which}\n"))
        .map_or(part.len(), |i| i + 5 + which.len());
    let rest = &part[start.min(part.len())..];
    rest.find("--- ").map_or(rest, |e| &rest[..e])
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
        let bw_row = " 65536      2000           1071.23            1069.59              0.017113";
        let bw_json = "{\"test\":\"write_bw\",\"bw_peak_mb_s\":1100.000,\"bw_avg_mb_s\":1050.500}";
        let mut log = String::new();
        let rc_out =
            "2400 bytes in 0.02 seconds = 0.96 Mbit/sec\n300 iters in 0.02 seconds = 66.67 usec/iter";
        for (t, p, _, _, extra) in TESTS {
            let (j, r) = match (t.ends_with("-bw"), *p == "ibv_rc_pingpong") {
                (true, _) => (bw_json, bw_row),
                (false, true) => (json, rc_out),
                (false, false) => (json, row),
            };
            let ok = "client rc 0, server rc 0";
            log += &section(&format!("{t} {} -> {p}", me(extra)), ok, j, r);
            log += &section(&format!("{t} {p} -> {}", me(extra)), ok, r, j);
        }
        assert_eq!(figure(rc_out, false), Some(66.67));
        assert!(report(&log));
        assert_eq!(figure(json, false), Some(24.21));
        assert_eq!(figure(row, false), Some(24.05));
        assert_eq!(figure(bw_json, true), Some(1050.5));
        assert_eq!(figure(bw_row, true), Some(1069.59));
        // A hung server, a client without its figure, a pairing that never ran.
        let bad = log.replacen("client rc 0, server rc 0", "client rc 0, server rc 124", 1);
        assert!(!report(&bad));
        let bad = log.replacen(json, "bfperf: refused", 1);
        assert!(!report(&bad));
        let cut = log.rsplit_once("=== interop").unwrap().0.to_string();
        assert!(!report(&cut));
        assert!(script().matches("=== interop").count() == 2 * TESTS.len());
        // The stage's log: the bfperf -> bfperf pairings after these; each report reads its own.
        let stage = log.clone() + &crate::bfperf_pairs::tests::log();
        assert!(report(&stage));
        assert!(crate::bfperf_pairs::report(&stage));
        let cut = stage.replacen("client rc 0, server rc 0", "client rc 0, server rc 1", 1);
        assert!(!report(&cut));
    }
}
