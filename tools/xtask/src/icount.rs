//! `cargo xtask icount`: instructions per operation of the direct path on the software NIC,
//! counted with callgrind (repeatable on a noisy machine), against regression guards.
//!
//! The guards are the figures the hot path had when they were last set, plus a small margin
//! (2026-11-27: post 64.4 -> 68, poll hit 63.1 -> 66, receive 115.3 -> 121, receive post
//! 131.5 -> 138, bursts 48.2 / 45.7 -> 52 / 50, compressed 54.4 / 40.0 -> 58 / 44;
//! 2026-11-28, the BlueFlame half kept as an address: post 62.7 -> 67, send and write with
//! immediate 80.8 -> 87 and 86, write of one buffer 83.6 -> 89, read 86.6 -> 93; a send
//! completion's cookie, byte count and opcode copied in one 16-byte move: poll hit 59.1 ->
//! 62, bursts 43.0 / 40.7 -> 46 / 44; 2026-11-28, stop 52: post 61.7 -> 66, the verbs
//! path's inline write leaving the caller nothing to keep across its call; receive post
//! 127.1 -> 131, the usual receive landing only in the last region): a
//! change that goes above one fails `cargo xtask test`. The ambition column is issue 29's
//! target for the row, with every guarantee kept; it is printed, not enforced.
//!
//! `bfperf icount-probe N` runs each operation through its own `#[inline(never)]` function;
//! callgrind collects only inside them (`--toggle-collect`), and the inclusive count of each
//! function divided by its calls is the cost of one operation.

use crate::shell::{root, run};
use std::process::Command;

/// (name, probe function, calls per iteration, operations per call, guard, ambition); a
/// row without a guard is measured and printed only. The burst rows run on one iteration in
/// `BURST_EVERY` (bfperf's `probe::BURST_EVERY`).
type Row = (
    &'static str,
    &'static str,
    f64,
    u64,
    Option<u64>,
    Option<u64>,
);

/// bfperf's `probe::BURST_EVERY`.
const BURST_EVERY: f64 = 8.0;

const OPS: &[Row] = &[
    (
        "post: 8-byte inline RDMA write + BlueFlame",
        "measured_post",
        1.0,
        1,
        Some(66),
        Some(55),
    ),
    (
        "poll: one CQE",
        "measured_poll_hit",
        2.0,
        1,
        Some(62),
        Some(45),
    ),
    ("poll: empty", "measured_poll_empty", 1.0, 1, Some(10), None),
    // The inline send and the read of one buffer (bfperf's send and read latency tests)
    // took the general path until they had fast paths of their own (`direct/one_block.rs`,
    // 2026-11-27): 351.5 and 393.1 before; 154.0 and 147.2 with the fast paths in
    // `Qp::post`'s out-of-line direct arm; 81.8 and 87.7 tried inline in `Qp::post` and
    // `Qp::read` (their frame is the verbs path's, which is unchanged), when the guards
    // were set; the send 74.8 once `Qp::post`'s out-of-line arms took the request by value
    // (stop 52), when its guard was lowered.
    (
        "post: 8-byte inline send + BlueFlame",
        "measured_post_send",
        1.0,
        1,
        Some(80),
        None,
    ),
    // A write of one registered buffer (a message over the inline limit): 398.2 through
    // the general path; 90.6 through the fast path of one entry (`try_one_entry`), when the
    // guard was set; 91.6 (2026-11-28), 84.6 once a post before `connect` became a plain
    // refusal (the one-sided connect: `Qp::post`'s cold check no longer asks the backend
    // and marks the QP connected), when the guard was lowered; 77.5 with the request by
    // value to the out-of-line arms (stop 52), when it was lowered again.
    (
        "post: 64-byte RDMA write, one buffer",
        "measured_post_write_sge",
        1.0,
        1,
        Some(82),
        None,
    ),
    // An inline write with immediate took the general path (375.6) until the one-block
    // fast paths took writes and sends with an immediate too: 88.8 when the guard was set
    // (2026-11-27); 81.8 with the one-sided connect's plain refusal (as the write of one
    // buffer), when it was lowered (2026-11-28); 73.8 with the request by value to the
    // out-of-line arms (stop 52), when it was lowered again.
    (
        "post: 8-byte inline RDMA write with immediate",
        "measured_post_write_imm",
        1.0,
        1,
        Some(78),
        None,
    ),
    (
        "post: 8-byte RDMA read, one buffer",
        "measured_post_read",
        1.0,
        1,
        Some(93),
        None,
    ),
    // A receive of the QP whose receive completed last takes the fast path's
    // `poll_recv` (293 through the general path before; 165.2 before its quick copy of
    // whole words; 133.2 with the other receives' status computed in the same function,
    // which then saved six registers, and the copy a loop; 118.3 with those receives in
    // `poll_recv_other` and the copy word after word, when the guard was set; 115.3 once
    // `poll_some` saved no register before handing receives on; issue 29's target 120).
    (
        "poll: one 8-byte receive (copy from the CQE)",
        "measured_poll_recv",
        1.0,
        1,
        Some(121),
        Some(120),
    ),
    // A receive of one entry takes the receive queue's fast path while its cached room
    // lasts (201.8 through the general path, with the room and the CQ's allowance checked
    // at every post and the list encoded in a loop; 150.3 with the fast path out of line;
    // 131.5 inlined at the call site, when the guard was set; 127.1 landing only in the
    // region the last receive landed in, when it was lowered).
    (
        "post receive: one 64-byte buffer",
        "measured_post_recv",
        1.0,
        1,
        Some(131),
        None,
    ),
    // A batch parks the ringing fast paths while it is open, so that one forgotten
    // (`mem::forget`) leaves none to ring a block alone past its WQEs (a review's finding,
    // 2026-11-27): 61.9 -> 62.5 (62.8 at 34275b3, the compiled code moved), the guard 62 -> 63.
    // The shadow entry's last four bytes in one store (`SendEntry::tail`): 62.4 -> 60.5,
    // the guard 63 -> 62.
    (
        "post: per WQE in a batch of 32",
        "measured_batch32",
        1.0,
        32,
        Some(62),
        Some(45),
    ),
    // The post of `measured_post` on a shared BlueFlame register: the same WQE, rung under
    // the register's spin lock (377 through the general path before it had a fast path of
    // its own; 179 with that fast path in the cold function; 76.5 inlined beside the
    // dedicated one, when the guard was set; issue 29's target 110).
    (
        "post: the same, shared register (locked)",
        "measured_post_shared",
        1.0,
        1,
        Some(82),
        Some(110),
    ),
    // Per completion, polled in bursts of one QP's writes (one poll call each): a plain CQ
    // (the fast path's burst loop: one consumer-index store and one retirement per burst;
    // 107 per CQE through the general path before; 52.3 and 49.8 with the queue-list
    // generation read again for each entry; 48.2 and 45.7 with one owner-byte load for
    // both checks; 43.0 and 40.7 with each completion's head copied in one move, when the
    // guards were set; issue 29's target 50) and a compressed one (one
    // session per burst: 94.7 and 82.9 before the requester loop of its own and the
    // invalidation in runs; 54.4 and 40.0 when the guards were set; issue 29's target 40
    // for sessions of 64).
    (
        "poll: per CQE, burst of 16, plain CQ",
        "measured_poll_burst16",
        1.0 / BURST_EVERY,
        16,
        Some(46),
        Some(50),
    ),
    (
        "poll: per CQE, burst of 64, plain CQ",
        "measured_poll_burst64",
        1.0 / BURST_EVERY,
        64,
        Some(44),
        Some(50),
    ),
    (
        "poll: per CQE, burst of 16, compressed CQE",
        "measured_poll_zip16",
        1.0 / BURST_EVERY,
        16,
        Some(58),
        None,
    ),
    (
        "poll: per CQE, burst of 64, compressed CQE",
        "measured_poll_zip64",
        1.0 / BURST_EVERY,
        64,
        Some(44),
        Some(40),
    ),
];

