//! The rxe stage: a small VM (Debian kernel with `rdma_rxe`, qemu without KVM, the host's
//! root filesystem shared read-only by virtme-ng) with one Soft-RoCE device, `rxe0`, on a
//! veth pair; commands run inside with `BLUEFLAME_DEVICE=rxe0`.

use crate::{installed, is_root, root, run};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Debian packages the VM needs (besides the host build's), installed with
/// `--no-install-recommends`: their recommends are a desktop and media stack (qemu's GUI,
/// OVMF, qemu-utils, GStreamer, Mesa, firmware, AppArmor, ...) that the VM never uses.
/// Checked on a running VM: every file qemu has mapped or open belongs to a package of the
/// no-recommends closure (`apt-get -s --no-install-recommends install` with an empty dpkg
/// status), and inside the VM only bash, coreutils, kmod (modprobe) and iproute2 (ip,
/// rdma) run besides the tests.
const PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "linux-image-amd64",
    "busybox-static",
    "rdma-core",
    "ibverbs-utils",
    "ibverbs-providers",
    "perftest",
    "rdmacm-utils",
    "iproute2",
    "kmod",
];

/// virtme-ng, from PyPI (boots a kernel with the host's filesystem).
const VNG: &str = "virtme-ng==1.42";

/// Installs what the VM needs, when missing.
pub fn deps() -> bool {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        if !is_root() {
            eprintln!(
                "xtask: the rxe VM needs: apt-get install -y --no-install-recommends {}",
                missing.join(" ")
            );
            return false;
        }
        let ok = run(
            "apt-get update",
            Command::new("apt-get").args(["update", "-q"]),
        ) && run(
            "apt-get install (rxe VM)",
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing),
        );
        if !ok {
            return false;
        }
    }
    vng().is_some()
        || (run(
            "pip install virtme-ng",
            Command::new("python3").args(["-m", "pip", "install", "-q", VNG]),
        ) && vng().is_some())
}

/// The `vng` program: on PATH, or in the scripts directory of the Python that installed it
/// (a pyenv shim may not exist until a rehash).
fn vng() -> Option<PathBuf> {
    let works = |p: &Path| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(Path::new("vng")) {
        return Some(PathBuf::from("vng"));
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("vng");
    works(&p).then_some(p)
}

/// The newest Debian kernel under /boot that has the rdma_rxe module.
fn kernel() -> Option<(PathBuf, String)> {
    let mut found: Vec<(PathBuf, String)> = std::fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ver = name.strip_prefix("vmlinuz-")?.to_owned();
            let module = Path::new("/lib/modules")
                .join(&ver)
                .join("kernel/drivers/infiniband/sw/rxe");
            module.exists().then_some((e.path(), ver))
        })
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1));
    found.pop()
}

