//! `--use_dmabuf` on rxe (the device stage of `cargo xtask test` runs the ignored tests of
//! binaries named `rxe_*` in its VM, with `BLUEFLAME_DEVICE=rxe0`): rdma-core's rxe provider
//! has no `reg_dmabuf_mr` (`ibv_reg_dmabuf_mr` answers `EOPNOTSUPP`), so bfperf refuses the
//! option, typed, naming the missing registration, before any traffic: no table row, no
//! hang. The VM's kernel has no udmabuf either (Debian's 6.1: `CONFIG_UDMABUF` not set);
//! the device's refusal is the one said, a udmabuf would not help it.

use std::process::Command;

#[test]
#[ignore = "needs an rxe device: run by cargo xtask test's device stage (or cargo xtask rxe)"]
fn use_dmabuf_is_refused_on_rxe_before_any_traffic() {
    let dev = std::env::var("BLUEFLAME_DEVICE").unwrap_or_else(|_| "rxe0".into());
    let gid = std::env::var("BLUEFLAME_GID_INDEX").unwrap_or_else(|_| "1".into());
    for test in ["write-bw", "send-lat"] {
        let out = Command::new(env!("CARGO_BIN_EXE_bfperf"))
            .args([test, "-d", &dev, "-x", &gid, "-s", "8", "-n", "100"])
            .arg("--use_dmabuf")
            .output()
            .expect("bfperf runs");
        let (text, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(1), "{test}: {text}{err}");
        assert!(
            err.contains("the device lacks dma-buf registration (ibv_reg_dmabuf_mr)"),
            "{test}: {err}"
        );
        // The header, then no result row.
        assert!(text.contains("--use_dmabuf"), "{test}: {text}");
        assert!(
            !text.lines().any(|l| l.starts_with(" 8 ")),
            "{test}: a row before the refusal: {text}"
        );
    }
}
