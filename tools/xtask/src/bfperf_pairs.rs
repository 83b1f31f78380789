//! bfperf against bfperf on rxe0 across two processes (a `--server` in the background, a
//! `--client` to 10.77.0.1, as the perftest pairings of [`crate::interop`]): the options
//! whose two-process paths the software NIC cannot run (it lives in one process): `-q`,
//! `-b` (results swapped over TCP, both sides print the sum), `--mmap`, `--pin_cores`, a
//! latency test timed by `-D` (each side stopping on its own clock) and `-R` (the QPs
//! connected through rdma_cm on port 18516, the exchange on TCP 18515; and `-R` on one side
//! only, which both sides must refuse, naming it, instead of waiting).
//! Each pairing is one line of the rxe stage with each side's figure:
//! `interop write-bw -b bfperf -> bfperf: ok (client 39.20 MB/s, server 39.20 MB/s)`. A
//! pairing fails when either process fails or hangs (a timeout), the client prints no
//! figure, or (`-b`) the server prints none or another sum than the client's; a pairing
//! that must be refused fails unless both sides exit with 1 and say why (or, against
//! perftest's `-R` client, the bfperf server exits with 1 saying why and perftest fails).

use crate::compare::json_value;
use crate::interop::side_output;

/// One pairing: the test, the flags both sides take (its label), and each side's own.
struct Pair {
    test: &'static str,
    flags: &'static str,
    server: &'static str,
    client: &'static str,
    /// Non-empty: the pairing must be refused, both sides exiting with 1 and saying this.
    refused: &'static str,
    /// Non-empty: the client is this perftest command (to 10.77.0.1), not bfperf.
    perftest_client: &'static str,
}

/// The file `--mmap` maps (created by the script, in the VM's throw-away overlay).
const MMAP: &str = "/tmp/bfperf-pairs.mmap";

const fn pair(test: &'static str, flags: &'static str) -> Pair {
    Pair {
        test,
        flags,
        server: "",
        client: "",
        refused: "",
        perftest_client: "",
    }
}

/// The pairings (under emulation each takes 2 to 5 s in all, processes included, about
/// 100 s the twenty-one untimed ones, the perftest client's 3 s head start included, 4 s
/// more each timed (`-D 3`) one; a latency pairing up to 7 s when rxe's kernel work waits
/// for a tick behind the two busy-polling processes on the VM's two CPUs: 4 ms a round
/// trip).
const PAIRS: &[Pair] = &[
    pair("write-bw", "-q 2"),
    pair("read-bw", "-q 2"),
    pair("send-bw", "-q 2"),
    pair("write-bw", "-b"),
    pair("read-bw", "-b"),
    pair("send-bw", "-b"),
    pair("write-bw", "-q 2 -b"),
    pair("read-bw", "-q 2 -b"),
    pair("send-bw", "-q 2 -b"),
    // Two processes on one host that map one file's same bytes would each see the other's
    // writes in its own buffer (a latency test then waits for ever): the client's window
    // starts 1 MiB in.
    Pair {
        test: "write-lat",
        flags: "--mmap=FILE",
        server: "--mmap=/tmp/bfperf-pairs.mmap",
        client: "--mmap=/tmp/bfperf-pairs.mmap --mmap-offset=1048576",
        refused: "",
        perftest_client: "",
    },
    Pair {
        test: "write-bw",
        flags: "--mmap=FILE",
        server: "--mmap=/tmp/bfperf-pairs.mmap",
        client: "--mmap=/tmp/bfperf-pairs.mmap --mmap-offset=1048576",
        refused: "",
        perftest_client: "",
    },
    // The process's affinity set before the device. A bandwidth test: its server sleeps on
    // the TCP connection while the client sends, so both share CPU 0 and the VM's other CPU
    // stays free for rxe's kernel work (busy-polling latency sides pinned to both CPUs of
    // the VM starve it: milliseconds a round trip).
    pair("write-bw", "--pin_cores=0"),
    // A latency test timed by -D (perftest's duration mode): each side stops on its own
    // clock (the server's waits give up at its end); the client reports t_avg. 3 s each.
    pair("write-lat", "-D 3 -f 1"),
    pair("send-lat", "-D 3 -f 1"),
    // -R: the QPs created and connected through librdmacm (rdma_cm port 18516, --port + 1;
    // the server listens on any address, the client resolves rxe0's), the parameters,
    // sync and results on TCP 18515.
    pair("write-lat", "-R"),
    pair("send-lat", "-R"),
    pair("write-bw", "-R"),
    pair("read-bw", "-R"),
    pair("send-bw", "-R"),
    pair("write-bw", "-q 2 -R"),
    pair("read-bw", "-q 2 -b -R"),
    // -R on the client only: its parameter line says rdma_cm=true, the server's false;
    // both must stop, naming the difference (not wait for a connection that never comes).
    Pair {
        test: "write-lat",
        flags: "-R (client only)",
        server: "",
        client: "-R",
        refused: "rdma_cm: this side",
        perftest_client: "",
    },
    // perftest's -R client connects through rdma_cm to --port itself (bfperf's -R server
    // listens there too, to refuse it: bfperf's -R keeps its exchange on TCP), after the
    // server is up (perftest does not retry).
    Pair {
        test: "write-lat",
        flags: "-R (perftest -R client)",
        server: "-R",
        client: "",
        refused: "perftest's -R client connects",
        perftest_client: "sleep 3; timeout 60 ib_write_lat -R -F -d rxe0 -x $BLUEFLAME_GID_INDEX -s 8 -n 300 10.77.0.1",
    },
];

