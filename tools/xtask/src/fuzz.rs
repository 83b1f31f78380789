//! The fuzz stage (`cargo xtask fuzz`) and the AddressSanitizer stage (`cargo xtask asan`),
//! both with the nightly toolchain.
//!
//! Fuzz: the targets of `fuzz/` (cargo-fuzz's layout: `cargo fuzz run <target>` works too)
//! built as cargo-fuzz builds them (libFuzzer, sanitizer coverage, AddressSanitizer, debug
//! assertions and overflow checks), each run for [`SECS`] seconds (two at a time, one per
//! core) from its corpus in `fuzz/corpus/<target>` (new inputs go to
//! `target/fuzz/corpus/<target>`, not into the repository), after every input kept in
//! `fuzz/regressions/<target>` ran once. A crash, a leak, a timeout or an out-of-memory
//! fails the stage; the input is left in `target/fuzz/artifacts/<target>/`.
//!
//! ASan: the software NIC's tests (the crate's unit tests, the direct-path, memory,
//! conformance, transport and event tests, and the NIC's own) built with
//! `-Zsanitizer=address` and run, leak checks on; then the provider stage's binary (the
//! crate over rdma-core's own libmlx5 in front of the software NIC) built so and run as the
//! provider stage runs it.
//!
//! Without a nightly toolchain both stages fail, saying so: they are never skipped.

use crate::shell::{root, run};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The fuzz targets (binaries of `fuzz/`).
pub(crate) const TARGETS: &[&str] = &["cqe", "wqe", "exchange", "api"];
/// Seconds each target runs in `cargo xtask test`.
pub(crate) const SECS: u64 = 60;
/// The host triple the sanitizers are built for.
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// Whether the nightly toolchain is there (said either way).
fn nightly_present() -> bool {
    let probe = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output();
    match probe {
        Ok(o) if o.status.success() => {
            eprintln!(
                "xtask: nightly toolchain: {}",
                String::from_utf8_lossy(&o.stdout).trim()
            );
            true
        }
        _ => {
            eprintln!(
                "xtask: FAILED: no nightly toolchain (`rustup run nightly rustc` failed): the \
                 fuzz and AddressSanitizer stages need it (rustup toolchain install nightly)"
            );
            false
        }
    }
}

/// `cargo` of the nightly toolchain, through rustup, with what the calling cargo set
/// removed.
fn nightly_cargo() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo"])
        .current_dir(root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTDOC")
        .env_remove("CARGO")
        .env_remove("CARGO_TARGET_DIR");
    c
}

/// `cargo test` of the nightly toolchain building for the host with AddressSanitizer, into
/// `target/asan` (the build scripts and proc macros, built for the host without `--target`'s
/// flags, stay uninstrumented).
fn asan_test() -> Command {
    let mut c = nightly_cargo();
    c.args([
        "test",
        "--locked",
        "--target",
        TRIPLE,
        "--target-dir",
        "target/asan",
    ])
    .env("RUSTFLAGS", "-Zsanitizer=address -Cforce-frame-pointers");
    c
}

/// The sanitizer's options for the tests: leaks checked, the first report ends the process,
/// and a region larger than memory is refused with an error, not an abort
/// (`misuse::a_region_larger_than_memory_is_an_error_not_an_abort`): ASan's allocator
/// returns null there, as malloc does, instead of stopping the process.
const ASAN_OPTIONS: &str = "detect_leaks=1:abort_on_error=1:allocator_may_return_null=1";

