//! The provider stage of `cargo xtask test` (`cargo xtask provider` alone): the direct-path
//! scenarios through rdma-core's own libmlx5, in front of the software NIC.
//!
//! The `provider` test binary runs with the kernel model preloaded
//! (`LD_PRELOAD=libkernel_model.so`, `tools/kernel-model`): Debian's unmodified libibverbs
//! and libmlx5 find a ConnectX-6 named `mlx5_0`, create every object through the kernel's
//! write ABI, and the crate takes them over with `mlx5dv_init_obj` as on hardware. The stage
//! passes when the binary's summary line `provider stage: N passed, M failed` says M = 0
//! and N > 0, and fails when the line is missing (the stage did not run).

use crate::shell::{root, run};
use std::path::Path;
use std::process::Command;

/// Builds the kernel model and runs the `provider` test binary (from `bins`, the workspace's
/// test executables) with it preloaded.
pub(crate) fn stage(cargo: &str, bins: &[(String, String)]) -> bool {
    if !build_model(cargo) {
        return false;
    }
    let Some((_, exe)) = bins.iter().find(|(name, _)| name == "provider") else {
        eprintln!("xtask: FAILED: no provider test binary was built");
        return false;
    };
    let Some(lib) = model_lib(exe) else {
        eprintln!("xtask: FAILED: libkernel_model.so not found beside {exe}");
        return false;
    };
    eprintln!(
        "xtask: provider stage: {exe} with LD_PRELOAD={}",
        lib.display()
    );
    let out = match preloaded(&mut Command::new(exe), &lib).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xtask: FAILED: cannot run {exe}: {e}");
            return false;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    match summary(&text) {
        Some((passed, 0)) if passed > 0 && out.status.success() => {
            eprintln!("xtask: provider stage: {passed} passed, 0 failed");
            lib_cases(bins, &lib)
        }
        Some((passed, failed)) => {
            eprintln!("xtask: FAILED: provider stage: {passed} passed, {failed} failed");
            false
        }
        None => {
            eprintln!("xtask: FAILED: the provider stage did not run (no summary line)");
            false
        }
    }
}

/// The crate's own unit tests that need an rdma-core device of the kernel model (ignored
/// in a plain `cargo test`): they reach crate-private code, which the `provider` binary
/// cannot.
const LIB_CASES: &[&str] = &[
    "model_cases::connections_on_one_context_share_their_async_events",
    "model_cases::a_provider_that_refuses_midway_with_zero_loses_no_request",
    "model_cases::a_doorbell_that_fails_after_the_provider_took_the_requests_loses_none",
    "model_cases::on_rxe_a_doorbell_that_fails_in_wr_complete_loses_no_request",
    "model_cases::a_refused_straight_post_leaves_the_send_queue_as_it_was",
    "model_cases::on_iwarp_a_request_after_a_read_is_fenced",
    "model_cases::a_type1_bind_on_the_verbs_path_is_fenced_as_asked",
    "model_cases::on_rxe_a_type1_bind_through_a_failed_doorbell_is_posted",
    "model_cases::a_verbs_batch_past_64_requests_says_so",
    "model_cases::a_completion_of_a_qp_attached_after_the_polls_check_is_reported",
    "model_cases::a_failed_poll_gives_no_dropped_qps_entries_back",
    "model_cases::the_verbs_poller_retires_only_after_ibv_end_poll",
    "model_cases::a_dropped_first_qps_send_queue_keeps_no_region_parked",
    "model_cases::a_completion_read_before_its_qp_was_dropped_and_its_number_reused_is_not_the_new_qps",
    "model_cases::a_completion_of_a_qp_that_took_a_dropped_qps_number_in_the_window_is_its_own",
    "model_cases::a_completion_of_the_old_qp_read_with_the_new_one_in_the_list_is_the_old_ones",
    "model_cases::a_completion_of_a_qp_that_took_the_number_of_one_without_its_queue_on_the_cq_is_its_own",
    "model_cases::a_verbs_receive_of_one_entry_after_one_of_two_has_one_entry",
    "model_cases::a_straight_post_waits_for_connect_a_queued_batch_and_an_armed_fence",
];

/// Runs [`LIB_CASES`] from the library's unit-test binary with the kernel model `lib`
/// preloaded; false unless each ran and passed.
fn lib_cases(bins: &[(String, String)], lib: &Path) -> bool {
    let Some((_, exe)) = bins.iter().find(|(name, _)| name == "blueflame") else {
        eprintln!("xtask: FAILED: no unit-test binary of blueflame was built");
        return false;
    };
    for case in LIB_CASES {
        eprintln!(
            "xtask: provider stage, unit test {case} (LD_PRELOAD={})",
            lib.display()
        );
        let out = preloaded(&mut Command::new(exe), lib)
            .args(["--ignored", "--exact", case])
            .output();
        let text = out.as_ref().map(|o| String::from_utf8_lossy(&o.stdout));
        match (&out, &text) {
            (Ok(o), Ok(t)) if o.status.success() && t.contains(" 1 passed;") => {}
            _ => {
                // A renamed test would run nothing and "pass": that fails too.
                eprintln!("xtask: FAILED: unit test {case} with the kernel model: {out:?}");
                return false;
            }
        }
    }
    true
}

/// Builds the kernel model (`target/debug/libkernel_model.so`); false when the build failed.
pub(crate) fn build_model(cargo: &str) -> bool {
    run(
        "build the kernel model",
        Command::new(cargo).args(["build", "-p", "kernel-model", "--locked"]),
    )
}

/// The kernel model built beside the provider binary `exe`
/// (target/debug/deps/provider-HASH -> target/debug/libkernel_model.so), if it is there.
pub(crate) fn model_lib(exe: &str) -> Option<std::path::PathBuf> {
    Path::new(exe)
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("libkernel_model.so"))
        .filter(|p| p.exists())
}

/// `cmd` (the provider binary, or valgrind running it) set up as both runs need it: the
/// kernel model `lib` preloaded, no simulated sysfs or device choice from the caller's
/// environment (the model's `mlx5_0` is the device), run from the workspace root.
pub(crate) fn preloaded<'a>(cmd: &'a mut Command, lib: &Path) -> &'a mut Command {
    cmd.env("LD_PRELOAD", lib)
        .env_remove("SYSFS_PATH")
        .env_remove("BLUEFLAME_DEVICE")
        .current_dir(root())
}

/// The last `provider stage: N passed, M failed` line of the binary's output, as (N, M).
pub(crate) fn summary(text: &str) -> Option<(u32, u32)> {
    text.lines().rev().find_map(|l| {
        let rest = l.strip_prefix("provider stage: ")?;
        let (p, rest) = rest.split_once(" passed, ")?;
        let (f, _) = rest.split_once(" failed")?;
        Some((p.parse::<u32>().ok()?, f.parse::<u32>().ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::summary;

    #[test]
    fn the_summary_line_is_read_with_or_without_failed_names() {
        let ok = "test a ... ok\nprovider stage: 68 passed, 0 failed\n";
        assert_eq!(summary(ok), Some((68, 0)));
        let bad = "provider stage: 3 passed, 2 failed (a, b)\n";
        assert_eq!(summary(bad), Some((3, 2)));
        assert_eq!(summary("provider stage: skipped: no mlx5_0"), None);
    }
}
