//! `cargo xtask`: the project's two commands and their set-up.
//!
//! - `cargo xtask demo`: installs what the build needs, then runs an RDMA-write ping-pong
//!   through the direct data path (`bfperf write-lat`) and prints a perftest-style table.
//! - `cargo xtask test`: installs what the build needs, fetches rdma-core's source for the
//!   `mlx5-oracle` tests (`oracle.rs`), then `cargo fmt --check`,
//!   `cargo clippy -D warnings` (also with the `tokio` feature), `cargo test --workspace
//!   --locked`, the `tokio` feature's tests (`AsyncCq`), and the direct-path and
//!   memory-window tests again under valgrind's memcheck (`cargo xtask memcheck` alone).
//! - `cargo xtask examples`: every program of `examples/` on the software NIC (also a stage
//!   of `cargo xtask test`, after the tests).
//! - `cargo xtask provider`: the direct-path scenarios through rdma-core's own libmlx5 in
//!   front of the software NIC, the kernel model preloaded (`provider.rs`; also a stage of
//!   `cargo xtask test`, after the examples).
//! - `cargo xtask rxe -- COMMAND`: boots the rxe VM once and runs COMMAND inside it with
//!   `BLUEFLAME_DEVICE=rxe0`.
//! - `cargo xtask rxe-examples`: the examples on rxe0 in one VM boot (also part of the
//!   device stage of `cargo xtask test`).
//! - `cargo xtask crate`: the crate checks alone (`crate_checks.rs`): blueflame without the
//!   software NIC (build, clippy, tests, no simulator symbol), `cargo doc` with
//!   `-D warnings`, `cargo publish --dry-run` of mlx5 and blueflame, `cargo install --path
//!   tools/bfperf` and a run of the installed bfperf.
//! - `cargo xtask icount`: instructions per post / poll with callgrind, against the regression
//!   guards (also a stage of `cargo xtask test`).
//! - `cargo xtask rxe-compare`: perftest and bfperf side by side on rxe0, in one VM boot
//!   (busy polling and event mode, with the wake-up cost of each program); `--script`
//!   prints the VM's commands (to share a boot), `--report` the table of the last boot's.
//! - `cargo xtask rxe-pairs --script`: the commands of the rxe stage's bfperf -> bfperf
//!   pairings across two processes (`-q`, `-b`, `--mmap`, `--pin_cores`; see
//!   `bfperf_pairs.rs`), to run with `cargo xtask rxe -- bash FILE`; `--report LOG` the
//!   lines of such a run's log.
//! - `cargo xtask wakeup`: the wake-up cost of bfperf's event mode on the software NIC.
//! - `cargo xtask rxe-icount`: instructions per post / poll / receive of the verbs path on
//!   rxe0 (callgrind in the VM), for both rdma-core APIs, beside plain rdma-core calls,
//!   against guards (also run by the device stage of `test`, in its one boot).
//! - `cargo xtask fuzz [--secs N] [TARGET...]`: the fuzz targets of `fuzz/` (libFuzzer,
//!   nightly), each for 60 s (or N), two at a time (`fuzz.rs`; also a stage of `test`).
//! - `cargo xtask asan`: the software NIC's tests under AddressSanitizer (nightly; also a
//!   stage of `test`).
//! - `cargo xtask oracle`: only the rdma-core oracle tests (`mlx5/oracle`), with the source
//!   fetched as `test` fetches it.
//! - `cargo xtask aarch64`: only the aarch64 stage of `test` (below).
//! - `cargo xtask deps`: only the installation step.
//!
//! `cargo xtask test` runs the crate checks after the tests, then the aarch64 stage (the
//! crate cross-built for `aarch64-unknown-linux-gnu` with Debian's Rust, its unit and
//! direct-path tests run under qemu-user; see `cross.rs`) and ends with the device stage: the
//! device tests (`tests/rxe`, each module in a process of its own; see `rxe.rs`), built on
//! the host, then every example (server and client sides both on rxe0), run inside
//! one boot of the rxe VM, followed in the same boot by the verbs path's instruction counts
//! (`rxe-icount`), bfperf against perftest (`interop.rs`) and bfperf against bfperf across
//! two processes (`bfperf_pairs.rs`).