/// Seconds a program may take.
const LIMIT: u32 = 60;

impl Pair {
    fn bw(&self) -> bool {
        self.test.ends_with("-bw")
    }

    /// A timed run (`-D`): a latency test reports t_avg (no median).
    fn timed(&self) -> bool {
        self.flags.split(' ').any(|f| f == "-D")
    }

    /// Both sides measure and print the same sum (`-b`).
    fn both(&self) -> bool {
        self.flags.split(' ').any(|f| f == "-b")
    }

    fn label(&self) -> String {
        format!("{} {}", self.test, self.flags)
    }

    /// The flags both sides take: the label's, unless a side has its own.
    fn common(&self) -> &'static str {
        if self.server.is_empty() && self.client.is_empty() {
            self.flags
        } else {
            ""
        }
    }
}

/// The VM's commands (run from the repository's root, where bfperf's release build is). No
/// pause between server and client: a bfperf client dials again for 30 s until the server
/// listens.
pub fn script() -> String {
    let mut s = format!("truncate -s 4M {MMAP}; ");
    for p in PAIRS {
        // A warm-up of 100 (bfperf's default is 1000 a QP): under emulation the runs are
        // for whether the paths work, and each 1000 requests of 4 KiB cost about 0.3 s.
        let size = if p.bw() {
            "-s 4096 -n 1000 --warmup 100"
        } else {
            "-s 8 -n 300 --warmup 100"
        };
        let bf = |own: &str, role: &str| {
            let args = [p.test, "-d rxe0", size, p.common(), own, role, "--json"];
            let args: Vec<&str> = args.into_iter().filter(|a| !a.is_empty()).collect();
            format!("timeout {LIMIT} target/release/bfperf {}", args.join(" "))
        };
        let (server, mut client) = (bf(p.server, "--server"), bf(p.client, "--client 10.77.0.1"));
        if !p.perftest_client.is_empty() {
            client = p.perftest_client.to_string();
        }
        s.push_str(&format!(
            "echo '=== bfperf pair {label}'; \
             {server} > target/rxe/bp.srv 2>&1 & srv=$!; \
             {client} > target/rxe/bp.cli 2>&1; c=$?; wait $srv; s=$?; \
             echo \"client rc $c, server rc $s\"; \
             echo '--- client'; cat target/rxe/bp.cli; echo '--- server'; cat target/rxe/bp.srv; ",
            label = p.label()
        ));
    }
    s
}

/// Reads the pairings' sections of the stage's log; prints a line each. False when one
/// failed or did not run.
pub fn report(log: &str) -> bool {
    let mut ok = true;
    let sections: Vec<&str> = log.split("=== bfperf pair ").skip(1).collect();
    for part in &sections {
        let label = part.lines().next().unwrap_or("?").trim();
        let pair = PAIRS.iter().find(|p| p.label() == label);
        if let Some(p) = pair.filter(|p| !p.refused.is_empty()) {
            ok &= report_refusal(p, part);
            continue;
        }
        let (bw, both) = pair.map_or((label.contains("-bw"), false), |p| (p.bw(), p.both()));
        let (key, unit) = if bw {
            ("bw_avg_mb_s", "MB/s")
        } else if pair.is_some_and(Pair::timed) {
            ("t_avg_us", "us")
        } else {
            ("t_typical_us", "us")
        };
        let rcs = part.lines().find(|l| l.starts_with("client rc "));
        let out = |which: &str| side_output(part, which);
        let (cli, srv) = (
            json_value(out("client"), key),
            json_value(out("server"), key),
        );
        let agree = !both || (srv.is_some() && srv == cli);
        let fine =
            pair.is_some() && rcs == Some("client rc 0, server rc 0") && cli.is_some() && agree;
        let fig = |side: &str, v: Option<f64>| match v {
            Some(v) => format!("{side} {v:.2} {unit}"),
            None => format!("{side}: no figure (its side does not measure)"),
        };
        println!(
            "interop {label} bfperf -> bfperf: {} ({}, {})",
            if fine { "ok" } else { "FAILED" },
            fig("client", cli),
            fig("server", srv),
        );
        if !fine {
            println!(
                "  {}{}",
                rcs.unwrap_or("no exit codes: it did not finish"),
                if agree {
                    ""
                } else {
                    "; -b: the server's sum is not the client's"
                }
            );
            ok = false;
        }
    }
    if sections.len() != PAIRS.len() {
        eprintln!(
            "xtask: {} of {} bfperf -> bfperf pairings ran",
            sections.len(),
            PAIRS.len()
        );
        ok = false;
    }
    ok
}

