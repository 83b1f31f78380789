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
//! The guards are the figures measured when they were set plus about 10% (Debian 12's
//! rdma-core 44 and kernel 6.1; issue 19's trimmed path: post 370 legacy / 329 extended,
//! poll hit 206 / 153, receive post 233 / 233, receive poll 210 / 234; plain rdma-core
//! 236 / 237, 87 / 80, 138; before the trim the guards were 445 / 405, 250 / 220, 255,
//! 250 / 285; the receive post's and receive poll's, 250 / 250 and 225 / 255 until the
//! receive trim's 199 / 199 and 202 / 233; the send trim's: inline write 363 / 318, inline
//! send 302 / 254, read 295 / 251, poll hit 158 / 148, whose guards were 410 / 365 and
//! 225 / 170 before it); the device stage of `cargo xtask test` runs the same commands in
//! its one VM boot ([`script`], [`report`]). Issue 25's region pins (a receive pins the
//! region it lands in, one atomic step against the region's drop, and its completion gives
//! the pin back) cost the receive post 199 -> 272.7 and the receive poll 202 / 233 -> 225.1
//! / 255.1: their guards 215 -> 285 and 218 / 250 -> 235 / 265. Issue 29's poll, its
//! one-completion and general paths apart (2026-11-27): poll hit 152 / 148 -> 136 / 134,
//! receive poll 225 / 255 -> 219 / 249; the poll hit's guards 175 / 165 -> 150 / 148. The
//! plain inline send and read counted beside the crate's since (232 / 231, 219 / 224); the
//! read posted from its parts 294 / 252 -> 288 / 248; the extended send's and read's guards
//! 280 -> 270. The extended poll's usual completion inline and any other out of line
//! (2026-11-27): poll hit 134 -> 128, its guard 148 -> 140; the straight-post condition
//! written once: read 248.5 -> 247.5; the receive post inlined at the call site beside the
//! direct path's (one frame instead of two): 273.8 -> 252.5, its guards 285 -> 275. The
//! write and the send with immediate posted straight (`Single`, 2026-11-27), in a frame of
//! their own (inlined, they cost the direct path's one-buffer write and write with
//! immediate 3 instructions each): a row of its own, the 8-byte inline write with
//! immediate, 372.3 / 343.3 (guards 400 / 370; 310.5 / 276.5 inlined; through the queued
//! path it cost 756 on libmlx5's extended API, 458.3 straight). Issue 29 (2026-11-28):
//! the one-completion poll with the first queue's number and shadow cached, the orphan mark
//! read only on an empty poll, a one-slot poll told apart at the call site: 136 / 128 ->
//! 117.0 / 107.9, guards 150 / 140 -> 128 / 118; the usual receive pinning the region the
//! last one found: 252.5 -> 216.9, guards 275 -> 240. Then (stop 50): the one-completion
//! poll through a function chosen at creation, its status and `wr_id` read before the QP
//! number, its send entry through a cached ring, the send completion's head in one move:
//! 116.4 / 108.3 -> 111.4 / 102.3 (+22.3 over `ibv_start_poll`: issue 29's bound met),
//! guards 128 / 118 -> 118 / 108; the receive post handing the caller's entry to the
//! provider as its list, one index for shadow and scatter, a one-sum range test, the hot
//! region copied into the queue: 216.9 -> 201.2, guards 240 -> 212; the inline write set
//! up before `ibv_wr_start`, one frame per usual flags: 353.2 / 307.2 -> 335 / 286, guards
//! 370 / 330 -> 350 / 300; the send 300.5 / 255.5 -> 298.5 / 253.5 and the read 287.5 /
//! 248.5 -> 287.5 / 246.5, guards 335 / 270 -> 315 / 265 and 325 / 270 -> 305 / 260.
//! Stop 51: each request's `wr_id` carries its queue's incarnation (the QP-number reuse
//! fix), the usual completion attributed by it alone (no QP number read): the poll 111.4 /
//! 102.3 -> 111.4 / 98.3, its extended guard 108 -> 104; the posts +1 (the tag or'd in:
//! write 336 / 287, send 299.5 / 254.5, read 288.5 / 247.5), the receive poll 227.1 / 259.1
//! -> 228.2 / 258.2. Stop 52: the inline write's frame takes its arguments in registers and
//! gives its outcome in one (a refusal's error kept in the QP, the QP returned): 336 / 287
//! -> 309.9 / 269.9, guards 350 / 300 -> 330 / 285; `Qp::post`'s out-of-line arms taking
//! the request by value (no post writes it out before its first check): the send 299.5 /
//! 254.5 -> 295.5 / 250.5, guards 315 / 265 -> 310 / 260, the inline write with immediate
//! 366.3 / 335.3 -> 359.3 / 328.3, guards 400 / 370 -> 380 / 350.

