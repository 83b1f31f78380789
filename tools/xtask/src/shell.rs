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

/// `apt-get ARGS` as root, non-interactive, waiting up to 5 minutes for dpkg's lock (another
/// apt or dpkg on the machine: apt-get's own default is to fail at once), tried up to three
/// times, 30 s apart, with an `apt-get update` before each retry of an install (a mirror
/// caught mid-sync, "Hash Sum mismatch", a registry that dropped the connection: apt's own
/// `Acquire::Retries` retries one file, not a run whose index is stale). Every failure says
/// which try it was; the last says that it was the registry or the lock, not the crate.
pub(crate) fn apt_get(what: &str, args: &[&str]) -> bool {
    const TRIES: u32 = 3;
    for attempt in 1..=TRIES {
        if attempt > 1 {
            eprintln!("xtask: {what}: try {attempt} of {TRIES} in 30 s");
            std::thread::sleep(std::time::Duration::from_secs(30));
            if args.first() == Some(&"install") {
                let _ = apt_once("apt-get update (before a retry)", &["update", "-q"]);
            }
        }
        if apt_once(what, args) {
            return true;
        }
    }
    eprintln!(
        "xtask: FAILED: {what} failed {TRIES} times: Debian's registry or dpkg's lock, not \
         a defect of the crate; run `cargo xtask deps` again"
    );
    false
}

fn apt_once(what: &str, args: &[&str]) -> bool {
    run(
        what,
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-o", "DPkg::Lock::Timeout=300"])
            .args(args),
    )
}