mod bfperf_pairs;
mod compare;
mod crate_checks;
mod cross;
mod disk;
mod examples;
mod fuzz;
mod icount;
mod interop;
mod memcheck;
mod oracle;
mod peer_icount;
mod provider;
mod rxe;
mod rxe_icount;
mod shell;
mod vm;
mod wakeup;

use shell::{apt_get, installed, is_root, root, run};
use std::process::{exit, Command};

/// Debian packages the build and the tests need.
const PACKAGES: &[&str] = &[
    "libibverbs-dev",
    "librdmacm-dev",
    "ibverbs-providers",
    "clang",
    "libclang-dev",
    "pkg-config",
    "valgrind",
];

/// Builds the examples (after the dependencies) and runs `stage` on them: the exit code.
fn run_examples(stage: fn(&[(String, std::path::PathBuf)]) -> bool) -> i32 {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let exes = (deps() == 0)
        .then(|| examples::executables(&cargo))
        .flatten();
    if exes.is_some_and(|e| stage(&e)) {
        0
    } else {
        1
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("demo") => demo(&args[1..]),
        Some("test") => test(),
        Some("deps") => deps(),
        // The free-space check `test` starts with, alone.
        Some("disk") => i32::from(!disk::enough()),
        Some("memcheck") => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            // The kernel model the provider binary runs under (the test stage builds it
            // in the provider stage, before memcheck).
            let model = || {
                run(
                    "build the kernel model",
                    Command::new(&cargo).args(["build", "-p", "kernel-model", "--locked"]),
                )
            };
            let bins = (deps() == 0 && model())
                .then(|| test_executables(&cargo))
                .flatten();
            if bins.is_some_and(|b| memcheck::stage(&b)) {
                0
            } else {
                1
            }
        }
        Some("oracle") => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let ok = oracle::setup(&cargo)
                && run(
                    "oracle tests",
                    Command::new(&cargo).args(["test", "-p", "mlx5-oracle", "--locked"]),
                );
            if ok {
                0
            } else {
                1
            }
        }
        Some("aarch64") => {
            if cross::stage() {
                0
            } else {
                1
            }
        }
        Some("examples") => run_examples(examples::host_stage),
        Some("provider") => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let ok = deps() == 0
                && test_executables(&cargo).is_some_and(|b| provider::stage(&cargo, &b));
            if ok {
                0
            } else {
                1
            }
        }
        Some("rxe-examples") => run_examples(rxe::examples_stage),
        Some("crate") => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            if deps() == 0 && crate_checks::stage(&cargo) {
                0
            } else {
                1
            }
        }
        Some("rxe") => rxe::main(&args[1..]),
        Some("rxe-compare") => {
            if deps() == 0 && compare::main(&args[1..]) {
                0
            } else {
                1
            }
        }
        Some("rxe-pairs") => match (args.get(1).map(String::as_str), args.get(2)) {
            // The VM's commands, to run with `cargo xtask rxe -- bash FILE`.
            (Some("--script"), None) => {
                println!("{}", bfperf_pairs::script());
                0
            }
            // The lines of a log of that run.
            (Some("--report"), Some(file)) => match std::fs::read_to_string(file) {
                Ok(log) if bfperf_pairs::report(&log) => 0,
                Ok(_) => 1,
                Err(e) => {
                    eprintln!("xtask: rxe-pairs --report {file}: {e}");
                    1
                }
            },
            _ => {
                eprintln!("usage: cargo xtask rxe-pairs --script | --report LOG");
                2
            }
        },
        Some("rxe-icount") => {
            if deps() == 0 && rxe_icount::main(&args[1..]) {
                0
            } else {
                1
            }
        }
        Some("wakeup") => {
            if wakeup::main() {
                0
            } else {
                1
            }
        }
        Some("fuzz") => {
            // cargo xtask fuzz [--secs N] [TARGET...]
            let mut secs = fuzz::SECS;
            let mut targets = Vec::new();
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                if a == "--secs" {
                    match it.next().and_then(|v| v.parse().ok()) {
                        Some(v) => secs = v,
                        None => {
                            eprintln!("xtask: fuzz: --secs takes a number of seconds");
                            exit(2);
                        }
                    }
                } else {
                    targets.push(a.clone());
                }
            }
            if deps() == 0 && fuzz::stage(&targets, secs) {
                0
            } else {
                1
            }
        }
        Some("asan") => {
            if deps() == 0 && fuzz::asan() {
                0
            } else {
                1
            }
        }
        Some("icount") => {
            if deps() != 0 {
                1
            } else if icount::main() {
                0
            } else {
                1
            }
        }
        _ => {
            eprintln!("usage: cargo xtask <demo [bfperf options] | test | crate | examples | provider | memcheck | oracle | aarch64 | rxe -- COMMAND | rxe-examples | icount | fuzz [--secs N] [TARGET...] | asan | rxe-icount | rxe-compare | rxe-pairs --script | rxe-pairs --report LOG | wakeup | deps | disk>");
            2
        }
    };
    exit(code);
}