/// Builds the fuzz targets: the path of their binaries.
fn build() -> Option<PathBuf> {
    if !nightly_present() {
        return None;
    }
    let mut c = nightly_cargo();
    // cargo-fuzz's flags (`cargo fuzz build`, defaults: address sanitizer, debug assertions).
    let rustflags = [
        "-Cpasses=sancov-module",
        "-Cllvm-args=-sanitizer-coverage-level=4",
        "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
        "-Cllvm-args=-sanitizer-coverage-pc-table",
        "-Cllvm-args=-sanitizer-coverage-trace-compares",
        "--cfg",
        "fuzzing",
        "-Zsanitizer=address",
        "-Cdebug-assertions",
        "-Coverflow-checks",
        "-Cforce-frame-pointers",
    ]
    .join(" ");
    c.args([
        "build",
        "--release",
        "--locked",
        "-p",
        "blueflame-fuzz",
        "--bins",
    ])
    .args(["--target", TRIPLE, "--target-dir", "target/fuzz"])
    .env("RUSTFLAGS", rustflags)
    // The workspace's release profile links with fat LTO in one unit: minutes more
    // for nothing a fuzzer needs.
    .env("CARGO_PROFILE_RELEASE_LTO", "false")
    .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
    .env("CARGO_PROFILE_RELEASE_DEBUG", "line-tables-only");
    run("fuzz: build the targets (nightly, libFuzzer, ASan)", &mut c)
        .then(|| root().join("target/fuzz").join(TRIPLE).join("release"))
}