/// The line of a pairing that must be refused ([`Pair::refused`]): fine when both sides
/// exited with 1 (not a timeout's 124: a wait) and both said why.
fn report_refusal(p: &Pair, part: &str) -> bool {
    let rcs = part.lines().find(|l| l.starts_with("client rc "));
    let said = |which: &str| side_output(part, which).contains(p.refused);
    let fine = if p.perftest_client.is_empty() {
        rcs == Some("client rc 1, server rc 1") && said("client") && said("server")
    } else {
        // perftest's own failure (not a timeout's 124: a wait), the server's refusal.
        let client_failed = rcs.and_then(|l| {
            l.strip_prefix("client rc ")?
                .split(',')
                .next()?
                .parse::<u32>()
                .ok()
        });
        matches!(client_failed, Some(c) if c != 0 && c != 124)
            && rcs.is_some_and(|l| l.ends_with(", server rc 1"))
            && said("server")
    };
    println!(
        "interop {} bfperf -> bfperf: {}",
        p.label(),
        if !fine {
            "FAILED".to_string()
        } else if p.perftest_client.is_empty() {
            format!("ok (refused on both sides: \"{}...\")", p.refused)
        } else {
            format!(
                "ok (the server refused it: \"{}...\"; perftest failed)",
                p.refused
            )
        }
    );
    if !fine {
        println!(
            "  {}; must be refused on both sides (exit 1) saying \"{}\" (client said it: {}, server: {})",
            rcs.unwrap_or("no exit codes: it did not finish"),
            p.refused,
            said("client"),
            said("server")
        );
    }
    fine
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn section(label: &str, rcs: &str, cli: &str, srv: &str) -> String {
        format!("=== bfperf pair {label}\n{rcs}\n--- client\n{cli}\n--- server\n{srv}\n")
    }

    const BW: &str = "{\"test\":\"write_bw\",\"bw_peak_mb_s\":1100.000,\"bw_avg_mb_s\":39.200}";

    /// A timed latency run's line (`-D`): t_avg, no median.
    const TIMED: &str = "{\"test\":\"write_lat\",\"iterations\":4000,\"t_avg_us\":125.000,\"tps_average\":4000.000,\"sample_s\":1.000000}";

    /// A log of every pairing passing (for the rxe stage's log of both kinds of pairing).
    pub(crate) fn log() -> String {
        let lat = "{\"test\":\"write_lat\",\"t_typical_us\":24.210,\"t_avg_us\":29.0}";
        let bw = BW;
        let header = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]";
        PAIRS
            .iter()
            .map(|p| {
                let ok = "client rc 0, server rc 0";
                if !p.refused.is_empty() {
                    let why = format!("bfperf: the peer runs another test: {} true", p.refused);
                    if !p.perftest_client.is_empty() {
                        let said = format!("bfperf: not supported: {} ...", p.refused);
                        let perftest = " Unable to perform rdma_client function";
                        return section(&p.label(), "client rc 1, server rc 1", perftest, &said);
                    }
                    return section(&p.label(), "client rc 1, server rc 1", &why, &why);
                }
                match (p.bw(), p.both()) {
                    (false, _) if p.timed() => section(&p.label(), ok, TIMED, ""),
                    (true, true) => section(&p.label(), ok, bw, bw),
                    (true, false) => section(&p.label(), ok, bw, header),
                    (false, _) => section(&p.label(), ok, lat, ""),
                }
            })
            .collect()
    }

    #[test]
    fn every_pairing_with_its_figures_or_a_failure() {
        let log = log();
        assert!(report(&log));
        // A hung server, a client without its figure, a pairing that never ran.
        let bad = log.replacen("client rc 0, server rc 0", "client rc 0, server rc 124", 1);
        assert!(!report(&bad));
        let bad = log.replacen("\"bw_avg_mb_s\":39.200", "\"bw\":0", 1);
        assert!(!report(&bad));
        let cut = log.rsplit_once("=== bfperf pair").unwrap().0.to_string();
        assert!(!report(&cut));
        // A timed latency pairing reports t_avg; without it, it fails.
        assert!(log.contains(TIMED));
        assert!(!report(&log.replace(TIMED, "{\"test\":\"write_lat\"}")));
        // A refusal that hung (a timeout), that one side did not say, or that ran.
        let r = "=== bfperf pair write-lat -R (client only)\nclient rc 1, server rc 1";
        assert!(log.contains(r));
        assert!(!report(
            &log.replace(r, &r.replace("server rc 1", "server rc 124"))
        ));
        assert!(!report(&log.replace(
            r,
            &r.replace("rc 1, server rc 1", "rc 0, server rc 0")
        )));
        let (head, tail) = log.split_once(r).unwrap();
        let tail = tail.replacen("rdma_cm: this side", "bfperf: failed", 1);
        assert!(!report(&format!("{head}{r}{tail}")));
        // perftest's -R client: the server must refuse it, saying so, and perftest fail.
        let r = "=== bfperf pair write-lat -R (perftest -R client)\nclient rc 1, server rc 1";
        assert!(log.contains(r));
        assert!(!report(
            &log.replace(r, &r.replace("server rc 1", "server rc 124"))
        ));
        assert!(!report(
            &log.replace(r, &r.replace("client rc 1", "client rc 124"))
        ));
        assert!(!report(
            &log.replace(r, &r.replace("client rc 1", "client rc 0"))
        ));
        assert!(!report(&log.replace(
            "bfperf: not supported: perftest's -R client connects",
            "bfperf: failed"
        )));
        // -b: a server without the sum, or with another one than the client's.
        let b = section("write-bw -b", "client rc 0, server rc 0", BW, BW);
        assert!(log.contains(&b));
        assert!(!report(&log.replace(
            &b,
            &section(
                "write-bw -b",
                "client rc 0, server rc 0",
                BW,
                "bfperf: failed"
            )
        )));
        assert!(!report(&log.replace(
            &b,
            &section(
                "write-bw -b",
                "client rc 0, server rc 0",
                BW,
                "{\"bw_avg_mb_s\":19.600}"
            )
        )));
    }

    /// Every pairing is a server in the background and a client to rxe0's address, both
    /// under a timeout, with its flags; the mmap pairings map distinct windows of one file.
    #[test]
    fn the_script_runs_each_pairing_across_two_processes() {
        let s = script();
        assert_eq!(s.matches("=== bfperf pair ").count(), PAIRS.len());
        assert_eq!(
            s.matches("--server --json > target/rxe/bp.srv 2>&1 & srv=$!")
                .count(),
            PAIRS.len()
        );
        assert_eq!(
            s.matches("--client 10.77.0.1 --json").count(),
            PAIRS.len() - 1
        );
        let perftest = PAIRS
            .iter()
            .filter(|p| !p.perftest_client.is_empty())
            .count();
        assert_eq!(perftest, 1);
        assert_eq!(
            s.matches("timeout 60 target/release/bfperf").count(),
            2 * PAIRS.len() - perftest
        );
        assert!(s.contains(
            "bfperf write-lat -d rxe0 -s 8 -n 300 --warmup 100 -R --server --json > target/rxe/bp.srv 2>&1 & srv=$!; sleep 3; timeout 60 ib_write_lat -R"
        ));
        assert!(s.starts_with(&format!("truncate -s 4M {MMAP}; ")));
        assert!(s.contains("bfperf write-bw -d rxe0 -s 4096 -n 1000 --warmup 100 -q 2 -b --server"));
        assert!(s.contains(
            "bfperf write-lat -d rxe0 -s 8 -n 300 --warmup 100 --mmap=/tmp/bfperf-pairs.mmap --mmap-offset=1048576 --client"
        ));
        assert!(s.contains(
            "bfperf write-bw -d rxe0 -s 4096 -n 1000 --warmup 100 -q 2 -R --client 10.77.0.1"
        ));
        // -R on the client only.
        assert!(s.contains("bfperf write-lat -d rxe0 -s 8 -n 300 --warmup 100 --server --json"));
        assert!(s.contains("bfperf write-lat -d rxe0 -s 8 -n 300 --warmup 100 -R --client"));
        for p in PAIRS {
            // Sides with flags of their own: both (mmap), or one in a refusal.
            assert!(
                p.server.is_empty() == p.client.is_empty() || !p.refused.is_empty(),
                "{}",
                p.label()
            );
            assert!(p.server.is_empty() || !p.server.contains(MMAP) || p.client.contains(MMAP));
        }
    }
}
