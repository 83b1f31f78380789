//! The second table of `cargo xtask icount`: the production route and rdma-core's own
//! provider, counted on this machine.
//!
//! `bfperf icount-verbs` (the probe of `cargo xtask rxe-icount`) runs with the kernel model
//! preloaded (`tools/kernel-model`, as the provider stage): Debian's unmodified libibverbs
//! and libmlx5 find a ConnectX-6 named `mlx5_0` and create every object, the crate takes its
//! QP and CQ over with `mlx5dv_init_obj` (the direct path, as on a ConnectX), and the probe's
//! plain pair posts and polls through libmlx5 itself (`mlx5_post_send`, the `ibv_wr_*`
//! functions, `mlx5_poll_cq`, `ibv_start_poll`, `mlx5_post_recv`). One callgrind run collects
//! inside every `measured_*` function; each row is the crate's operation on the production
//! route beside the same operation as bare rdma-core calls, instructions per call.
//!
//! The crate's figures are gated ([`GUARDS`]); rdma-core's are printed: they are the peer
//! the direct path is measured against (its post and poll run the same instructions on a
//! ConnectX: only the device behind the doorbell differs).

use crate::rxe_icount::{calls, inclusive, ROWS};
use crate::shell::root;
use std::path::Path;
use std::process::Command;

/// Iterations of the probe (each one waits for the software NIC).
const ITERS: u32 = 300;

/// The crate's guard per row of [`ROWS`] on the production route, in its order (its length
/// is `ROWS`'s: a row added there does not compile until it has a guard here): the figures
/// of 2026-11-27 plus a margin (inline write 76.6, send 94.0, read 99.7, inline write with
/// immediate 101.6, poll 64.9, receive post 142.6, receive poll 117.2; the inline write
/// with immediate 94.7 and its guard lowered on 2026-11-28, with the one-sided connect's
/// plain refusal before `connect`; the posts one instruction less each and their guards
/// lowered on 2026-11-28, the BlueFlame half kept as an address: 75.6, 92.3, 98.0, 93.7;
/// the poll 64.9 -> 60.9 and its guard 70 -> 64 on 2026-11-28, a send completion's cookie,
/// byte count and opcode copied in one 16-byte move; the receive post 144.7 -> 142.6 and
/// its guard 150 -> 148 on 2026-11-28 (stop 50), with the verbs path's usual receive,
/// which shares its call site; on 2026-11-28, stop 52, the inline write 75.3 -> 74.4 and
/// its guard 81 -> 79, the verbs path's inline write leaving the caller nothing to keep
/// across its call, and the receive post 142.6 -> 135.8 and its guard 148 -> 141, the
/// usual receive landing only in the region the last one landed in; the send 89.8 -> 85.9
/// and the inline write with immediate 93.2 -> 86.4, their guards 99 -> 91, `Qp::post`'s
/// out-of-line arms taking the request by value). The probe's CQs
/// have 64 entries, so every few posts a queue's CQ allowance is spent and taken again out
/// of line (`SendQueue::refill_room`): that share is in these figures, not in
/// `cargo xtask icount`'s first table (CQs of 1024).
const GUARDS: [u64; ROWS.len()] = [79, 91, 105, 91, 64, 141, 124];

/// UCX's figures per row of [`ROWS`], recorded (not measured by this command):
/// `tools/ucx-probe/run.sh` counts UCX 1.13.1's `uct_ep_put_short` of 8 bytes on `rc_mlx5`
/// (an inline RDMA write, BlueFlame) and the `uct_worker_progress` that reaps its completion,
/// on the same kernel model, 2026-11-27: Debian's libucx0 (assertions and parameter checks
/// built in) / the same version built with upstream's release flags (`RELEASE=1`).
const UCX: [&str; ROWS.len()] = ["270 / 158", "-", "-", "-", "146 / 115", "-", "-"];

/// Builds the kernel model, runs the probe under callgrind with it preloaded and prints the
/// table; false when the run failed or a figure of the crate is above its guard.
pub(crate) fn main(cargo: &str, bin: &Path) -> bool {
    if !crate::provider::build_model(cargo) {
        return false;
    }
    let lib = root().join("target/debug/libkernel_model.so");
    let cg = root().join("target/callgrind.production");
    let Some(out) = settled(bin, &lib, &cg, None, "the production-route probe") else {
        return false;
    };
    let n = calls(&out);
    let inc = inclusive(&std::fs::read_to_string(&cg).unwrap_or_default());
    let per = |f: &str| Some(*inc.get(f)? as f64 / *n.get(f)? as f64);
    println!(
        "\n{:<34} {:>9} {:>7} {:>14} {:>9} {:>12} {:>6}",
        "production route (libmlx5, mlx5_0)",
        "blueflame",
        "guard",
        "ibv_post_send",
        "ibv_wr_*",
        "UCX rc_mlx5",
        ""
    );
    let mut pass = true;
    for ((&(op, func, _, plain), guard), ucx) in ROWS.iter().zip(GUARDS).zip(UCX) {
        let Some(v) = per(func) else {
            eprintln!("xtask: FAILED: no count for {func} on the production route");
            pass = false;
            continue;
        };
        let peer = |p: Option<&str>| p.and_then(per).map_or("-".into(), |b| format!("{b:.1}"));
        let ok = v <= guard as f64;
        pass &= ok;
        println!(
            "{op:<34} {v:>9.1} {guard:>7} {:>14} {:>9} {ucx:>12} {:>6}",
            peer(plain[0]),
            peer(plain[1]),
            if ok { "ok" } else { "OVER" }
        );
    }
    println!(
        "(callgrind, {ITERS} iterations of bfperf icount-verbs with the kernel model: the crate \
         on QPs libmlx5 created, beside libmlx5's own calls; the poll columns are ibv_poll_cq \
         and ibv_start_poll, the receive post's ibv_post_recv; UCX recorded by \
         tools/ucx-probe/run.sh: put_short and the progress that reaps it, Debian's build / a \
         release build)"
    );
    pass
}

