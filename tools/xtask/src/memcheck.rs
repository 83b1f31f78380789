//! The memcheck stage of `cargo xtask test`: the direct-path, event and memory tests (modules
//! of the `direct`, `events`, `memory` and `conformance` test binaries, or tests named by a
//! path prefix; one valgrind run per binary), and the provider stage's cases over rdma-core's own libmlx5 (the kernel model
//! preloaded), under valgrind's memcheck, failing on any invalid read or write, use of
//! uninitialised memory or bad free (`--error-exitcode`), as well as on a failing test.
//!
//! A subset that fits the CI budget (about a minute here, two runs at a time): the thread-mode ping-pong is
//! left out (its timed waits cannot be met at valgrind's speed and it adds no path the others
//! do not run), as are the long loops (50,000-write ring wraps, the queue-full, unsignaled,
//! shared-register and zero-allocation sweeps), whose code the shorter tests run too. No suppressions: the
//! thread-mode software NIC's accesses to the rings are races by design (as a device's DMA)
//! but memcheck does not report races, and nothing else needs one.

use std::process::Command;
use std::time::Instant;

/// One run of the stage: a test binary, the modules of it to run (the former test files,
/// selected by the test-name filters `module::`), test names to skip (`module::test`
/// prefixes), extra environment.
type Entry = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
);

/// The runs, the two long ones first (the stage starts them in this order, with the
/// provider's third): `memory` about 50 s and `direct` 40 under memcheck here, then
/// `events` and `conformance`, a few seconds each.
const SUBSET: &[Entry] = &[
    // Lifetimes, lost completions, memory windows; and receives racing the release (drop,
    // into_buffer) of their region, two seconds each (ten in the plain test run), the
    // parked-registration cases, and the key index wrap (on a NIC of 4,096 key indices).
    (
        "memory",
        &[
            "lifetimes",
            "lost_completions",
            "mw",
            "soundness",
            // dma-buf regions whose exporter frees the old place on each move.
            "memory::dma_buf",
        ],
        &[],
        &[("BLUEFLAME_RACE_SECS", "2")],
    ),
    (
        "direct",
        &[
            "direct_cq_overrun",
            "direct_doorbell",
            "direct_errors",
            "direct_flags",
            "direct_flush",
            "direct_inline",
            "direct_opcodes",
            "direct_ring_wrap",
            "direct_scatter_cqe",
            "direct_scenarios",
            "direct_sge_limits",
            "direct_shared_cq",
            // Page-faulted SRQ WQEs posted again by the poller; the dma-buf's old place is
            // freed by each move.
            "direct_srq::a_page_fault",
            // Drop orders: QPs torn down with entries in their CQs.
            "direct_teardown",
        ],
        &[
            "direct_ring_wrap::fifty_thousand",
            "direct_ring_wrap::producer_index_wraps",
            // The raced NIC-thread loop: the others run the same code.
            "direct_teardown::teardown_while_the_nic_thread_runs",
        ],
        &[],
    ),
    // Completion events: channels, arms, CQs dropped while threads wait (the long raced
    // loops left out: the shorter tests run the same code).
    (
        "events",
        &["events"],
        &[
            "events::no_missed_wake_up",
            "events::an_event_of_a_dropped_qp",
            "events::many_threads",
            "events::a_channel_wait_leaves",
        ],
        &[],
    ),
    (
        "conformance",
        &["random_ops"],
        &[],
        &[("BLUEFLAME_RANDOM_SEEDS", "10")],
    ),
];

/// valgrind's options for every run: memcheck, quiet, exit code 99 on an error, no leak
/// check, no origin tracking, fair scheduling. Valgrind runs one thread at a time; its
/// default lock hands the CPU back to the thread that just let it go, so a test spinning on a
/// CQ starved the thread-mode software NIC (72 s instead of 2 s for the scenarios under
/// --tool=none, and past their 20 s waits under memcheck). Fair scheduling hands it round in
/// turn, as a kernel would.
const VALGRIND: [&str; 6] = [
    "--tool=memcheck",
    "-q",
    "--error-exitcode=99",
    "--leak-check=no",
    "--track-origins=no",
    "--fair-sched=yes",
];

