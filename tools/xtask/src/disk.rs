//! Disk for `cargo xtask test`: said at the start (free space against what a run needs, so
//! that a run on a small disk says why before a compiler stops minutes into a build with "No
//! space left on device"), and, in CI (`BLUEFLAME_CI`, set by `.ci/run`), each stage's
//! private target directory removed once the stage passed (no later stage reads it), so
//! that the run needs the largest stage's room, not the sum of all of them.

use crate::shell::{installed, root};
use std::path::Path;
use std::process::Command;

/// MiB a run writes under `target/` at its peak, measured in CI (fresh clone, 2026-11-28;
/// MiB): `debug` 3177 (1494 of it incremental caches), `release` 284, `doc` 19,
/// `publish-check` 329, `fuzz` 561, `asan` 1222 (424 incremental), `cross` 950 (208
/// incremental), 6542 in all at the end. In CI (`.ci/run` sets `BLUEFLAME_CI`: the private
/// directories pruned, and `CARGO_INCREMENTAL=0`) the peak is the asan stage's, 1683 + 284 + 19 + 798
/// = 2784; a developer's run keeps everything.
const BUILD_MIB_CI: u64 = 3_500;
const BUILD_MIB_FULL: u64 = 7_500;
/// MiB the Debian packages take when missing, by the package that marks each group: the host
/// build's (`libclang-dev`: clang 14's libraries), the aarch64 stage's (two Rust standard
/// libraries, LLVM 22 for each architecture, qemu-user-static; with recommends), the rxe
/// VM's (the kernel and its modules, qemu-system-x86), each with room for the downloaded
/// archives, which apt removes only after it has unpacked them.
const PACKAGES_MIB: &[(&str, u64)] = &[
    ("libclang-dev", 600),
    ("libstd-rust-web-dev:arm64", 2_600),
    ("qemu-system-x86", 800),
];
/// MiB for crates.io's downloads (rdma-core's vendored tree among them) when not cached.
const REGISTRY_MIB: u64 = 300;

/// MiB free for an unprivileged writer on the filesystem holding `p` (`df`).
pub(crate) fn free_mib(p: &Path) -> Option<u64> {
    let o = Command::new("df")
        .args(["-B1M", "--output=avail"])
        .arg(p)
        .output()
        .ok()?;
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

/// What this run needs, in MiB, given what is already installed and built.
fn need_mib() -> u64 {
    let packages: u64 = PACKAGES_MIB
        .iter()
        .filter(|(p, _)| !installed(p))
        .map(|(_, m)| m)
        .sum();
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    let registry = match home {
        Some(h) if h.join("registry/src").is_dir() => 0,
        _ => REGISTRY_MIB,
    };
    build_mib() + packages + registry
}

/// [`BUILD_MIB_CI`] when this run prunes and builds without incremental caches, else
/// [`BUILD_MIB_FULL`].
fn build_mib() -> u64 {
    let lean = ci() && std::env::var("CARGO_INCREMENTAL").is_ok_and(|v| v == "0");
    if lean {
        BUILD_MIB_CI
    } else {
        BUILD_MIB_FULL
    }
}

/// Whether this is CI's run (`.ci/run` sets `BLUEFLAME_CI`).
fn ci() -> bool {
    std::env::var_os("BLUEFLAME_CI").is_some()
}

/// Prints the free space and the need; false (said why) when the disk looks too small. One
/// filesystem is assumed for `target/` and `/` (CI's machine); with two, the check is on
/// `target/`'s, where the builds go. The need is an estimate with room to spare, so
/// `cargo xtask test` only warns (a run on a disk a little short may still pass);
/// `cargo xtask disk` fails.
pub(crate) fn enough() -> bool {
    let target = root().join("target");
    let at = if target.is_dir() {
        target
    } else {
        root().to_path_buf()
    };
    let Some(free) = free_mib(&at) else {
        eprintln!("xtask: disk: `df {}` failed; not checked", at.display());
        return true;
    };
    let need = need_mib();
    eprintln!(
        "xtask: disk: {free} MiB free on {}'s filesystem; this run needs about {need} MiB",
        at.display()
    );
    if free < need {
        eprintln!(
            "xtask: WARNING: the disk may be too small: {free} MiB free, about {need} MiB \
             needed (builds {}, missing Debian packages and crates the rest). If a build stops \
             with \"No space left on device\", free space (old target directories, scratch \
             files in /tmp) and run again.",
            build_mib()
        );
        return false;
    }
    true
}

/// In CI (`BLUEFLAME_CI`), removes `target/<dir>`, a stage's private target directory that
/// no later stage reads, and says how much room that gave. A developer's own run keeps it
/// (the next run's build of that stage starts from it).
pub(crate) fn prune(dir: &str) {
    if !ci() {
        return;
    }
    let p = root().join("target").join(dir);
    if !p.exists() {
        return;
    }
    let before = free_mib(&root().join("target"));
    let r = std::fs::remove_dir_all(&p);
    let after = free_mib(&root().join("target"));
    match (r, before, after) {
        (Ok(()), Some(b), Some(a)) => eprintln!(
            "xtask: disk: removed target/{dir} ({} MiB); {a} MiB free",
            a.saturating_sub(b)
        ),
        (Ok(()), _, _) => eprintln!("xtask: disk: removed target/{dir}"),
        (Err(e), _, _) => eprintln!("xtask: disk: could not remove target/{dir}: {e}"),
    }
}
