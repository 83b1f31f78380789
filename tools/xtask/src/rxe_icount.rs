//! `cargo xtask rxe-icount`: instructions per operation of the verbs path on rxe, counted
//! with callgrind inside the rxe VM, for each rdma-core API the path can run
//! (`BLUEFLAME_VERBS_API=legacy`: `ibv_post_send` / `ibv_poll_cq`; `extended`: `ibv_wr_*` /
//! `ibv_start_poll`), beside the same operations as plain rdma-core calls, against
//! regression guards.
//!
//! `bfperf icount-verbs N` runs each operation through its own `#[inline(never)]` function
//! (`measured_*`); one callgrind run per API collects inside all of them
//! (`--toggle-collect='*measured_*'`), `callgrind_annotate --inclusive=yes` gives each
//! function's inclusive count, and the probe prints how many times it called each one.
//! Counts are user-space instructions (the kernel part of rxe's doorbell system call is not
//! counted).
//!
//! The guards are the figures measured when they were set plus a margin; the device stage of
//! `cargo xtask test` runs the same commands in its one VM boot ([`script`], [`report`]).

use crate::{root, run};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Iterations of the probe under callgrind (each one pauses for the device).
const ITERS: u32 = 300;

/// The APIs counted: (value of BLUEFLAME_VERBS_API, label).
const APIS: &[(&str, &str)] = &[
    ("legacy", "ibv_post_send/ibv_poll_cq"),
    ("extended", "ibv_wr_*/ibv_start_poll"),
];

/// (operation, the crate's probe function, guard per API [legacy, extended], the plain
/// rdma-core functions [legacy, extended]).
type Row = (
    &'static str,
    &'static str,
    [u64; 2],
    [Option<&'static str>; 2],
);

const ROWS: &[Row] = &[
    (
        "post: 8-byte inline RDMA write",
        "measured_verbs_post",
        [0, 0],
        [
            Some("measured_plain_post_send"),
            Some("measured_plain_post_wr"),
        ],
    ),
    (
        "poll: one completion",
        "measured_verbs_poll_hit",
        [0, 0],
        [
            Some("measured_plain_poll_cq"),
            Some("measured_plain_start_poll"),
        ],
    ),
    (
        "post receive: one 64-byte buffer",
        "measured_verbs_post_recv",
        [0, 0],
        [
            Some("measured_plain_post_recv"),
            Some("measured_plain_post_recv"),
        ],
    ),
    (
        "poll: one 8-byte receive",
        "measured_verbs_poll_recv",
        [0, 0],
        [None, None],
    ),
];

/// The commands run inside the VM (from the workspace root, `target/rxe` writable): one
/// callgrind run of the probe per API.
pub fn script() -> String {
    let mut s = String::new();
    for (api, _) in APIS {
        s.push_str(&format!(
            "BLUEFLAME_VERBS_API={api} timeout 900 valgrind --tool=callgrind \
             '--toggle-collect=*measured_*' --callgrind-out-file=target/rxe/icount.{api}.cg \
             target/release/bfperf icount-verbs {ITERS} > target/rxe/icount.{api}.calls \
             2> target/rxe/icount.{api}.log; "
        ));
    }
    s
}

/// Inclusive instruction counts per `measured_*` function of a callgrind output file.
fn inclusive(cg: &Path) -> Option<BTreeMap<String, u64>> {
    let out = Command::new("callgrind_annotate")
        .arg("--inclusive=yes")
        .arg("--threshold=100")
        .arg(cg)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some(at) = line.find("measured_") else {
            continue;
        };
        let name: String = line[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let count = line
            .split_whitespace()
            .next()
            .and_then(|v| v.replace(',', "").parse::<u64>().ok());
        if let Some(c) = count {
            let e = m.entry(name).or_insert(0);
            *e = (*e).max(c);
        }
    }
    Some(m)
}

/// The probe's `calls NAME N` lines.
fn calls(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == "calls").then_some(())?;
            Some((f.next()?.to_owned(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// Per-call counts of one API's run, by function; None when the run left no result.
fn per_call(dir: &Path, api: &str) -> Option<BTreeMap<String, f64>> {
    let text = std::fs::read_to_string(dir.join(format!("icount.{api}.calls"))).ok()?;
    let n = calls(&text);
    let inc = inclusive(&dir.join(format!("icount.{api}.cg")))?;
    let m: BTreeMap<String, f64> = inc
        .iter()
        .filter_map(|(f, total)| Some((f.clone(), *total as f64 / *n.get(f)? as f64)))
        .collect();
    (!m.is_empty()).then_some(m)
}

/// Prints the table from the files the VM left in `target/rxe`; false when a count is
/// missing or above its guard.
pub fn report() -> bool {
    let dir = root().join("target/rxe");
    let mut pass = true;
    let mut runs = Vec::new();
    for (api, _) in APIS {
        match per_call(&dir, api) {
            Some(m) => runs.push(m),
            None => {
                eprintln!(
                    "xtask: no instruction counts for BLUEFLAME_VERBS_API={api}:\n{}",
                    std::fs::read_to_string(dir.join(format!("icount.{api}.log")))
                        .unwrap_or_default()
                );
                return false;
            }
        }
    }
    println!(
        "{:<34} {:<26} {:>9} {:>7} {:>9} {:>6}",
        "verbs path on rxe0 (callgrind)", "API", "blueflame", "guard", "plain", ""
    );
    for &(op, func, guards, plain) in ROWS {
        for (k, (_, label)) in APIS.iter().enumerate() {
            let Some(v) = runs[k].get(func).copied() else {
                eprintln!("xtask: no count for {func} ({label})");
                pass = false;
                continue;
            };
            let base = plain[k]
                .and_then(|p| runs[k].get(p))
                .map_or("-".to_string(), |b| format!("{b:.1}"));
            let ok = v <= guards[k] as f64;
            pass &= ok;
            println!(
                "{:<34} {label:<26} {v:>9.1} {:>7} {base:>9} {:>6}",
                if k == 0 { op } else { "" },
                guards[k],
                if ok { "ok" } else { "OVER" }
            );
        }
    }
    println!(
        "(user-space instructions per operation, callgrind in the rxe VM, {ITERS} iterations of \
         bfperf icount-verbs; plain = the same operation as bare rdma-core calls)"
    );
    pass
}

/// `cargo xtask rxe-icount [--report]`: builds bfperf, boots the VM once, prints the table;
/// with `--report`, only prints the table of the files the last boot left.
pub fn main(args: &[String]) -> bool {
    if args.iter().any(|a| a == "--report") {
        return report();
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !run(
        "build bfperf",
        Command::new(&cargo).args(["build", "--release", "--locked", "-q", "-p", "bfperf"]),
    ) {
        return false;
    }
    if crate::rxe::run_in_vm(&script()).is_none() {
        return false;
    }
    report()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_probe_calls() {
        let c =
            calls("calls measured_verbs_post 300\ncalls measured_verbs_poll_hit 301\nmisses 1\n");
        assert_eq!(c.get("measured_verbs_post"), Some(&300));
        assert_eq!(c.get("measured_verbs_poll_hit"), Some(&301));
        assert_eq!(c.len(), 2);
    }
}