/// Runs the subset of `bins` (the workspace's test executables, [`crate::test_executables`])
/// under memcheck; false when a binary is missing, a test fails or memcheck reports an error.
///
/// Valgrind runs a process on one core at a time, so the runs go two at a time (this
/// machine's two cores), the long ones first, each one's output printed whole when it ends:
/// about 60 s instead of 110 s one after the other.
pub fn stage(bins: &[(String, String)]) -> bool {
    let start = Instant::now();
    let mut ok = true;
    let mut runs: Vec<(String, Command)> = Vec::new();
    for &(name, modules, skips, env) in SUBSET {
        let Some((_, exe)) = bins.iter().find(|(n, _)| n == name) else {
            eprintln!("xtask: memcheck: no test binary {name}");
            ok = false;
            continue;
        };
        // A module runs whole; a name with a path in it, the tests it begins.
        let filters: Vec<String> = modules
            .iter()
            .map(|m| {
                if m.contains("::") {
                    m.to_string()
                } else {
                    format!("{m}::")
                }
            })
            .collect();
        // A filter or a skip that names no test (a module renamed or moved) would run
        // nothing, or the long test it meant to leave out, and the run still pass.
        for f in filters
            .iter()
            .map(String::as_str)
            .chain(skips.iter().copied())
        {
            if selected(exe, f) == 0 {
                eprintln!("xtask: FAILED: memcheck {name}: `{f}` names no test of {exe}");
                ok = false;
            }
        }
        let mut cmd = Command::new("valgrind");
        cmd.args(VALGRIND).arg(exe).arg("--test-threads=1");
        cmd.args(&filters);
        for s in skips {
            cmd.args(["--skip", s]);
        }
        cmd.envs(env.iter().copied());
        runs.push((name.to_string(), cmd));
    }
    // The provider's run (about 15 s) after the two long ones; each run is taken, in
    // this order, by whichever worker is free.
    match provider_command(bins) {
        Some(cmd) => runs.insert(runs.len().min(2), ("provider".to_string(), cmd)),
        None => ok = false,
    }
    let queue = std::sync::Mutex::new(runs.into_iter());
    let all = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let next = queue.lock().map(|mut q| q.next());
                let Ok(Some((name, mut cmd))) = next else {
                    break;
                };
                if !run_one(&name, &mut cmd) {
                    all.store(false, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    ok &= all.into_inner();
    eprintln!(
        "xtask: memcheck stage: {} binaries in {:.1} s",
        SUBSET.len() + 1,
        start.elapsed().as_secs_f64()
    );
    ok
}

/// How many tests of the libtest binary `exe` the filter `f` selects (`--list`).
fn selected(exe: &str, f: &str) -> usize {
    Command::new(exe)
        .args(["--list", "--format=terse", f])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.ends_with(": test"))
                .count()
        })
        .unwrap_or(0)
}

/// The provider binary's filters under memcheck.
const PROVIDER_FILTERS: [&str; 5] = ["scenario::", "spec::", "provider::", "memory::", "ud::"];

/// How many valgrind runs go at once.
const WORKERS: usize = 2;

/// One memcheck run, its output printed whole when it ends (the other worker's is not
/// mixed into it); false when a test failed or memcheck reported an error. The provider's
/// run passes only when it reports cases and none failed.
fn run_one(name: &str, cmd: &mut Command) -> bool {
    let t = Instant::now();
    let out = cmd.current_dir(crate::shell::root()).output();
    let mut text = format!("xtask: memcheck {name}: {cmd:?}\n");
    let passed = match out {
        Ok(o) => {
            let stdout = String::from_utf8_lossy(&o.stdout);
            text.push_str(&stdout);
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            if name == "provider" {
                let summary = crate::provider::summary(&stdout);
                text.push_str(&format!(
                    "xtask: memcheck provider: (passed, failed) = {summary:?}\n"
                ));
                // Each filter must have run a case (a renamed group would drop out unseen).
                let idle: Vec<&str> = PROVIDER_FILTERS
                    .into_iter()
                    .filter(|f| {
                        !stdout
                            .lines()
                            .any(|l| l.starts_with("test ") && l.contains(f))
                    })
                    .collect();
                if !idle.is_empty() {
                    text.push_str(&format!(
                        "xtask: memcheck provider: no case ran for {idle:?}\n"
                    ));
                }
                o.status.success()
                    && idle.is_empty()
                    && matches!(summary, Some((passed, 0)) if passed > 0)
            } else {
                if !o.status.success() {
                    text.push_str(&format!("xtask: memcheck {name} failed ({})\n", o.status));
                }
                // libtest's summary: a run whose filters selected nothing passes with 0.
                let ran = stdout
                    .lines()
                    .filter_map(|l| l.strip_prefix("test result: ok. "))
                    .filter_map(|r| r.split(' ').next()?.parse::<u32>().ok())
                    .sum::<u32>();
                if ran == 0 {
                    text.push_str(&format!("xtask: memcheck {name}: no test ran\n"));
                }
                o.status.success() && ran > 0
            }
        }
        Err(e) => {
            text.push_str(&format!(
                "xtask: memcheck {name}: cannot run valgrind: {e}\n"
            ));
            false
        }
    };
    eprintln!(
        "{text}xtask: memcheck {name}: {} in {:.1} s",
        if passed { "clean" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    passed
}

/// The provider stage's binary under memcheck, the kernel model preloaded (the production
/// route: rdma-core's libibverbs and libmlx5, the crate over the rings they allocated, the
/// software NIC behind the model): the scenarios, the specification checks, the
/// provider-only checks, user memory and UD (the event cases and the differential runs
/// left out: their code is the same and their waits are long at valgrind's speed). Fails
/// when the binary reports no case (no `mlx5_0`: the preload did not take): the command,
/// None (said why) when the binary or the model is missing.
fn provider_command(bins: &[(String, String)]) -> Option<Command> {
    let Some((_, exe)) = bins.iter().find(|(n, _)| n == "provider") else {
        eprintln!("xtask: memcheck: no test binary provider");
        return None;
    };
    let Some(lib) = crate::provider::model_lib(exe) else {
        eprintln!("xtask: memcheck provider: libkernel_model.so not built (cargo xtask provider builds it)");
        return None;
    };
    let mut cmd = Command::new("valgrind");
    cmd.args(VALGRIND).arg(exe).args(PROVIDER_FILTERS);
    crate::provider::preloaded(&mut cmd, &lib);
    Some(cmd)
}
