//! The rxe stage: every device test binary and example run in the rxe VM ([`crate::vm`]),
//! one test module at a time, and rxe-icount's counts taken in the same boot.

use crate::vm::run_in_vm;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `cargo xtask rxe -- COMMAND...`
pub fn main(args: &[String]) -> i32 {
    let args: Vec<&String> = args.iter().skip_while(|a| *a == "--").collect();
    if args.is_empty() {
        eprintln!("usage: cargo xtask rxe -- COMMAND [ARGS...]   (runs inside the rxe VM, BLUEFLAME_DEVICE=rxe0)");
        return 2;
    }
    let cmd = args
        .iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ");
    match run_in_vm(&cmd, crate::vm::LONG_SECS) {
        Some((code, log)) => {
            print!("{log}");
            code
        }
        None => 1,
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// One run of the device stage: the label its log section starts with, a test binary, and
/// the test-name filter that selects one module of it (`rxe_verbs::`), if it has modules.
struct Run {
    label: String,
    exe: PathBuf,
    filter: Option<String>,
}

/// The device stage's runs: one per module of the integration test binary `rxe` (and of any
/// binary named `rxe_*`) among `all` (the workspace's test executables,
/// [`crate::test_executables`], built on the host), so that each module runs in a process of
/// its own, as when each was its own binary. The modules are those of the binary's ignored
/// tests (the device tests), listed on the host; a binary whose tests are not in modules is
/// one run. `None` when a binary cannot list its tests.
fn device_runs(all: &[(String, String)]) -> Option<Vec<Run>> {
    let mut bins: Vec<(&str, PathBuf)> = all
        .iter()
        .filter(|(name, _)| name == "rxe" || name.starts_with("rxe_"))
        .map(|(name, exe)| (name.as_str(), PathBuf::from(exe)))
        .collect();
    bins.sort();
    bins.dedup();
    let mut runs = Vec::new();
    for (name, exe) in bins {
        let out = Command::new(&exe)
            .args(["--list", "--ignored", "--format=terse"])
            .output();
        let list = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            _ => {
                eprintln!("xtask: {} --list failed", exe.display());
                return None;
            }
        };
        runs.extend(runs_of(name, &exe, &list));
    }
    Some(runs)
}

/// The runs of one binary from its list of ignored tests (`--list --format=terse` lines,
/// `module::test: test`): one per module, by name, or the whole binary when a test is
/// outside a module.
fn runs_of(name: &str, exe: &Path, list: &str) -> Vec<Run> {
    let tests: Vec<&str> = list
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    let modules: Option<Vec<&str>> = tests
        .iter()
        .map(|t| t.split_once("::").map(|(m, _)| m))
        .collect();
    let Some(mut modules) = modules.filter(|m| !m.is_empty()) else {
        return vec![Run {
            label: name.to_owned(),
            exe: exe.to_owned(),
            filter: None,
        }];
    };
    modules.sort_unstable();
    modules.dedup();
    modules
        .into_iter()
        .map(|m| Run {
            label: format!("{name} {m}"),
            exe: exe.to_owned(),
            filter: Some(format!("{m}::")),
        })
        .collect()
}

/// The device stage of `cargo xtask test`: every run of [`device_runs`] (a module of the
/// `rxe` test binary, ignored tests included, in a process of its own), then every example
/// (`examples`, see [`crate::examples::vm_commands`]), in one VM boot. Fails when the VM did
/// not run, a run failed, ran no test, or skipped, or an example failed.
pub fn device_stage(all: &[(String, String)], examples: &[(String, PathBuf)]) -> bool {
    let Some(runs) = device_runs(all) else {
        return false;
    };
    if runs.is_empty() {
        eprintln!("xtask: no rxe device tests found: the rxe stage has nothing to run");
        return false;
    }
    let mut cmd = String::from("rc=0; ");
    for r in &runs {
        cmd.push_str(&format!(
            "echo '=== {}'; timeout 900 {} --ignored --test-threads=1 --nocapture{} || rc=1; ",
            r.label,
            r.exe.display(),
            r.filter
                .as_deref()
                .map(|f| format!(" {}", shell_quote(f)))
                .unwrap_or_default()
        ));
    }
    cmd.push_str(&crate::examples::vm_commands(examples));
    // The verbs path's instruction counts, in the same boot (bfperf was built by the
    // icount stage before), bfperf against perftest, and bfperf against bfperf (the options
    // the software NIC cannot run across two processes).
    cmd.push_str(&crate::rxe_icount::script());
    cmd.push_str(&crate::interop::script());
    cmd.push_str(&crate::bfperf_pairs::script());
    cmd.push_str("exit $rc");
    let Some((code, log)) = run_in_vm(&cmd, crate::vm::STAGE_SECS) else {
        eprintln!("xtask: FAILED: the rxe stage did not run");
        return false;
    };
    println!("{log}");
    let icount_ok = crate::rxe_icount::report();
    if !icount_ok {
        eprintln!("xtask: FAILED: the verbs path's instruction counts (rxe-icount)");
    }
    println!("xtask: rxe stage summary:");
    let interop_ok = crate::interop::report(&log);
    if !interop_ok {
        eprintln!("xtask: FAILED: bfperf against perftest (interop)");
    }
    let pairs_ok = crate::bfperf_pairs::report(&log);
    if !pairs_ok {
        eprintln!("xtask: FAILED: bfperf against bfperf across two processes (interop)");
    }
    summary(&log, runs.len(), examples) && code == 0 && icount_ok && interop_ok && pairs_ok
}

/// Reads the device stage's log: `bins` runs of test binaries (each must have run tests and
/// skipped none), then the examples' runs ([`crate::examples::vm_summary`]). Prints one line
/// each.
fn summary(log: &str, bins: usize, examples: &[(String, PathBuf)]) -> bool {
    let mut ok = true;
    let (tests_log, examples_log) = log
        .split_once("=== example ")
        .map_or((log, String::new()), |(t, e)| {
            (t, format!("=== example {e}"))
        });
    for part in tests_log.split("=== ").skip(1) {
        let name = part.lines().next().unwrap_or("?");
        let result = part
            .lines()
            .rfind(|l| l.starts_with("test result:"))
            .unwrap_or("no result line");
        let ran = result
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0);
        let skipped = part.contains("SKIPPED");
        println!(
            "  {name}: {result}{}",
            if skipped { " (SKIPPED: no device)" } else { "" }
        );
        if ran == 0 || skipped {
            ok = false;
        }
    }
    if tests_log.split("=== ").count() - 1 != bins {
        eprintln!("xtask: not every device-test run ran in the VM");
        ok = false;
    }
    ok &= crate::examples::vm_summary(&examples_log, examples);
    ok
}

