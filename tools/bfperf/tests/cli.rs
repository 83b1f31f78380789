//! The command line as a new user meets it after `cargo install --path tools/bfperf`.

use std::process::Command;

fn bfperf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bfperf"))
        .args(args)
        .output()
        .expect("bfperf runs")
}

#[test]
fn help_is_asked_for_usage_on_stdout_and_success() {
    for flag in ["--help", "-h", "help"] {
        let out = bfperf(&[flag]);
        assert!(out.status.success(), "{flag}: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("usage: bfperf <write-lat"),
            "{flag}: {text}"
        );
        assert!(text.contains("--device"), "{flag}: {text}");
    }
}

#[test]
fn a_missing_or_unknown_test_is_a_usage_error() {
    for args in [&[][..], &["write-latency"][..]] {
        let out = bfperf(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage: bfperf"));
    }
}

/// perftest's `--report_gbits`: the bandwidth columns in Gb/s, the header saying so.
#[test]
fn report_gbits_prints_bandwidth_in_gigabits() {
    let out = bfperf(&[
        "write-bw",
        "-d",
        "sim",
        "-s",
        "4096",
        "-n",
        "200",
        "--warmup",
        "10",
        "--report_gbits",
    ]);
    assert!(out.status.success(), "{:?}", out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("BW average[Gb/sec]"), "{text}");
    assert!(!text.contains("MB/sec"), "{text}");
}