const ITERS: u64 = 2000;

/// Runs the probe under callgrind and prints the table; false when a guard is exceeded or
/// the measurement failed.
pub fn main() -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !run(
        "build bfperf",
        Command::new(&cargo).args(["build", "--release", "--locked", "-q", "-p", "bfperf"]),
    ) {
        return false;
    }
    let bin = root().join("target/release/bfperf");
    let mut pass = true;
    println!(
        "{:<46} {:>12} {:>8} {:>8} {:>8}",
        "operation", "instructions", "guard", "ambition", ""
    );
    for &(name, func, calls, per_call, guard, ambition) in OPS {
        // One run per function: callgrind collects only inside it, and its summary line
        // "Collected : N" is the inclusive count.
        let out = root().join(format!("target/callgrind.{func}"));
        let Ok(o) = Command::new("valgrind")
            .args([
                "--tool=callgrind",
                &format!("--toggle-collect=bfperf::probe::{func}"),
            ])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&bin)
            .args(["icount-probe", &ITERS.to_string()])
            .output()
        else {
            eprintln!("xtask: valgrind not found (install valgrind)");
            return false;
        };
        let text = String::from_utf8_lossy(&o.stderr);
        // A probe that failed (an assertion of its own, a refused post) counted a part of
        // the work only: its figures would pass any guard.
        if !o.status.success() {
            eprintln!(
                "xtask: FAILED: the probe did not finish ({}):\n{text}",
                o.status
            );
            return false;
        }
        let total = text.lines().find_map(|l| {
            let v = l.split("Collected :").nth(1)?;
            v.trim().replace(',', "").parse::<u64>().ok()
        });
        // `--toggle-collect` that matches no function (renamed, or inlined away) collects
        // nothing: "Collected : 0", 0.0 a call, under any guard.
        let Some(total) = total.filter(|&t| t > 0) else {
            eprintln!("xtask: FAILED: no count for {func} (is bfperf::probe::{func} still a function of its own?):\n{text}");
            pass = false;
            continue;
        };
        let per_op = total as f64 / (ITERS as f64 * calls * per_call as f64);
        let ambition = ambition.map_or_else(|| "-".to_string(), |a| a.to_string());
        let Some(guard) = guard else {
            println!(
                "{name:<46} {per_op:>12.1} {:>8} {ambition:>8} {:>8}",
                "-", ""
            );
            continue;
        };
        let ok = per_op <= guard as f64;
        pass &= ok;
        println!(
            "{name:<46} {per_op:>12.1} {guard:>8} {ambition:>8} {:>8}",
            if ok { "ok" } else { "OVER" }
        );
    }
    println!("(callgrind, {ITERS} iterations of target/release/bfperf icount-probe)");
    // The same operations on the production route, beside rdma-core's libmlx5; then the
    // verbs path over libmlx5 (a report).
    pass & crate::peer_icount::main(&cargo, &bin) & crate::peer_icount::verbs(&bin)
}