/// `cargo xtask rxe-examples`: only the examples, on rxe0, in one VM boot.
pub fn examples_stage(examples: &[(String, PathBuf)]) -> bool {
    let cmd = format!("rc=0; {}exit $rc", crate::examples::vm_commands(examples));
    let Some((code, log)) = run_in_vm(&cmd, crate::vm::STAGE_SECS) else {
        eprintln!("xtask: FAILED: the rxe VM did not run the examples");
        return false;
    };
    println!("{log}");
    println!("xtask: examples on rxe0:");
    crate::examples::vm_summary(&log, examples) && code == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> Vec<(String, PathBuf)> {
        crate::examples::EXAMPLES
            .iter()
            .map(|n| (n.to_string(), PathBuf::from(n)))
            .collect()
    }

    fn examples_log(failed: Option<&str>) -> String {
        let mut names: Vec<String> = crate::examples::EXAMPLES
            .iter()
            .map(|n| n.to_string())
            .collect();
        names.push("pingpong --server / --client".into());
        names.push("cm --server / --client".into());
        names
            .iter()
            .map(|n| {
                let verdict = if Some(n.as_str()) == failed {
                    "EXAMPLE FAILED"
                } else {
                    "EXAMPLE OK"
                };
                format!("=== example {n}\n{verdict}\n")
            })
            .collect()
    }

    /// A binary with modules runs once per module (a filter that selects that module only:
    /// `rxe_verbs::` is not a prefix of `rxe_verbs_api::`); one without runs whole.
    #[test]
    fn each_module_of_the_device_tests_runs_on_its_own() {
        let exe = Path::new("/t/rxe-1");
        let list =
            "rxe_verbs_api::b: test\nrxe_cm::a: test\nrxe_verbs::c: test\nrxe_verbs::d: test\n";
        let runs = runs_of("rxe", exe, list);
        let got: Vec<(&str, Option<&str>)> = runs
            .iter()
            .map(|r| (r.label.as_str(), r.filter.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("rxe rxe_cm", Some("rxe_cm::")),
                ("rxe rxe_verbs", Some("rxe_verbs::")),
                ("rxe rxe_verbs_api", Some("rxe_verbs_api::")),
            ]
        );
        assert!(runs.iter().all(|r| r.exe == exe));
        let whole = runs_of("rxe_cm", exe, "connect: test\n");
        assert_eq!(whole.len(), 1);
        assert_eq!(
            (whole[0].label.as_str(), whole[0].filter.as_deref()),
            ("rxe_cm", None)
        );
        // No ignored test: one run, which the summary then finds ran nothing.
        assert_eq!(runs_of("rxe", exe, "").len(), 1);
    }

    #[test]
    fn the_stage_needs_every_test_binary_and_every_example() {
        let tests = "=== rxe_a-1\ntest result: ok. 3 passed; 0 failed\n=== rxe_b-2\ntest result: ok. 1 passed; 0 failed\n";
        let ex = examples();
        assert!(summary(&format!("{tests}{}", examples_log(None)), 2, &ex));
        // A failed example, or no examples at all, fails the stage.
        assert!(!summary(
            &format!("{tests}{}", examples_log(Some("window"))),
            2,
            &ex
        ));
        assert!(!summary(tests, 2, &ex));
        // A binary that ran no test or skipped, or a missing binary, fails it too.
        let none = tests.replace("1 passed", "0 passed");
        assert!(!summary(&format!("{none}{}", examples_log(None)), 2, &ex));
        let skipped = tests.replace("=== rxe_b-2\n", "=== rxe_b-2\nSKIPPED\n");
        assert!(!summary(
            &format!("{skipped}{}", examples_log(None)),
            2,
            &ex
        ));
        assert!(!summary(&format!("{tests}{}", examples_log(None)), 3, &ex));
    }
}
