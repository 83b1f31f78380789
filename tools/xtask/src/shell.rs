//! What every stage of the xtask runs commands with: the workspace root, a command run there
//! with its outcome reported, and the Debian package checks.

use std::path::Path;
use std::process::Command;

/// The workspace root (commands run there).
pub(crate) fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("workspace root")
}

/// Runs `cmd` in the workspace root, saying what it is and whether it failed.
pub(crate) fn run(what: &str, cmd: &mut Command) -> bool {
    eprintln!("xtask: {what}: {cmd:?}");
    match cmd.current_dir(root()).status() {
        Ok(s) if s.success() => true,
        Ok(s) => {
            eprintln!("xtask: {what} failed ({s})");
            false
        }
        Err(e) => {
            eprintln!("xtask: {what}: cannot run: {e}");
            false
        }
    }
}

/// Whether the Debian package `pkg` is installed.
pub(crate) fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}
