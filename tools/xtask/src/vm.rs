//! The rxe VM: a small VM (Debian kernel with `rdma_rxe`, qemu without KVM, the host's root
//! filesystem shared read-only by virtme-ng) with one Soft-RoCE device, `rxe0`, on a veth
//! pair: its packages, its kernel, and one command run inside it with
//! `BLUEFLAME_DEVICE=rxe0` ([`run_in_vm`]), for the rxe stage, rxe-icount and compare.

use crate::shell::{apt_get, installed, is_root, root, run};
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
        let ok = apt_get("apt-get update", &["update", "-q"])
            && apt_get(
                "apt-get install (rxe VM)",
                &[
                    ["install", "-y", "-q", "--no-install-recommends"].as_slice(),
                    &missing,
                ]
                .concat(),
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

/// The longest a stage's VM run may take, boot and commands included (the device stage's
/// boot ran 174 s in CI, 233 s with its commands; every command inside has a `timeout` of
/// its own, but their limits add up to hours, past CI's 90 minutes): past it the VM is
/// killed and the stage fails with the output the VM wrote so far, instead of CI being
/// stopped with none.
pub const STAGE_SECS: u64 = 2400;

/// The limit of a developer's long VM runs (`cargo xtask rxe -- COMMAND`, `rxe-compare`).
pub const LONG_SECS: u64 = 6 * 3600;

/// How long a boot waits for another checkout's VM to end (`flock -w`).
const LOCK_SECS: u64 = 900;

/// `flock`'s exit code when the lock was not had in time.
const LOCK_BUSY: i32 = 75;

/// rxe0's RoCE v2 GID for 10.77.0.1 as sysfs prints it (`::ffff:10.77.0.1`).
const IPV4_GID: &str = "0000:0000:0000:0000:0000:ffff:0a4d:0001";

/// Boots the VM once, runs `cmd` (a shell command line) inside for at most `limit_secs`
/// (the lock's wait included), and returns its exit code with its output. `None` when the
/// VM did not run it.
pub fn run_in_vm(cmd: &str, limit_secs: u64) -> Option<(i32, String)> {
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
            // Bounded: `timeout` kills its whole process group (flock, vng, qemu). That
            // group is its own (`timeout` calls setpgid), out of reach of a Ctrl-C or of
            // `.ci/run`'s own `timeout`, which end xtask only: `setpriv --pdeathsig` has
            // `timeout` told (SIGTERM, which it passes on to its group) when xtask dies.
            Command::new("setpriv")
                .args(["--pdeathsig", "TERM", "timeout"])
                .args(["--kill-after=30", &limit_secs.to_string(), "flock", "-w"])
                .arg(LOCK_SECS.to_string())
                .args(["-E", &LOCK_BUSY.to_string()])
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
            "xtask: VM console:\n{}\nxtask: (exit 124: the VM ran past {limit_secs} s and was \
             killed; {LOCK_BUSY}: another VM held {VM_LOCK} for {LOCK_SECS} s)\n\
             xtask: what the VM's commands printed so far:\n{}",
            std::fs::read_to_string(&console).unwrap_or_default(),
            std::fs::read_to_string(out.join("cmd.log")).unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
