//! The checks that blueflame is a crate people can depend on (`cargo xtask crate`, and a
//! stage of `cargo xtask test`):
//!
//! 1. without the software NIC: `blueflame` built, linted and tested with
//!    `--no-default-features`, and the build checked to carry no simulator (no `mlx5/sim`
//!    feature in `cargo tree`, no `mlx5::sim::` symbol in the library);
//! 2. documentation: `cargo doc --no-deps` of `mlx5` and `blueflame` with
//!    `RUSTDOCFLAGS=-D warnings`, with the default features, with all of them (what docs.rs
//!    builds) and without the software NIC;
//! 3. packaging: `cargo publish --dry-run` of `mlx5` and `blueflame` together (cargo packages
//!    both and verifies `blueflame` against the packaged `mlx5` through a local registry
//!    overlay, so the path dependency is checked as crates.io would see it), and
//!    `cargo install --path tools/bfperf` into a temporary root, whose `bfperf` then prints
//!    its usage and runs a short ping-pong on the software NIC.

use crate::shell::{root, run};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the three checks; false at the first failure.
pub(crate) fn stage(cargo: &str) -> bool {
    no_sim(cargo) && docs(cargo) && package(cargo)
}

/// `blueflame` without its default features: builds, is clippy-clean, its tests pass, and
/// nothing of the software NIC is in it.
fn no_sim(cargo: &str) -> bool {
    let nd = ["-p", "blueflame", "--no-default-features", "--locked"];
    let ok = run(
        "build without the software NIC",
        Command::new(cargo).arg("build").args(nd),
    ) && simulator_absent(cargo)
        && run(
            "clippy without the software NIC",
            Command::new(cargo).arg("clippy").args(nd).args([
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        )
        && run(
            "tests without the software NIC",
            Command::new(cargo).arg("test").args(nd),
        );
    if !ok {
        eprintln!("xtask: FAILED: blueflame without the software NIC (--no-default-features)");
    }
    ok
}

/// The library just built with `--no-default-features` (target/debug/libblueflame.rlib)
/// names no `mlx5::sim::` item, and `mlx5` is built without its `sim` feature.
fn simulator_absent(cargo: &str) -> bool {
    let tree = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "blueflame",
            "--no-default-features",
            "--locked",
        ])
        .args(["-e", "features", "-i", "mlx5"])
        .current_dir(root())
        .output();
    let tree = match tree {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => {
            eprintln!("xtask: cargo tree failed");
            return false;
        }
    };
    if tree.contains("mlx5 feature \"sim\"") {
        eprintln!("xtask: blueflame --no-default-features still enables mlx5/sim:\n{tree}");
        return false;
    }
    let lib = root().join("target/debug/libblueflame.rlib");
    let nm = Command::new("nm").arg("-C").arg(&lib).output();
    let syms = match nm {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => {
            eprintln!("xtask: nm -C {} failed", lib.display());
            return false;
        }
    };
    let sim: Vec<&str> = syms
        .lines()
        .filter(|l| l.contains("mlx5::sim::") || l.contains("NicView"))
        .collect();
    if !sim.is_empty() {
        eprintln!(
            "xtask: the library built without the software NIC names {} of its symbols, e.g.\n{}",
            sim.len(),
            sim[..sim.len().min(5)].join("\n")
        );
        return false;
    }
    eprintln!(
        "xtask: no simulator in blueflame --no-default-features ({} symbols, none of mlx5::sim)",
        syms.lines().count()
    );
    true
}

/// `cargo doc --no-deps` warning-free for every feature set a reader may build.
fn docs(cargo: &str) -> bool {
    let sets: [(&str, &[&str]); 3] = [
        ("default features", &[]),
        ("all features (docs.rs)", &["--all-features"]),
        ("without the software NIC", &["--no-default-features"]),
    ];
    for (what, flags) in sets {
        let ok = run(
            &format!("docs, {what}"),
            Command::new(cargo)
                .env("RUSTDOCFLAGS", "-D warnings")
                .args([
                    "doc",
                    "--no-deps",
                    "--locked",
                    "-p",
                    "mlx5",
                    "-p",
                    "blueflame",
                ])
                .args(flags),
        );
        if !ok {
            eprintln!("xtask: FAILED: documentation ({what})");
            return false;
        }
    }
    true
}