/// Installs the missing Debian packages (as root), or prints the command.
fn deps() -> i32 {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        eprintln!("xtask: build dependencies present");
        return 0;
    }
    if !is_root() {
        eprintln!(
            "xtask: missing packages: {}\nxtask: run as root:\n  apt-get update && apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
        return 1;
    }
    let ok = apt_get("apt-get update", &["update", "-q"])
        && apt_get(
            "apt-get install",
            &[["install", "-y", "-q"].as_slice(), &missing].concat(),
        );
    if ok {
        0
    } else {
        1
    }
}

fn test() -> i32 {
    // Said, not enforced: the need is an estimate (`disk.rs`).
    let _ = disk::enough();
    // Every Debian package and the VM's virtme-ng now, not after 17 minutes of builds: a
    // registry's failure or a full disk then shows in the first minutes.
    if deps() != 0 || !cross::deps() || !vm::deps() {
        eprintln!("xtask: FAILED: installing the packages of the later stages");
        return 1;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // rdma-core's source for the mlx5-oracle tests, before any build (clippy lints the oracle
    // code only when it is built).
    if !oracle::setup(&cargo) {
        return 1;
    }
    let steps: [(&str, Vec<&str>); 6] = [
        ("format", vec!["fmt", "--all", "--", "--check"]),
        (
            "clippy",
            vec![
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            "clippy, feature tokio",
            vec![
                "clippy",
                "-p",
                "blueflame",
                "--all-targets",
                "--features",
                "tokio",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
        ("tests", vec!["test", "--workspace", "--locked"]),
        (
            "tests, feature tokio (AsyncCq)",
            vec![
                "test",
                "-p",
                "blueflame",
                "--features",
                "tokio",
                "--locked",
                "--test",
                "async_cq",
            ],
        ),
        (
            "doc tests, feature tokio (AsyncCq)",
            vec![
                "test",
                "-p",
                "blueflame",
                "--features",
                "tokio",
                "--locked",
                "--doc",
                "AsyncCq",
            ],
        ),
    ];
    for (what, args) in steps {
        // The two runs selected by name (a test binary, a doc-test filter) must have run a
        // test: a filter that matches nothing passes with "0 passed".
        let ok = if what.contains("tokio") && args[0] == "test" {
            run_some(what, Command::new(&cargo).args(&args))
        } else {
            run(what, Command::new(&cargo).args(&args))
        };
        if !ok {
            return 1;
        }
    }
    eprintln!("xtask: crate checks (cargo xtask crate)");
    if !crate_checks::stage(&cargo) {
        return 1;
    }
    disk::prune("publish-check");
    // The test executables (built by the tests step), for memcheck and the rxe stage.
    let Some(bins) = test_executables(&cargo) else {
        return 1;
    };
    // The examples, as a user runs them, on the software NIC.
    let Some(exes) = examples::executables(&cargo) else {
        return 1;
    };
    if !examples::host_stage(&exes) {
        eprintln!("xtask: FAILED: an example failed on the software NIC");
        return 1;
    }
    // The direct path over rdma-core's own provider (the kernel model preloaded).
    if !provider::stage(&cargo, &bins) {
        return 1;
    }
    if !memcheck::stage(&bins) {
        eprintln!("xtask: FAILED: memcheck");
        return 1;
    }
    eprintln!("xtask: instruction guards of the hot path (cargo xtask icount)");
    if !icount::main() {
        eprintln!("xtask: FAILED: an instruction count is above its guard");
        return 1;
    }
    eprintln!(
        "xtask: fuzz stage (cargo xtask fuzz): every target for {} s",
        fuzz::SECS
    );
    if !fuzz::stage(&[], fuzz::SECS) {
        eprintln!("xtask: FAILED: fuzz stage");
        return 1;
    }
    disk::prune("fuzz");
    eprintln!("xtask: AddressSanitizer stage (cargo xtask asan)");
    if !fuzz::asan() {
        eprintln!("xtask: FAILED: AddressSanitizer stage");
        return 1;
    }
    disk::prune("asan");
    eprintln!("xtask: all host checks passed; now the aarch64 stage");
    if !cross::stage() {
        eprintln!("xtask: FAILED: aarch64 stage");
        return 1;
    }
    disk::prune("cross");
    eprintln!("xtask: aarch64 stage passed; now the device tests on rxe");
    if !rxe::device_stage(&bins, &exes) {
        eprintln!("xtask: FAILED: device tests on rxe");
        return 1;
    }
    eprintln!("xtask: all checks passed (host and rxe)");
    0
}

/// [`run`] for a `cargo test` whose filters may select nothing: false unless it passed and
/// its libtest summaries count at least one passed test.
fn run_some(what: &str, cmd: &mut Command) -> bool {
    eprintln!("xtask: {what}: {cmd:?}");
    let out = match cmd
        .current_dir(shell::root())
        .stderr(std::process::Stdio::inherit())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xtask: {what}: cannot run: {e}");
            return false;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    let passed: u32 = text
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|r| r.split(' ').next()?.parse::<u32>().ok())
        .sum();
    if !out.status.success() || passed == 0 {
        eprintln!(
            "xtask: {what} failed ({}, {passed} tests passed)",
            out.status
        );
        return false;
    }
    true
}

fn demo(extra: &[String]) -> i32 {
    if deps() != 0 {
        return 1;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "run",
        "--release",
        "--locked",
        "-q",
        "-p",
        "bfperf",
        "--",
        "write-lat",
    ]);
    // The demo's own settings, then the caller's: bfperf takes the last of an option given
    // twice, so `demo -d sim` keeps the size and count and changes the device only.
    cmd.args(["--device", "auto", "--size", "8", "--iters", "20000"]);
    cmd.args(extra);
    if run("demo", &mut cmd) {
        0
    } else {
        1
    }
}

/// Test executables of the workspace, by target name (built without running).
pub(crate) fn test_executables(cargo: &str) -> Option<Vec<(String, String)>> {
    let out = Command::new(cargo)
        .args([
            "test",
            "--workspace",
            "--locked",
            "--no-run",
            "--message-format=json",
        ])
        .current_dir(root())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "xtask: building the tests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |l: &str, from: usize, key: &str| -> Option<String> {
        let k = format!("\"{key}\":\"");
        let i = l[from..].find(&k)? + from + k.len();
        let j = l[i..].find('"')?;
        Some(l[i..i + j].to_owned())
    };
    Some(
        text.lines()
            .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"test\""))
            .filter_map(|l| {
                let t = l.find("\"target\":{")?;
                Some((field(l, t, "name")?, field(l, 0, "executable")?))
            })
            .collect(),
    )
}
