//! The examples stage: every program of `examples/` run as a user runs it, on the software
//! NIC on the host (`cargo xtask examples`, a stage of `cargo xtask test`), and on rxe0 in
//! the VM of the device stage (both sides of every server/client pair on rxe0).

use crate::shell::root;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The examples (`examples/NAME.rs`); the stage fails when one is not built.
pub const EXAMPLES: &[&str] = &["pingpong", "cm", "window", "batch"];

/// How long one example may run before it counts as hung.
const LIMIT: Duration = Duration::from_secs(300);

/// Builds the examples (debug, as `cargo test` builds them) and returns their executables by
/// name, or None when the build failed or one is missing.
pub fn executables(cargo: &str) -> Option<Vec<(String, PathBuf)>> {
    let out = Command::new(cargo)
        .args([
            "build",
            "-p",
            "blueflame",
            "--examples",
            "--locked",
            "--message-format=json",
        ])
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("xtask: building the examples failed");
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let found: Vec<(String, PathBuf)> = text
        .lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"kind\":[\"example\"]")
        })
        .filter_map(|l| {
            let name = field(l, l.find("\"target\":{")?, "name")?;
            Some((name, PathBuf::from(field(l, 0, "executable")?)))
        })
        .collect();
    let missing: Vec<&str> = EXAMPLES
        .iter()
        .copied()
        .filter(|e| !found.iter().any(|(n, _)| n == e))
        .collect();
    if !missing.is_empty() {
        eprintln!("xtask: examples not built: {}", missing.join(", "));
        return None;
    }
    // "CI runs them all": an example added to examples/ but not to EXAMPLES would run nowhere.
    let unlisted: Vec<&str> = found
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !EXAMPLES.contains(n))
        .collect();
    if !unlisted.is_empty() {
        eprintln!(
            "xtask: examples no stage runs (add them to EXAMPLES): {}",
            unlisted.join(", ")
        );
        return None;
    }
    Some(found)
}

/// The string value of `"key":"..."` in the JSON line `l`, searched from `from`.
fn field(l: &str, from: usize, key: &str) -> Option<String> {
    let k = format!("\"{key}\":\"");
    let i = l[from..].find(&k)? + from + k.len();
    let j = l[i..].find('"')?;
    Some(l[i..i + j].to_owned())
}

/// The host stage: each example with its default arguments on the software NIC (no
/// `BLUEFLAME_DEVICE`, no server address; on a host without RDMA devices `open_default`
/// gives the software NIC), and `pingpong --server`, which must refuse the software NIC.
pub fn host_stage(exes: &[(String, PathBuf)]) -> bool {
    let mut ok = true;
    for (name, exe) in exes {
        if !EXAMPLES.contains(&name.as_str()) {
            continue;
        }
        ok &= run_one(name, exe, &[], Ok(()));
    }
    if let Some((_, exe)) = exes.iter().find(|(n, _)| n == "pingpong") {
        ok &= run_one(
            "pingpong --server (refused)",
            exe,
            &["--server"],
            Err(REFUSAL),
        );
    }
    ok
}

/// What `pingpong --server` says when it refuses the software NIC.
const REFUSAL: &str = "the software NIC lives inside one process";