use crate::shell::{root, run};
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
pub(crate) type Row = (
    &'static str,
    &'static str,
    [u64; 2],
    [Option<&'static str>; 2],
);

pub(crate) const ROWS: &[Row] = &[
    (
        "post: 8-byte inline RDMA write",
        "measured_verbs_post",
        [330, 285],
        [
            Some("measured_plain_post_send"),
            Some("measured_plain_post_wr"),
        ],
    ),
    (
        "post: 8-byte inline send",
        "measured_verbs_post_send",
        [310, 260],
        [
            Some("measured_plain_post_send_inline"),
            Some("measured_plain_post_wr_send"),
        ],
    ),
    (
        "post: 8-byte RDMA read, one buffer",
        "measured_verbs_post_read",
        [305, 260],
        [
            Some("measured_plain_post_read"),
            Some("measured_plain_post_wr_read"),
        ],
    ),
    (
        "post: 8-byte inline write with imm",
        "measured_verbs_post_write_imm",
        [380, 350],
        [None, None],
    ),
    (
        "poll: one completion",
        "measured_verbs_poll_hit",
        [118, 104],
        [
            Some("measured_plain_poll_cq"),
            Some("measured_plain_start_poll"),
        ],
    ),
    (
        "post receive: one 64-byte buffer",
        "measured_verbs_post_recv",
        [212, 212],
        [
            Some("measured_plain_post_recv"),
            Some("measured_plain_post_recv"),
        ],
    ),
    (
        "poll: one 8-byte receive",
        "measured_verbs_poll_recv",
        [235, 265],
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

/// Inclusive instruction counts per `measured_*` function, read from callgrind's output
/// format: a function's inclusive count is the sum of every cost line in its blocks (its own
/// instructions, wherever inlined code came from, and after each `calls=` line the
/// inclusive cost of that call). `callgrind_annotate` splits a function by the source file
/// of its inlined code, so its lines are not whole functions.
pub(crate) fn inclusive(text: &str) -> BTreeMap<String, u64> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut m = BTreeMap::new();
    // The function whose block the cost lines belong to, when it is a measured one.
    let mut current: Option<String> = None;
    // `fn=(id) name` names the id; `fn=(id)` refers to it (name compression).
    let mut name_of = |spec: &str| -> String {
        let spec = spec.trim();
        match spec.strip_prefix('(').and_then(|r| r.split_once(')')) {
            Some((id, rest)) if !rest.trim().is_empty() => {
                names.insert(id.to_owned(), rest.trim().to_owned());
                rest.trim().to_owned()
            }
            Some((id, _)) => names.get(id).cloned().unwrap_or_default(),
            None => spec.to_owned(),
        }
    };
    for line in text.lines() {
        if let Some(spec) = line.strip_prefix("fn=") {
            let name = name_of(spec);
            current = name
                .rsplit("::")
                .next()
                .filter(|f| f.starts_with("measured_"))
                .map(str::to_owned);
        } else if let Some(spec) = line.strip_prefix("cfn=") {
            name_of(spec);
        } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
            let (Some(f), Some(cost)) = (&current, line.split_whitespace().nth(1)) else {
                continue;
            };
            if let Ok(c) = cost.parse::<u64>() {
                *m.entry(f.clone()).or_insert(0) += c;
            }
        }
    }
    m
}

/// The probe's `calls NAME N` lines.
pub(crate) fn calls(text: &str) -> BTreeMap<String, u64> {
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
    let inc = inclusive(&std::fs::read_to_string(dir.join(format!("icount.{api}.cg"))).ok()?);
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
    if crate::vm::run_in_vm(&script(), crate::vm::STAGE_SECS).is_none() {
        return false;
    }
    report()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measured function's count is its own cost lines plus the inclusive cost of its
    /// calls, whichever file its inlined lines came from; other functions are not counted.
    #[test]
    fn sums_a_functions_blocks() {
        let cg = "events: Ir\nfl=(1) a.rs\nfn=(7) bfperf::probe_verbs::measured_x\n3 10\n+1 5\n\
                  fi=(2) b.rs\n9 2\ncfn=(8) blueflame::inner\ncalls=300 4\n* 1000\n\
                  fn=(8)\n4 999\nfn=(7)\n5 3\n";
        let m = inclusive(cg);
        assert_eq!(m.get("measured_x"), Some(&(10 + 5 + 2 + 1000 + 3)));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn parses_the_probe_calls() {
        let c =
            calls("calls measured_verbs_post 300\ncalls measured_verbs_poll_hit 301\nmisses 1\n");
        assert_eq!(c.get("measured_verbs_post"), Some(&300));
        assert_eq!(c.get("measured_verbs_poll_hit"), Some(&301));
        assert_eq!(c.len(), 2);
    }
}