/// The verbs path on libmlx5 (`BLUEFLAME_PATH=verbs`, each rdma-core API), beside the plain
/// rdma-core calls it wraps, per row of `cargo xtask rxe-icount` ([`crate::rxe_icount::ROWS`]):
/// issue 29's measure (at most 25 over the plain call on the extended API) on this machine,
/// without the rxe VM. A report, not a gate (rxe's guards are `rxe-icount`'s); false only
/// when a run failed.
pub(crate) fn verbs(bin: &Path) -> bool {
    let lib = root().join("target/debug/libkernel_model.so");
    let cg = root().join("target/callgrind.verbs");
    println!(
        "\n{:<34} {:>17} {:>17} {:>14}",
        "verbs path on libmlx5 (mlx5_0)", "blueflame", "plain rdma-core", "over by"
    );
    let mut figures: Vec<[Option<Figure>; 2]> = vec![[None, None]; ROWS.len()];
    for (k, api) in ["legacy", "extended"].into_iter().enumerate() {
        let what = format!("the verbs-path probe ({api} API)");
        let Some(out) = settled(bin, &lib, &cg, Some(api), &what) else {
            return false;
        };
        let n = calls(&out);
        let inc = inclusive(&std::fs::read_to_string(&cg).unwrap_or_default());
        let per = |f: &str| Some(*inc.get(f)? as f64 / *n.get(f)? as f64);
        for (row, fig) in ROWS.iter().zip(figures.iter_mut()) {
            fig[k] = per(row.1).map(|v| (v, row.3[k].and_then(per)));
        }
    }
    let show = |f: Option<Figure>, plain: bool| match (f, plain) {
        (Some((v, _)), false) => format!("{v:.1}"),
        (Some((_, Some(p))), true) => format!("{p:.1}"),
        _ => "-".into(),
    };
    for (row, [legacy, extended]) in ROWS.iter().zip(figures) {
        let over = match extended {
            Some((v, Some(p))) => format!("{:.1}", v - p),
            _ => "-".into(),
        };
        println!(
            "{:<34} {:>17} {:>17} {over:>14}",
            row.0,
            format!("{} / {}", show(extended, false), show(legacy, false)),
            format!("{} / {}", show(extended, true), show(legacy, true)),
        );
    }
    println!(
        "(callgrind, {ITERS} iterations of bfperf icount-verbs with BLUEFLAME_PATH=verbs and the \
         kernel model: the crate's verbs path over libmlx5, extended / classic API, beside the \
         plain rdma-core calls; \"over by\" on the extended API, issue 29's bound 25; rxe's \
         figures and guards: cargo xtask rxe-icount)"
    );
    true
}

/// The crate's count of one operation and the plain rdma-core call's, where it has one.
type Figure = (f64, Option<f64>);

/// The empty polls a probe's output reports (`misses N`); u32::MAX when it reports none.
fn misses(out: &str) -> u32 {
    out.lines()
        .find_map(|l| l.strip_prefix("misses ")?.trim().parse::<u32>().ok())
        .unwrap_or(u32::MAX)
}

/// [`probe_with`] until a run polled empty at most once in a hundred iterations: a poll
/// that found nothing yet (the software NIC runs in a thread of its own, which callgrind
/// serialises) is counted with the hits and makes their average look cheaper (the crate's
/// and the plain calls' alike). Three runs at most; None (said why) when none was.
fn settled(bin: &Path, lib: &Path, cg: &Path, api: Option<&str>, what: &str) -> Option<String> {
    for attempt in 1..=3 {
        let out = probe_with(bin, lib, cg, api)?;
        let m = misses(&out);
        if m <= ITERS / 100 {
            return Some(out);
        }
        if attempt == 3 {
            eprintln!("xtask: FAILED: {m} empty polls in {what}, 3 runs");
            return None;
        }
        eprintln!("xtask: {m} empty polls in {what}: once more");
    }
    None
}

/// One callgrind run of `bfperf icount-verbs` with the kernel model `lib` preloaded, its
/// counts in `cg`: on the direct path (`api` None), or on the verbs path with rdma-core's API
/// `api` (`BLUEFLAME_VERBS_API`).
fn probe_with(bin: &Path, lib: &Path, cg: &Path, api: Option<&str>) -> Option<String> {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--toggle-collect=*measured_*"])
        .arg(format!("--callgrind-out-file={}", cg.display()))
        .arg(bin)
        .args(["icount-verbs", &ITERS.to_string()]);
    // As the provider stage runs its binary; the probe's device is the model's `mlx5_0`.
    crate::provider::preloaded(&mut cmd, lib).env("BLUEFLAME_DEVICE", "mlx5_0");
    match api {
        Some(api) => cmd
            .env("BLUEFLAME_PATH", "verbs")
            .env("BLUEFLAME_VERBS_API", api),
        None => cmd
            .env_remove("BLUEFLAME_PATH")
            .env_remove("BLUEFLAME_VERBS_API"),
    };
    let o = cmd.output();
    match o {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => {
            eprintln!(
                "xtask: FAILED: bfperf icount-verbs on the kernel model ({}):\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("xtask: FAILED: cannot run valgrind: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::misses;

    /// The probe's `misses N` line, read for both tables' retry; none is as many as can be.
    #[test]
    fn misses_are_read_from_the_probes_output() {
        assert_eq!(misses("calls measured_verbs_poll_hit 301\nmisses 7\n"), 7);
        assert_eq!(misses("calls measured_verbs_poll_hit 301\n"), u32::MAX);
    }
}