/// The script run inside the VM: rxe0 on veth0 (10.77.0.1/24), then, once the kernel has put
/// the RoCE v2 IPv4 GID in rxe0's table (`BLUEFLAME_GID_INDEX` is its index, 1 when the
/// table was filled in order), `cmd`; its exit code goes to `out/exit`.
fn script(out: &Path, cmd: &str) -> String {
    format!(
        r#"#!/bin/bash
exec > {out}/vm.log 2>&1
set -x
modprobe rdma_rxe || {{ echo 90 > {out}/exit; exit 0; }}
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.77.0.1/24 dev veth0
ip link set veth0 up
ip link set veth1 up
rdma link add rxe0 type rxe netdev veth0 || {{ echo 91 > {out}/exit; exit 0; }}
# The kernel fills rxe0's GID table from a work queue after `rdma link add` returns: wait
# (up to 60 s) for 10.77.0.1's RoCE v2 GID and use the index it got.
set +x
port=/sys/class/infiniband/rxe0/ports/1
gid=
for try in $(seq 600); do
  for f in $port/gids/*; do
    i=${{f##*/}}
    if [ "$(cat $f 2>/dev/null)" = "{ipv4_gid}" ] \
      && [ "$(cat $port/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ]; then
      gid=$i; break 2
    fi
  done
  sleep 0.1
done
set -x
echo "rxe0: IPv4 GID index '$gid' after $try polls"
[ -n "$gid" ] || {{ cat $port/gids/* $port/gid_attrs/types/* || true; echo 92 > {out}/exit; exit 0; }}
export BLUEFLAME_DEVICE=rxe0 BLUEFLAME_GID_INDEX=$gid BLUEFLAME_SERVER_ADDR=10.77.0.1
# A few 2 MiB huge pages for tests/rxe/rxe_memory.rs (the VM's kernel is thrown away).
echo 8 > /proc/sys/vm/nr_hugepages || true
cd {root}
set +x
( {cmd} ) > {out}/cmd.log 2>&1
echo $? > {out}/exit
"#,
        out = out.display(),
        root = root().display(),
        ipv4_gid = IPV4_GID,
    )
}

/// The lock that serialises VM boots across checkouts on one machine (see `run_in_vm`).
const VM_LOCK: &str = "/tmp/blueflame-rxe-vm.lock";

/// rxe0's RoCE v2 GID for 10.77.0.1 as sysfs prints it (`::ffff:10.77.0.1`).
const IPV4_GID: &str = "0000:0000:0000:0000:0000:ffff:0a4d:0001";

/// Boots the VM once, runs `cmd` (a shell command line) inside, and returns its exit code
/// with its output. `None` when the VM did not run it.
pub fn run_in_vm(cmd: &str) -> Option<(i32, String)> {
    if !deps() {
        return None;
    }
    let Some((kernel, ver)) = kernel() else {
        eprintln!("xtask: no kernel with rdma_rxe under /boot (install linux-image-amd64)");
        return None;
    };
    let out = root().join("target/rxe");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).ok()?;
    let sh = out.join("run.sh");
    std::fs::write(&sh, script(&out, cmd)).ok()?;
    eprintln!("xtask: booting the rxe VM (kernel {ver}, no KVM) ...");
    let t = Instant::now();
    let Some(vng) = vng() else {
        eprintln!("xtask: vng (virtme-ng) not found after installing it");
        return None;
    };
    // The VM's console goes to a file: it is noise unless the boot fails.
    let console = out.join("console.log");
    let ok = match std::fs::File::create(&console) {
        Ok(f) => run(
            "rxe VM",
            // One VM at a time on a machine: virtme-ng gives every qemu the same QMP port
            // (3636), so a second boot fails while one runs, and two emulated VMs on two
            // cores would time each other's latency tests. `flock` queues the boots.
            Command::new("flock")
                .arg(VM_LOCK)
                .arg(vng)
                .arg("--run")
                .arg(&kernel)
                .args(["--disable-kvm", "--memory", "2G", "--cpus", "2", "--rwdir"])
                .arg(&out)
                .arg("--exec")
                .arg(format!("bash {}", sh.display()))
                .stdin(std::process::Stdio::null())
                .stdout(
                    f.try_clone()
                        .map(std::process::Stdio::from)
                        .unwrap_or_else(|_| std::process::Stdio::null()),
                )
                .stderr(std::process::Stdio::from(f)),
        ),
        Err(_) => false,
    };
    if !ok {
        eprintln!(
            "xtask: VM console:\n{}",
            std::fs::read_to_string(&console).unwrap_or_default()
        );
    }
    eprintln!("xtask: the VM ran for {:.1} s", t.elapsed().as_secs_f64());
    let code = std::fs::read_to_string(out.join("exit"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let log = std::fs::read_to_string(out.join("cmd.log")).unwrap_or_default();
    match code {
        Some(90) | Some(91) | Some(92) => {
            eprintln!(
                "xtask: rxe set-up failed in the VM:\n{}",
                std::fs::read_to_string(out.join("vm.log")).unwrap_or_default()
            );
            None
        }
        Some(c) if ok => Some((c, log)),
        _ => {
            eprintln!(
                "xtask: the VM did not run the command (no exit code in {})",
                out.display()
            );
            None
        }
    }
}

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
    match run_in_vm(&cmd) {
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
    // icount stage before).
    cmd.push_str(&crate::rxe_icount::script());
    cmd.push_str("exit $rc");
    let Some((code, log)) = run_in_vm(&cmd) else {
        eprintln!("xtask: FAILED: the rxe stage did not run");
        return false;
    };
    println!("{log}");
    let icount_ok = crate::rxe_icount::report();
    if !icount_ok {
        eprintln!("xtask: FAILED: the verbs path's instruction counts (rxe-icount)");
    }
    println!("xtask: rxe stage summary:");
    summary(&log, runs.len(), examples) && code == 0 && icount_ok
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
    let Some((code, log)) = run_in_vm(&cmd) else {
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

    /// The command runs only once rxe0's table holds 10.77.0.1's RoCE v2 GID, and with that
    /// GID's index (the kernel adds GIDs from a work queue after `rdma link add` returns: a
    /// test that read index 1 before then had no usable address).
    #[test]
    fn the_command_waits_for_the_ipv4_gid_and_uses_its_index() {
        let s = script(Path::new("/o"), "CMD");
        let wait = s.find(IPV4_GID).expect("the script looks for the IPv4 GID");
        let export = s
            .find("BLUEFLAME_GID_INDEX=$gid")
            .expect("its index is exported");
        let run = s.find("( CMD )").expect("the command");
        assert!(s.find("rdma link add").unwrap() < wait && wait < export && export < run);
        assert!(s.contains("echo 92 > /o/exit"), "no GID: the set-up fails");
        assert!(!s.contains("BLUEFLAME_GID_INDEX=1 "), "no hard-coded index");
        let gid: Vec<u8> = IPV4_GID
            .split(':')
            .flat_map(|h| u16::from_str_radix(h, 16).unwrap().to_be_bytes())
            .collect();
        let ip = std::net::Ipv4Addr::new(10, 77, 0, 1).to_ipv6_mapped();
        assert_eq!(gid, ip.octets());
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
