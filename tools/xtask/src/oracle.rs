//! rdma-core's source for the `mlx5-oracle` test crate.
//!
//! `tools/oracle-src` names the crate `ibverbs-sys = "=0.3.2"` (its lock file pins
//! `0.3.2+55.0`), which vendors rdma-core v55's whole tree. `cargo fetch` downloads it (the
//! crate is never built: its build script would run CMake over all of rdma-core), `cargo
//! metadata` says where it was unpacked, and the tree's path goes to the oracle's build script
//! as `BLUEFLAME_RDMA_CORE_SRC`. `BLUEFLAME_ORACLE_REQUIRED=1` makes the oracle tests fail
//! rather than skip if the build did not get it.

use std::path::PathBuf;
use std::process::Command;

const MANIFEST: &str = "tools/oracle-src/Cargo.toml";
/// How `cargo metadata` starts the package whose manifest path we want.
const PACKAGE: &str = "\"name\":\"ibverbs-sys\",\"version\":\"0.3.2+55.0\"";

/// Fetches the source (a no-op when cargo's cache has it) and returns the rdma-core tree.
pub fn source(cargo: &str) -> Option<PathBuf> {
    if !crate::shell::run(
        "fetch rdma-core's source for the oracle",
        Command::new(cargo).args(["fetch", "--locked", "--manifest-path", MANIFEST]),
    ) {
        return None;
    }
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--locked",
            "--offline",
            "--format-version",
            "1",
            "--manifest-path",
            MANIFEST,
        ])
        .current_dir(crate::shell::root())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "xtask: cargo metadata of {MANIFEST} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // The package object lists its manifest_path after its dependencies and targets (which
    // have none): the first one after the package's name and version is its own.
    let at = text.find(PACKAGE)?;
    let key = "\"manifest_path\":\"";
    let start = text[at..].find(key)? + at + key.len();
    let end = text[start..].find('"')? + start;
    let manifest = PathBuf::from(&text[start..end]);
    let tree = manifest.parent()?.join("vendor/rdma-core");
    if !tree.join("providers/mlx5/qp.c").is_file() {
        eprintln!("xtask: {} has no providers/mlx5/qp.c", tree.display());
        return None;
    }
    Some(tree)
}

/// Sets the oracle's variables in this process (every cargo command after inherits them).
pub fn setup(cargo: &str) -> bool {
    match source(cargo) {
        Some(tree) => {
            eprintln!("xtask: rdma-core oracle source: {}", tree.display());
            std::env::set_var("BLUEFLAME_RDMA_CORE_SRC", &tree);
            std::env::set_var("BLUEFLAME_ORACLE_REQUIRED", "1");
            true
        }
        None => {
            eprintln!("xtask: FAILED: rdma-core's source for the oracle (tools/oracle-src)");
            false
        }
    }
}