/// Runs `exe args` on the host's software NIC; true when it succeeded (`Ok`), or (`Err(why)`)
/// exited with 1 saying `why` on its standard error: a crash, a panic or another error is not
/// the refusal the check is for.
fn run_one(what: &str, exe: &PathBuf, args: &[&str], expect: Result<(), &str>) -> bool {
    eprintln!("xtask: example {what}");
    let err_file = root().join(format!("target/example-{}.stderr", std::process::id()));
    let stderr = match expect {
        Ok(()) => Stdio::inherit(),
        Err(_) => match std::fs::File::create(&err_file) {
            Ok(f) => Stdio::from(f),
            Err(e) => {
                eprintln!("xtask: example {what}: {}: {e}", err_file.display());
                return false;
            }
        },
    };
    let child = Command::new(exe)
        .args(args)
        .stderr(stderr)
        .env_remove("BLUEFLAME_DEVICE")
        .env_remove("BLUEFLAME_SERVER_ADDR")
        .current_dir(root())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xtask: example {what}: cannot run: {e}");
            return false;
        }
    };
    let t = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t.elapsed() < LIMIT => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!("xtask: FAILED: example {what} still running after {LIMIT:?}");
                return false;
            }
            Err(e) => {
                eprintln!("xtask: example {what}: {e}");
                return false;
            }
        }
    };
    match expect {
        Ok(()) if status.success() => true,
        Ok(()) => {
            eprintln!("xtask: FAILED: example {what} exited with {status} (expected success)");
            false
        }
        Err(why) => {
            let said = std::fs::read_to_string(&err_file).unwrap_or_default();
            let _ = std::fs::remove_file(&err_file);
            eprint!("{said}");
            let refused = status.code() == Some(1) && said.contains(why);
            if !refused {
                eprintln!(
                    "xtask: FAILED: example {what} exited with {status} (expected 1, saying \"{why}\")"
                );
            }
            refused
        }
    }
}

/// Shell commands for the rxe VM (`BLUEFLAME_DEVICE=rxe0`, `BLUEFLAME_SERVER_ADDR` =
/// rxe0's address): each example in one process, then every server/client pair as two
/// processes on rxe0. Each run prints `=== example WHAT` and then `EXAMPLE OK` or
/// `EXAMPLE FAILED`, and sets `rc=1` on failure.
pub fn vm_commands(exes: &[(String, PathBuf)]) -> String {
    let exe = |n: &str| {
        exes.iter()
            .find(|(name, _)| name == n)
            .map(|(_, p)| p.display().to_string())
    };
    let mut cmd = String::new();
    let mut add = |what: &str, line: String| {
        cmd.push_str(&format!(
            "echo '=== example {what}'; if {line}; then echo 'EXAMPLE OK'; else echo 'EXAMPLE FAILED'; rc=1; fi; "
        ));
    };
    let t = LIMIT.as_secs();
    // pingpong: 200 round trips (a round trip on rxe under emulation is milliseconds).
    let args = |name: &str| {
        if name == "pingpong" {
            " --iters 200"
        } else {
            ""
        }
    };
    for name in EXAMPLES {
        if let Some(e) = exe(name) {
            add(name, format!("timeout {t} {e}{}", args(name)));
        }
    }
    // Server and client as two processes; the client retries while the server starts.
    for (name, client) in [
        ("pingpong", "--client $BLUEFLAME_SERVER_ADDR"),
        ("cm", "--client"),
    ] {
        if let Some(e) = exe(name) {
            add(
                &format!("{name} --server / {client}"),
                format!(
                    "( timeout {t} {e} --server{a} & s=$!; timeout {t} {e} {client}{a}; c=$?; \
                     wait $s; s=$?; [ $c = 0 ] && [ $s = 0 ] )",
                    a = args(name)
                ),
            );
        }
    }
    cmd
}

