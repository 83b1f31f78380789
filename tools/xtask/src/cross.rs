//! The aarch64 stage of `cargo xtask test` (BlueField and Arm hosts): the crate cross-built
//! for `aarch64-unknown-linux-gnu` and its direct-path tests (software NIC) run under
//! qemu-user.
//!
//! The rustup toolchain here cannot download targets, so the stage uses Debian's own Rust
//! (`rustc-web`/`cargo-web`, with the arm64 standard library `libstd-rust-web-dev:arm64`),
//! the cross linker `gcc-aarch64-linux-gnu`, and `qemu-user-static` as the test runner. The
//! crate links libibverbs and librdmacm (rdma-sys), so the arm64 `-dev` packages are
//! installed too (multi-arch: next to the host's); the software-NIC tests never open a
//! device, the libraries only have to load.

use crate::shell::{apt_get, installed, is_root, root, run};
use std::process::Command;

const TARGET: &str = "aarch64-unknown-linux-gnu";

/// Debian packages of the stage (host architecture unless marked `:arm64`).
const PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev:arm64",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user-static",
    "libibverbs-dev:arm64",
    "librdmacm-dev:arm64",
];

/// Debian's cargo and rustc (the rustup ones in `PATH` have no aarch64 standard library).
const CARGO: &str = "/usr/bin/cargo";
const RUSTC: &str = "/usr/bin/rustc";

fn has_arm64() -> bool {
    Command::new("dpkg")
        .arg("--print-foreign-architectures")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == "arm64")
        })
        .unwrap_or(false)
}

/// Installs what the stage needs (as root), or says what is missing.
pub(crate) fn deps() -> bool {
    let arch = has_arm64();
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if arch && missing.is_empty() {
        return true;
    }
    if !is_root() {
        eprintln!(
            "xtask: aarch64 stage: missing {}\nxtask: run as root:\n  dpkg --add-architecture arm64 && apt-get update && apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
        return false;
    }
    if !arch
        && !run(
            "dpkg --add-architecture arm64",
            Command::new("dpkg").args(["--add-architecture", "arm64"]),
        )
    {
        return false;
    }
    apt_get("apt-get update", &["update", "-q"])
        && apt_get(
            "apt-get install (aarch64 stage)",
            &[["install", "-y", "-q"].as_slice(), &missing].concat(),
        )
}

/// A cargo command for the aarch64 target: Debian's toolchain, the cross linker, qemu-user as
/// runner, pkg-config and bindgen pointed at the arm64 libraries and headers. Its own target
/// directory, so the host build cache is untouched.
fn cargo(sub: &str) -> Command {
    let mut c = Command::new(CARGO);
    c.arg(sub)
        .env("RUSTC", RUSTC)
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        )
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER",
            "qemu-aarch64-static",
        )
        // qemu-user on a shared machine is many times slower: the thread-mode tests' hang
        // guards wait longer (never a timing assertion).
        .env("BLUEFLAME_TIMEOUT_SCALE", "10")
        // No debug information: the cross linker spent a third of the stage's build on it
        // (its build took 1 min 54 s without, 3 min 39 s with, both from scratch on the
        // same machine and load; CPU time 3 min 4 s against 4 min 18 s), and nothing reads
        // it here (a failure under qemu-user is read from its message and the test's name).
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_PROFILE_TEST_DEBUG", "0")
        .env("PKG_CONFIG_ALLOW_CROSS", "1")
        .env("PKG_CONFIG_LIBDIR", "/usr/lib/aarch64-linux-gnu/pkgconfig")
        .env(
            "BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu",
            "--sysroot=/usr/aarch64-linux-gnu -I/usr/include",
        )
        .args(["--target", TARGET])
        .arg("--target-dir")
        .arg(root().join("target/cross"));
    c
}

/// Cross-builds the crate and runs its unit tests and direct-path tests under qemu-user.
pub fn stage() -> bool {
    let t0 = std::time::Instant::now();
    if !deps() {
        eprintln!("xtask: FAILED: aarch64 stage: packages missing");
        return false;
    }
    let mut test = cargo("test");
    // The direct-path tests: the `direct` binary and `no_alloc`'s `direct_zero_alloc`.
    test.args(["--locked", "--no-fail-fast", "-p", "blueflame", "--lib"])
        .args(["--test", "direct", "--test", "no_alloc"])
        .args(["--", "--skip", "dc_hot::"]);
    let ok = run("aarch64: cross-build and test under qemu-user", &mut test);
    eprintln!(
        "xtask: aarch64 stage {} in {:.0} s",
        if ok { "passed" } else { "FAILED" },
        t0.elapsed().as_secs_f64()
    );
    ok
}