/// Cargo verifies `blueflame` against `mlx5 0.1.0` unpacked from a temporary registry, and
/// takes a registry crate for immutable twice over: it does not unpack a version again that
/// it unpacked before (`$CARGO_HOME/registry/src/-<hash>/mlx5-0.1.0`, kept across runs) and
/// reuses a build of it as it is. Either way an older `mlx5` of the same version would be
/// verified against (and fail on items added since). So before each run the unpacked
/// copies of the two crates under the local (host-less, `-<hash>`) registries are removed,
/// and the dry run has a target directory of its own, in which their builds and the
/// temporary registry are removed too; the other dependencies stay built.
fn forget_packaged_builds(cargo_home: Option<&Path>, target: &Path) {
    let ours = |name: &str| {
        ["mlx5-", "libmlx5-", "blueflame-", "libblueflame-"]
            .iter()
            .any(|p| name.starts_with(p))
    };
    if let Some(src) = cargo_home.map(|h| h.join("registry/src")) {
        for reg in std::fs::read_dir(src).into_iter().flatten().flatten() {
            // Only local registries (no host name): crates.io's copies stay.
            if !reg.file_name().to_string_lossy().starts_with('-') {
                continue;
            }
            for e in std::fs::read_dir(reg.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if ours(&e.file_name().to_string_lossy()) {
                    remove(&e.path());
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(target.join("package"));
    for dir in ["debug/deps", "debug/.fingerprint", "debug/build"] {
        let Ok(entries) = std::fs::read_dir(target.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            if ours(&e.file_name().to_string_lossy()) {
                remove(&e.path());
            }
        }
    }
}

/// Removes a directory tree or a file.
fn remove(p: &Path) {
    let _ = std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p));
}

/// The two library crates package and verify as crates.io would build them; bfperf installs
/// with `cargo install --path` and runs.
fn package(cargo: &str) -> bool {
    let target = root().join("target/publish-check");
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    forget_packaged_builds(home.as_deref(), &target);
    // --allow-dirty: a check, not a release (a developer's uncommitted edits are checked too).
    let ok = run(
        "cargo publish --dry-run (mlx5, blueflame)",
        Command::new(cargo)
            .args([
                "publish",
                "--dry-run",
                "--allow-dirty",
                "--locked",
                "-p",
                "mlx5",
                "-p",
                "blueflame",
                "--target-dir",
            ])
            .arg(&target),
    );
    if !ok {
        eprintln!("xtask: FAILED: cargo publish --dry-run");
        return false;
    }
    let dest = std::env::temp_dir().join(format!("blueflame-install-{}", std::process::id()));
    let bin = dest.join("bin/bfperf");
    let ok = run(
        "cargo install --path tools/bfperf",
        Command::new(cargo)
            .args(["install", "--locked", "--path", "tools/bfperf", "--root"])
            .arg(&dest)
            // The workspace's target directory (cargo's default with `--path`, said here so
            // that it stays so): the release build is the one `cargo xtask icount` measures
            // next, built once for both.
            .arg("--target-dir")
            .arg(root().join("target")),
    ) && run("installed bfperf --help", Command::new(&bin).arg("--help"))
        && run(
            "installed bfperf on the software NIC",
            Command::new(&bin).args(["write-lat", "-d", "sim", "-n", "2000", "--warmup", "100"]),
        );
    let _ = std::fs::remove_dir_all(&dest);
    if !ok {
        eprintln!("xtask: FAILED: cargo install --path tools/bfperf");
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::forget_packaged_builds;
    use std::fs;

    #[test]
    fn only_the_packaged_crates_copies_and_builds_are_forgotten() {
        let t = std::env::temp_dir().join(format!("xtask-forget-{}", std::process::id()));
        let (home, target) = (t.join("home"), t.join("target"));
        let keep = [
            home.join("registry/src/index.crates.io-1949cf8c6b5b557f/mlx5-0.1.0/src"),
            home.join("registry/src/-7a8c4fad4a9b88b8/libc-0.2.191"),
            target.join("debug/deps/librdma_sys-ce86.rlib"),
            target.join("debug/.fingerprint/libc-b437"),
        ];
        let gone = [
            home.join("registry/src/-7a8c4fad4a9b88b8/mlx5-0.1.0/src"),
            home.join("registry/src/-b9e425ae8299eae3/blueflame-0.1.0"),
            target.join("package/tmp-registry"),
            target.join("debug/deps/libmlx5-e69f.rlib"),
            target.join("debug/deps/mlx5-e69f.d"),
            target.join("debug/.fingerprint/blueflame-425c"),
        ];
        for p in keep.iter().chain(&gone) {
            // Files are named like builds (`.rlib`, `.d`); the rest are directories.
            let file = p.extension().is_some_and(|e| e == "rlib" || e == "d");
            if file {
                fs::create_dir_all(p.parent().unwrap()).unwrap();
                fs::write(p, b"x").unwrap();
            } else {
                fs::create_dir_all(p).unwrap();
            }
        }
        forget_packaged_builds(Some(&home), &target);
        for p in &keep {
            assert!(p.exists(), "removed {}", p.display());
        }
        for p in &gone {
            assert!(!p.exists(), "kept {}", p.display());
        }
        assert!(!home
            .join("registry/src/-7a8c4fad4a9b88b8/mlx5-0.1.0")
            .exists());
        fs::remove_dir_all(&t).unwrap();
    }
}