/// Reads the VM log of [`vm_commands`]: prints one line per run, true when every run of
/// `exes` reported `EXAMPLE OK`.
pub fn vm_summary(log: &str, exes: &[(String, PathBuf)]) -> bool {
    let mut ok = true;
    let mut runs = 0;
    for part in log.split("=== example ").skip(1) {
        runs += 1;
        let name = part.lines().next().unwrap_or("?");
        let passed = part.lines().any(|l| l == "EXAMPLE OK");
        println!("  example {name}: {}", if passed { "ok" } else { "FAILED" });
        ok &= passed;
    }
    let expected = EXAMPLES
        .iter()
        .filter(|n| exes.iter().any(|(e, _)| e == *n))
        .count()
        + 2;
    if runs != expected {
        eprintln!("xtask: {runs} example runs in the VM, expected {expected}");
        ok = false;
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exes() -> Vec<(String, PathBuf)> {
        EXAMPLES
            .iter()
            .map(|n| (n.to_string(), PathBuf::from(format!("/t/examples/{n}"))))
            .collect()
    }

    #[test]
    fn the_vm_runs_every_example_and_both_pairs_on_rxe0() {
        let cmd = vm_commands(&exes());
        for n in EXAMPLES {
            assert!(cmd.contains(&format!("=== example {n}'")), "{n} missing");
        }
        // Server and client are two processes, the client pointed at rxe0's address.
        assert!(cmd.contains("/t/examples/pingpong --server --iters 200 & s=$!"));
        assert!(cmd.contains("/t/examples/pingpong --client $BLUEFLAME_SERVER_ADDR --iters 200"));
        assert!(
            cmd.contains("/t/examples/cm --server & s=$!; timeout 300 /t/examples/cm --client;")
        );
        // A failure of either side marks the run failed and the stage's exit code.
        assert_eq!(cmd.matches("rc=1").count(), EXAMPLES.len() + 2);
        assert!(cmd.contains("wait $s; s=$?; [ $c = 0 ] && [ $s = 0 ]"));
    }

    #[test]
    fn the_summary_fails_on_a_failed_or_missing_run() {
        let run = |name: &str, ok: bool| {
            format!(
                "=== example {name}\nsome output\n{}\n",
                if ok { "EXAMPLE OK" } else { "EXAMPLE FAILED" }
            )
        };
        let names = [
            "pingpong",
            "cm",
            "window",
            "batch",
            "pingpong --server / --client",
            "cm --server / --client",
        ];
        let all: String = names.iter().map(|n| run(n, true)).collect();
        assert!(vm_summary(&all, &exes()));
        let one_failed: String = names.iter().map(|n| run(n, *n != "window")).collect();
        assert!(!vm_summary(&one_failed, &exes()));
        let one_missing: String = names[1..].iter().map(|n| run(n, true)).collect();
        assert!(!vm_summary(&one_missing, &exes()));
        // "EXAMPLE OK" in another line's text is not a pass.
        let fake = all.replace(
            "EXAMPLE OK\n=== example batch",
            "echo EXAMPLE OK\n=== example batch",
        );
        assert!(!vm_summary(&fake, &exes()));
        assert!(!vm_summary("", &exes()));
    }

    /// The refusal check takes the refusal only: not a crash, a panic or a usage error.
    #[test]
    fn a_crash_is_not_the_refusal() {
        let sh = PathBuf::from("/bin/sh");
        let crash = ["-c", "kill -SEGV $$"];
        assert!(!run_one("crash", &sh, &crash, Err(REFUSAL)));
        let panic = ["-c", "echo 'panicked at src/main.rs' >&2; exit 101"];
        assert!(!run_one("panic", &sh, &panic, Err(REFUSAL)));
        let usage = [
            "-c",
            "echo 'pingpong: usage: pingpong [--server]' >&2; exit 1",
        ];
        assert!(!run_one("usage", &sh, &usage, Err(REFUSAL)));
        let refused = format!("echo 'pingpong: {REFUSAL}: run without' >&2; exit 1");
        assert!(run_one("refusal", &sh, &["-c", &refused], Err(REFUSAL)));
    }

    #[test]
    fn json_fields_are_read_from_cargo_messages() {
        let l = r#"{"reason":"compiler-artifact","target":{"kind":["example"],"name":"batch"},"executable":"/w/target/debug/examples/batch"}"#;
        assert_eq!(
            field(l, l.find("\"target\":{").unwrap(), "name").as_deref(),
            Some("batch")
        );
        assert_eq!(
            field(l, 0, "executable").as_deref(),
            Some("/w/target/debug/examples/batch")
        );
        assert_eq!(field(l, 0, "missing"), None);
    }
}