/// The files of directory `d` (none if it does not exist).
fn files(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(d)
        .map(|r| {
            r.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// One target's run, started.
struct Running {
    target: &'static str,
    child: std::process::Child,
    log: PathBuf,
    started: Instant,
}

/// Starts `target` for `secs` seconds.
fn start(bins: &Path, target: &'static str, secs: u64) -> Option<Running> {
    let work = root().join("target/fuzz/corpus").join(target);
    let artifacts = root().join("target/fuzz/artifacts").join(target);
    let seeds = root().join("fuzz/corpus").join(target);
    for d in [&work, &artifacts] {
        if let Err(e) = std::fs::create_dir_all(d) {
            eprintln!("xtask: fuzz {target}: cannot create {}: {e}", d.display());
            return None;
        }
    }
    let log = root().join("target/fuzz").join(format!("{target}.log"));
    let out = std::fs::File::create(&log).ok()?;
    let mut c = Command::new(bins.join(target));
    c.arg(format!("-max_total_time={secs}"))
        .arg("-timeout=30")
        .arg("-rss_limit_mb=4096")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(&work)
        .arg(&seeds)
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
        .stdout(Stdio::null())
        .stderr(out);
    eprintln!("xtask: fuzz {target}: {c:?}");
    match c.spawn() {
        Ok(child) => Some(Running {
            target,
            child,
            log,
            started: Instant::now(),
        }),
        Err(e) => {
            eprintln!("xtask: fuzz {target}: cannot start: {e}");
            None
        }
    }
}

/// Waits for `r` (killed past twice its time plus a minute): whether it ended cleanly.
fn finish(mut r: Running, secs: u64) -> bool {
    let limit = Duration::from_secs(2 * secs + 60);
    let status = loop {
        match r.child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if r.started.elapsed() > limit => {
                let _ = r.child.kill();
                let _ = r.child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(_) => break None,
        }
    };
    let log = std::fs::read_to_string(&r.log).unwrap_or_default();
    let stat = |k: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("stat::{k}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let cov = log
        .lines()
        .rev()
        .find_map(|l| {
            l.split_once(" cov: ")
                .map(|(_, v)| v.split(' ').next().unwrap_or("?"))
        })
        .unwrap_or("?")
        .to_string();
    let ok = status.is_some_and(|s| s.success());
    eprintln!(
        "xtask: fuzz {}: {} in {:.0} s: {} runs, coverage {} edges, corpus {} inputs ({})",
        r.target,
        if ok { "ok" } else { "FAILED" },
        r.started.elapsed().as_secs_f64(),
        stat("number_of_executed_units"),
        cov,
        stat("new_units_added"),
        r.log.display()
    );
    if !ok {
        let lines: Vec<&str> = log.lines().collect();
        for l in &lines[lines.len().saturating_sub(60)..] {
            eprintln!("  | {l}");
        }
        if status.is_none() {
            eprintln!("xtask: fuzz {}: did not end in time (killed)", r.target);
        }
        eprintln!(
            "xtask: fuzz {}: the input is in target/fuzz/artifacts/{}/; replay it with \
             target/fuzz/{TRIPLE}/release/{} <file>, keep it in fuzz/regressions/{}/",
            r.target, r.target, r.target, r.target
        );
    }
    ok
}

/// The fuzz stage: `targets` (all when empty) for `secs` seconds each.
pub(crate) fn stage(targets: &[String], secs: u64) -> bool {
    let Some(bins) = build() else {
        return false;
    };
    let chosen: Vec<&'static str> = if targets.is_empty() {
        TARGETS.to_vec()
    } else {
        match targets
            .iter()
            .map(|t| TARGETS.iter().copied().find(|k| k == t).ok_or(t))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(v) => v,
            Err(t) => {
                eprintln!(
                    "xtask: fuzz: no target {t} (targets: {})",
                    TARGETS.join(", ")
                );
                return false;
            }
        }
    };
    // The inputs kept from earlier findings, once each.
    for t in &chosen {
        let kept = files(&root().join("fuzz/regressions").join(t));
        if !kept.is_empty() {
            let mut c = Command::new(bins.join(t));
            c.args(&kept);
            if !run(&format!("fuzz {t}: {} kept inputs", kept.len()), &mut c) {
                return false;
            }
        }
    }
    // Two at a time: one per core.
    let mut ok = true;
    for pair in chosen.chunks(2) {
        let running: Vec<Running> = pair.iter().filter_map(|t| start(&bins, t, secs)).collect();
        ok &= running.len() == pair.len();
        for r in running {
            ok &= finish(r, secs);
        }
    }
    ok
}

/// The AddressSanitizer stage.
pub(crate) fn asan() -> bool {
    if !nightly_present() {
        return false;
    }
    let started = Instant::now();
    let mut c = asan_test();
    c.args(["-p", "blueflame", "-p", "mlx5", "--features", "mlx5/sim"])
        .args(["--lib", "--test", "direct", "--test", "memory"])
        .args([
            "--test",
            "conformance",
            "--test",
            "transports",
            "--test",
            "events",
        ])
        // The long loop left out, as in the memcheck stage: the 50,000-write ring wrap.
        .args(["--", "--skip", "direct_ring_wrap::fifty_thousand"])
        .env("ASAN_OPTIONS", ASAN_OPTIONS)
        .env("BLUEFLAME_TIMEOUT_SCALE", "4");
    let ok = run(
        "asan: the software NIC's tests under AddressSanitizer",
        &mut c,
    ) && provider_under_asan();
    eprintln!(
        "xtask: asan: {} in {:.0} s",
        if ok { "clean" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    ok
}

/// The provider stage's binary (the crate over rdma-core's own libmlx5, the kernel model
/// preloaded) built with AddressSanitizer and run as the provider stage runs it. The
/// model and rdma-core are not instrumented: ASan sees the crate's side.
fn provider_under_asan() -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !run(
        "asan: build the kernel model",
        Command::new(&cargo).args(["build", "-p", "kernel-model", "--locked"]),
    ) {
        return false;
    }
    let mut c = asan_test();
    c.args(["--no-run", "--message-format=json"])
        .args(["-p", "blueflame", "--test", "provider"])
        .stderr(Stdio::inherit());
    eprintln!("xtask: asan: build the provider binary: {c:?}");
    let exe = match c.output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains("\"executable\":\"") && l.contains("provider"))
            .find_map(|l| {
                let (_, rest) = l.split_once("\"executable\":\"")?;
                Some(rest.split('"').next()?.to_string())
            }),
        _ => None,
    };
    let Some(exe) = exe else {
        eprintln!("xtask: FAILED: asan: the provider binary was not built");
        return false;
    };
    let lib = root().join("target/debug/libkernel_model.so");
    let mut p = Command::new(&exe);
    crate::provider::preloaded(&mut p, &lib).env("ASAN_OPTIONS", ASAN_OPTIONS);
    eprintln!(
        "xtask: asan: provider stage: {exe} with LD_PRELOAD={}",
        lib.display()
    );
    let out = match p.output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xtask: FAILED: asan: cannot run {exe}: {e}");
            return false;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    match crate::provider::summary(&text) {
        Some((passed, 0)) if passed > 0 && out.status.success() => {
            eprintln!("xtask: asan: provider stage: {passed} passed, 0 failed");
            true
        }
        other => {
            print!("{text}");
            eprintln!(
                "xtask: FAILED: asan: provider stage: {other:?}, {}",
                out.status
            );
            false
        }
    }
}
