//! The command line as a new user meets it after `cargo install --path tools/bfperf`.

use std::process::Command;

fn bfperf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bfperf"))
        .args(args)
        .output()
        .expect("bfperf runs")
}

/// Runs bfperf with each argument list at once (timed runs, which last their duration
/// whatever else runs): each list, its output and how long it ran, in order.
fn timed_runs<'a>(
    all: impl Iterator<Item = Vec<&'a str>>,
) -> Vec<(Vec<&'a str>, std::process::Output, f64)> {
    let all: Vec<_> = all.collect();
    std::thread::scope(|s| {
        let runs: Vec<_> = all
            .iter()
            .map(|args| {
                s.spawn(move || {
                    let started = std::time::Instant::now();
                    let out = bfperf(args);
                    (out, started.elapsed().as_secs_f64())
                })
            })
            .collect();
        all.iter()
            .zip(runs)
            .map(|(args, h)| {
                let (out, secs) = h.join().expect("a run's thread");
                (args.clone(), out, secs)
            })
            .collect()
    })
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

/// perftest's `-N` (`--noPeak`): a counted bandwidth run that would measure a peak reads
/// 0 for it (perftest's command lines with -N were refused as an unknown option).
#[test]
fn no_peak_reads_zero() {
    let run = |extra: &[&str]| {
        let mut args = vec!["write-bw", "-d", "sim", "-s", "64", "-n", "200", "--json"];
        args.extend_from_slice(extra);
        let out = bfperf(&args);
        assert!(out.status.success(), "{out:?}");
        json_field(&String::from_utf8_lossy(&out.stdout), "bw_peak_mb_s")
    };
    assert!(run(&[]) > 0.0, "a counted run of 200 measures a peak");
    assert_eq!(run(&["-N"]), 0.0);
    assert_eq!(run(&["--noPeak"]), 0.0);
}

/// perftest's warning before the header when a bandwidth run measures no peak that was not
/// asked off (perftest_parameters.c, `force_dependecies`: `iters > 20000` in a counted
/// BW test prints " WARNING: BW peak won't be measured in this run." and sets `noPeak`;
/// with `-N` the peak is off already and nothing is said, in a timed run too). bfperf said
/// it in every timed run, `-N` or not, and never in a counted one: a run above 20000
/// iterations printed a peak of 0 with no word of why.
#[test]
fn a_run_without_its_peak_warns_as_perftest() {
    const WARNING: &str = " WARNING: BW peak won't be measured in this run.";
    for (extra, warns) in [
        (&["-n", "20001"][..], true),
        (&["-n", "20000"][..], false),
        (&["-n", "20001", "-N"][..], false),
        (&["-n", "200", "-N"][..], false),
        (&["-D", "2", "-f", "0"][..], true),
        (&["-D", "2", "-f", "0", "-N"][..], false),
    ] {
        let mut args = vec!["write-bw", "-d", "sim", "-s", "8", "--warmup", "10"];
        args.extend_from_slice(extra);
        let out = bfperf(&args);
        assert!(out.status.success(), "{extra:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.contains(WARNING), warns, "{extra:?}: {text}");
        if warns {
            // Before the header, as perftest's.
            assert!(text.find(WARNING) < text.find("#bytes"), "{text}");
        }
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

/// perftest's defaults of `-s` and `-n`, per test (bfperf's were 8 bytes and 10000
/// iterations for every test): `bfperf write-lat` with no options runs what `ib_write_lat`
/// does. Over UD the bandwidth test's 65536 becomes the path MTU (4096 on the software
/// NIC), as perftest's; an explicit larger `-s` stays refused. (The bandwidth tests' counts
/// at `-s 8`, their size at a small `-n`: 65536 bytes 5000 times takes seconds on the
/// software NIC of a debug build.)
#[test]
fn sizes_and_iterations_default_to_perftests_per_test() {
    for (test, bytes, iters) in [
        (&["write-lat"][..], 2.0, 1000.0),
        (&["read-lat"][..], 2.0, 1000.0),
        (&["send-lat"][..], 2.0, 1000.0),
        (&["atomic-lat"][..], 8.0, 1000.0),
        (&["write-lat", "--write-with-imm"][..], 2.0, 1000.0),
        (&["send-lat", "-c", "ud"][..], 2.0, 1000.0),
        (&["write-bw", "-s", "8"][..], 8.0, 5000.0),
        (&["read-bw", "-s", "8"][..], 8.0, 1000.0),
        (&["send-bw", "-s", "8"][..], 8.0, 1000.0),
        (&["atomic-bw"][..], 8.0, 1000.0),
        (&["write-bw", "-n", "20"][..], 65536.0, 20.0),
        (&["read-bw", "-n", "20"][..], 65536.0, 20.0),
        (&["send-bw", "-n", "20"][..], 65536.0, 20.0),
        (&["send-bw", "-c", "ud", "-n", "20"][..], 4096.0, 20.0),
    ] {
        let mut args = test.to_vec();
        args.extend_from_slice(&["-d", "sim", "--warmup", "10", "--json"]);
        let out = bfperf(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(json_field(&text, "bytes"), bytes, "{args:?}: {text}");
        assert_eq!(json_field(&text, "iterations"), iters, "{args:?}: {text}");
    }
    let out = bfperf(&[
        "send-bw", "-d", "sim", "-c", "ud", "-s", "65536", "-n", "20",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the path MTU is 4096"),
        "{out:?}"
    );
}

/// perftest's `-U` and `-H`: every sample, in the order measured, then sorted, each block
/// `#, usec` and `N, value` lines, before the table row; `-F` accepted. Refused where
/// perftest has no samples to print (bandwidth tests) and with `--json`.
#[test]
fn unsorted_and_histogram_print_every_sample_as_perftest() {
    let out = bfperf(&[
        "write-lat",
        "-d",
        "sim",
        "-s",
        "8",
        "-n",
        "300",
        "--warmup",
        "10",
        "-U",
        "-H",
        "-F",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let blocks = sample_blocks(&text, "usec");
    assert_eq!(blocks.len(), 2, "{text}");
    let (unsorted, sorted) = (&blocks[0], &blocks[1]);
    // perftest's counts: 300 stamps, 299 differences (`measure_cnt = iters - 1`); `-H` prints
    // them sorted less the two largest (`LAT_MEASURE_TAIL`), as the statistics keep them.
    assert_eq!(unsorted.len(), 299, "{text}");
    assert_eq!(sorted.len(), 297, "{text}");
    assert!(
        sorted.windows(2).all(|w| w[0] <= w[1]),
        "not sorted: {sorted:?}"
    );
    // 300 timings of a ping-pong are never all in ascending order: the first block is the
    // order measured.
    assert!(
        !unsorted.windows(2).all(|w| w[0] <= w[1]),
        "the unsorted block is sorted"
    );
    let mut again = unsorted.clone();
    again.sort_by(f64::total_cmp);
    assert_eq!(
        &again[..297],
        &sorted[..],
        "the two blocks hold different samples"
    );
    // The header again, then the table row, after the samples (perftest prints its
    // `RESULT_LINE` and `RESULT_FMT_LAT` again when `-U` or `-H` printed samples).
    let row_at = text.rfind("\n 8 ").expect("the 8-byte row");
    let header_at = text.rfind(" #bytes #iterations").expect("a header");
    let block_at = text.rfind("#, usec").expect("a block");
    assert!(block_at < header_at && header_at < row_at, "{text}");
    for args in [
        &["write-bw", "-d", "sim", "-n", "50", "-H"][..],
        &["write-lat", "-d", "sim", "-n", "50", "-U", "--json"][..],
    ] {
        let out = bfperf(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("-H / -U"),
            "{args:?}: {out:?}"
        );
    }
}

/// perftest's `ib_atomic_bw`: 8-byte atomics at the bandwidth test's depth, either kind, in
/// bfperf's spelling or perftest's (`-A`), the title naming it and the JSON `atomic_bw`.
#[test]
fn atomic_bandwidth_runs_both_atomics() {
    for (args, title) in [
        (&["--atomic", "fa"][..], "Atomic FETCH_AND_ADD BW Test"),
        (&["-A", "CMP_AND_SWAP"][..], "Atomic CMP_AND_SWAP BW Test"),
    ] {
        let mut all = vec!["atomic-bw", "-d", "sim", "-n", "300", "--warmup", "10"];
        all.extend_from_slice(args);
        let out = bfperf(&all);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(title), "{text}");
        assert!(text.contains("\n 8          300 "), "{text}");
        all.push("--json");
        let out = bfperf(&all);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("\"test\":\"atomic_bw\""), "{text}");
    }
    let out = bfperf(&["atomic-bw", "-d", "sim", "-A", "SWAP"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// perftest's `--odp`: the buffers registered on demand, said in the header; the tests run
/// over them as over pinned ones (the software NIC maps the pages on first touch).
#[test]
fn odp_registers_the_buffers_on_demand() {
    for test in [
        &["write-lat"][..],
        &["send-lat", "--srq"][..],
        &["read-bw"][..],
    ] {
        let mut args = test.to_vec();
        args.extend_from_slice(&[
            "-d", "sim", "-s", "8", "-n", "200", "--warmup", "10", "--odp",
        ]);
        let out = bfperf(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Memory         : on-demand paging (--odp)"),
            "{text}"
        );
        assert!(text.contains("\n 8 "), "{text}");
    }
    let out = bfperf(&["send-lat", "-d", "sim", "-c", "ud", "--odp"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// perftest's `-D` in a bandwidth test: a timed run whose middle is measured, the row's
/// #iterations the requests completed in it, no peak (perftest: "BW peak won't be
/// measured"), the margin a quarter of the duration unless `-f` says; refused where it
/// cannot apply, and `-f` without `-D`.
#[test]
fn duration_mode_measures_the_middle_of_a_timed_run() {
    let mut runs = timed_runs(
        [
            vec![
                "send-bw", "-d", "sim", "-s", "64", "-D", "3", "-f", "1", "--json",
            ],
            vec!["write-bw", "-d", "sim", "-D", "3", "-f", "1"],
        ]
        .into_iter(),
    );
    let (_, out, secs) = runs.remove(0);
    assert!(out.status.success(), "{out:?}");
    assert!((3.0..30.0).contains(&secs), "ran {secs} s");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> f64 {
        let (_, rest) = text.split_once(&format!("\"{k}\":")).expect(k);
        rest.split([',', '}']).next().unwrap().parse().expect(k)
    };
    assert_eq!(field("bw_peak_mb_s"), 0.0, "{text}");
    assert!(field("iterations") > 0.0, "{text}");
    // (Which completions count is `bw::Window`'s unit test.)
    let (_, out, _) = runs.remove(0);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("WARNING: BW peak won't be measured in this run."),
        "{text}"
    );
    assert!(
        text.contains("Duration       : 3 s, the middle 1 s measured (-f 1)"),
        "{text}"
    );
    for args in [
        &["write-bw", "-D", "2", "-f", "1"][..],
        &["write-bw", "-D", "2", "-a"][..],
        &["write-bw", "-f", "1"][..],
        &["send-bw", "-D", "2", "--server"][..],
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-d", "sim"]);
        let out = bfperf(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

/// perftest's `-D` in a latency test (`print_report_lat_duration`): the run lasts the
/// duration, the iterations completed in its middle are counted, and t_avg and tps are the
/// middle's length over them and them over it: t_avg x iterations x the round-trip factor
/// (2 for a ping-pong, 1 for read and atomic) is the measured time, which is the duration
/// less the two margins. Every latency test, on the software NIC in this process (its
/// one-thread ping-pong, and the passive read and atomic); the table, `--out_json` and CSV
/// say the same; what a timed latency run cannot do is refused before any traffic.
#[test]
fn duration_mode_times_latency_tests_as_perftest() {
    let dir = std::env::temp_dir().join(format!("bfperf-lat-dur-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tests = [
        ("write-lat", &[][..], 2.0),
        ("send-lat", &[][..], 2.0),
        ("write-lat", &["--write-with-imm"][..], 2.0),
        ("read-lat", &[][..], 1.0),
        ("atomic-lat", &[][..], 1.0),
    ];
    // The timed runs side by side (each lasts its duration whatever the others do).
    let runs = timed_runs(tests.iter().map(|&(test, extra, _)| {
        let mut args = vec![test, "-d", "sim", "-D", "2", "-f", "0", "--json"];
        args.extend_from_slice(extra);
        args
    }));
    for ((_, _, rtt), (args, out, secs)) in tests.into_iter().zip(runs) {
        // A margin of 0 s: the whole run is measured.
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!((2.0..30.0).contains(&secs), "{args:?} ran {secs} s");
        let text = String::from_utf8_lossy(&out.stdout);
        let iters = json_field(&text, "iterations");
        let (t_avg, tps, sample) = (
            json_field(&text, "t_avg_us"),
            json_field(&text, "tps_average"),
            json_field(&text, "sample_s"),
        );
        assert!(iters >= 1.0, "{args:?}: {text}");
        assert!(t_avg > 0.0 && tps > 0.0, "{args:?}: {text}");
        assert!(
            (sample - 2.0).abs() < 0.2,
            "{args:?}: measured {sample} s: {text}"
        );
        // t_avg x iterations x rtt = the measured time; tps = iterations / it.
        let us = t_avg * iters * rtt;
        assert!(
            (us / 1e6 - sample).abs() < 0.01 * sample,
            "{args:?}: {t_avg} us x {iters} x {rtt} vs {sample} s: {text}"
        );
        assert!(
            (iters / tps - sample).abs() < 0.01 * sample,
            "{args:?}: {text}"
        );
        assert!(!text.contains("t_min_us"), "no samples: {text}");
    }
    // The margin: -D 3 -f 1 measures the middle second only; the table is perftest's
    // duration table; --out_json and --csv carry the same figures.
    let (json, csv) = (dir.join("out.json"), dir.join("lat.csv"));
    let out = bfperf(&[
        "send-lat",
        "-d",
        "sim",
        "-s",
        "8",
        "-D",
        "3",
        "-f",
        "1",
        "--out_json",
        "--out_json_file",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" #bytes        #iterations       t_avg[usec]    tps average\n"),
        "{text}"
    );
    assert!(
        text.contains("Duration       : 3 s, the middle 1 s measured (-f 1)"),
        "{text}"
    );
    assert!(!text.contains("BW peak"), "{text}");
    let row = text
        .lines()
        .skip_while(|l| !l.contains("t_avg[usec]"))
        .nth(1)
        .expect("a row");
    let cols: Vec<f64> = row
        .split_whitespace()
        .map(|c| c.parse().expect(row))
        .collect();
    assert_eq!(cols.len(), 4, "{row}");
    assert_eq!(cols[0], 8.0, "{row}");
    let (iters, t_avg, tps) = (cols[1], cols[2], cols[3]);
    let sample = t_avg * iters * 2.0 / 1e6;
    // Half a second either way tells the middle second from the 2 or 3 s a wrong window
    // would measure, and leaves room for a loaded machine, where the last measured
    // iteration may end well after the window's last instant (it failed at 0.1 under a
    // load of 11 on 2 cores).
    assert!(
        (sample - 1.0).abs() < 0.5,
        "the middle second: {sample} s: {row}"
    );
    assert!((iters / tps - 1.0).abs() < 0.5, "{row}");
    let j = std::fs::read_to_string(&json).unwrap();
    assert!(j.contains("\"test\": \"Send_Latency_Test\""), "{j}");
    assert!(
        j.contains(&format!("\"n_iterations\": {},\n\"t_avg\": ", iters as u64)),
        "{j}"
    );
    assert!(j.contains("\"tps_average\": "), "{j}");
    let c = std::fs::read_to_string(&csv).unwrap();
    let mut lines = c.lines();
    assert_eq!(
        lines.next(),
        Some("test,device,bytes,iterations,t_avg_us,tps_average,sample_s,mode,recv,connection")
    );
    let r: Vec<&str> = lines.next().expect("a row").split(',').collect();
    assert_eq!((r[0], r[1], r[2]), ("send_lat", "sim", "8"), "{c}");
    assert_eq!(r[3].parse::<f64>().unwrap(), iters, "{c}");
    let _ = std::fs::remove_dir_all(&dir);
    // Refused, exit 2, the option named.
    for (args, why) in [
        (&["send-lat", "-D", "2", "-e"][..], "events"),
        (&["write-lat", "-D", "2", "-H"][..], "-H"),
        (&["read-lat", "-D", "2", "--plot", "x.svg"][..], "--plot"),
        (&["write-lat", "--run_infinitely"][..], "run_infinitely"),
        (&["write-lat", "-D", "2", "-f", "1"][..], "twice the margin"),
        (
            &["send-lat", "-D", "2", "--client", "h", "--rc-pingpong"][..],
            "ibv_rc_pingpong",
        ),
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-d", "sim"]);
        let out = bfperf(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

/// perftest's `--run_infinitely`: the bandwidth test runs until killed and prints a row of
/// what completed every `-D` seconds, as it goes; latency tests refuse it.
#[test]
fn run_infinitely_prints_a_row_every_period_until_killed() {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_bfperf"))
        .args([
            "write-bw",
            "-d",
            "sim",
            "--run_infinitely",
            "-D",
            "1",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("bfperf starts");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut rows = Vec::new();
    while rows.len() < 2 && std::time::Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(std::time::Duration::from_secs(1)) {
            rows.push(l);
        }
    }
    let still_running = child.try_wait().expect("wait").is_none();
    child.kill().expect("kill");
    let _ = child.wait();
    assert!(still_running, "it stopped by itself");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert!(r.contains("\"test\":\"write_bw\""), "{r}");
        assert!(r.contains("\"bw_peak_mb_s\":0.000"), "{r}");
        assert!(!r.contains("\"iterations\":0,"), "{r}");
    }
    let out = bfperf(&["send-lat", "-d", "sim", "--run_infinitely"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `--hw-timestamps`: each latency test that ends its round trip with a completion splits
/// it by the NIC's stamps (the software NIC's device clock), the three parts adding up to
/// the round trip (the JSON line's figures within the table's, halved for a ping-pong);
/// refused where there is no completion to stamp or no clock that moves.
#[test]
fn hw_timestamps_split_the_round_trip() {
    for (test, half) in [
        (&["send-lat"][..], true),
        (&["write-lat", "--write-with-imm"][..], true),
        (&["read-lat"][..], false),
        (&["atomic-lat"][..], false),
    ] {
        let mut args = test.to_vec();
        args.extend_from_slice(&[
            "-d",
            "sim",
            "-n",
            "400",
            "--warmup",
            "20",
            "--hw-timestamps",
        ]);
        let table = bfperf(&args);
        assert!(table.status.success(), "{args:?}: {table:?}");
        let text = String::from_utf8_lossy(&table.stdout);
        assert!(text.contains(" hw timestamps  : post "), "{text}");
        args.push("--json");
        let out = bfperf(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |k: &str| -> f64 {
            let (_, rest) = text.split_once(&format!("\"{k}\":")).expect(k);
            rest.split([',', '}']).next().unwrap().parse().expect(k)
        };
        let (post, wire, poll) = (field("post_ns"), field("nic_wire_ns"), field("poll_ns"));
        assert_eq!(field("iterations"), 400.0, "{text}");
        assert!(post > 0.0 && wire > 0.0 && poll > 0.0, "{text}");
        // Each round trip's parts add up to it exactly (`hwts`' unit test). Against the
        // table, only bounds hold whatever the machine's load: the table leaves out the two
        // largest samples (perftest's `LAT_MEASURE_TAIL`) and the split keeps them, and on a
        // loaded machine the round trips fall in two groups, so that each part's median can
        // come from another (a CI run: medians 1276 + 1312330 + 27424 ns against a median
        // round trip of 507 us; another: averages 59 us against 21 us, two 7.5 ms samples
        // left out of the table's). So the medians' sum lies within the table's range, and
        // the averages' sum is at least about the table's average (the table is halved for
        // a ping-pong). A part in the wrong unit or off the NIC's clock falls outside.
        let k = 1000.0 * if half { 2.0 } else { 1.0 };
        let (min, max, avg) = (
            field("t_min_us") * k,
            field("t_max_us") * k,
            field("t_avg_us") * k,
        );
        let medians = post + wire + poll;
        assert!(
            (0.5 * min..=2.0 * max).contains(&medians),
            "{args:?}: medians {post} + {wire} + {poll} vs {min}..{max}: {text}"
        );
        let averages = field("post_avg_ns") + field("nic_wire_avg_ns") + field("poll_avg_ns");
        assert!(
            averages >= 0.5 * avg,
            "{args:?}: averages {averages} vs {avg}: {text}"
        );
    }
    for refused in [
        &["write-lat", "-d", "sim", "--hw-timestamps"][..],
        &["send-bw", "-d", "sim", "--hw-timestamps"][..],
        &["send-lat", "-d", "sim-stepped", "--hw-timestamps"][..],
        &["send-lat", "-d", "sim", "-e", "--hw-timestamps"][..],
    ] {
        let out = bfperf(refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--hw-timestamps with"));
    }
}

/// `--perftest` names the server's program: only with `--client`, only for the tests whose
/// exchange bfperf speaks, not with what it does not speak yet.
#[test]
fn perftest_peers_are_refused_where_the_exchange_is_not_spoken() {
    for refused in [
        &["write-lat", "-d", "sim", "--perftest"][..],
        &["atomic-bw", "--client", "h", "--perftest"][..],
        &["write-bw", "--client", "h", "--perftest", "-D", "3"][..],
        &[
            "write-lat",
            "--client",
            "h",
            "--perftest",
            "--write-with-imm",
        ][..],
        &["send-lat", "--client", "h", "--perftest", "--srq"][..],
        &["send-lat", "--client", "h", "--perftest", "-a"][..],
    ] {
        let out = bfperf(refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--perftest with"),
            "{refused:?}: {out:?}"
        );
    }
}

/// `--rc-pingpong` names the server's program (`ibv_rc_pingpong`): only with `--client`,
/// only for send-lat, not with what its exchange has no room for.
#[test]
fn rc_pingpong_peers_only_for_send_latency() {
    for refused in [
        &["send-lat", "-d", "sim", "--rc-pingpong"][..],
        &["write-lat", "--client", "h", "--rc-pingpong"][..],
        &["send-lat", "--client", "h", "--rc-pingpong", "--perftest"][..],
        &["send-lat", "--client", "h", "--rc-pingpong", "--srq"][..],
    ] {
        let out = bfperf(refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--rc-pingpong with"),
            "{refused:?}: {out:?}"
        );
    }
}

/// perftest's `--out_json` / `--out_json_file`: the result written to the file as perftest
/// writes it (its key names), the file holding the last result.
#[test]
fn out_json_writes_perftest_s_object() {
    let dir = std::env::temp_dir().join(format!("bfperf-cli-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("r.json");
    let arg = format!("--out_json_file={}", file.display());
    let out = bfperf(&[
        "send-lat",
        "-d",
        "sim",
        "-s",
        "8",
        "-n",
        "200",
        "--warmup",
        "10",
        "--out_json",
        &arg,
    ]);
    assert!(out.status.success(), "{out:?}");
    let t = std::fs::read_to_string(&file).unwrap();
    for key in [
        "\"test\": \"Send_Latency_Test\"",
        "\"MsgSize\": 8",
        "\"n_iterations\": 200",
        "\"t_typical\": ",
    ] {
        assert!(t.contains(key), "{key} in {t}");
    }
    let out = bfperf(&[
        "write-bw",
        "-d",
        "sim",
        "-s",
        "8",
        "-n",
        "200",
        "--out_json",
        "--out_json_file",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let t = std::fs::read_to_string(&file).unwrap();
    assert!(
        t.contains("\"BW_average\": ") && !t.contains("t_typical"),
        "{t}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// perftest's `-i`: the device's port; the software NIC has one, so any other is refused.
#[test]
fn ib_port_other_than_one_is_refused_on_the_software_nic() {
    let out = bfperf(&["write-lat", "-d", "sim", "-i", "2"]);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("port (-i)"),
        "{out:?}"
    );
    let out = bfperf(&[
        "write-lat",
        "-d",
        "sim",
        "-i",
        "1",
        "-n",
        "50",
        "--warmup",
        "5",
    ]);
    assert!(out.status.success(), "{out:?}");
}

/// perftest's `--use_hugepages`: the buffers in 2 MiB huge pages where the system has some
/// reserved; else refused, typed, naming the sysctl that reserves them (never a fallback
/// to base pages under a header that says huge pages).
#[test]
fn use_hugepages_maps_huge_pages_or_names_the_sysctl() {
    let reserved: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let out = bfperf(&[
        "write-lat",
        "-d",
        "sim",
        "-n",
        "100",
        "--warmup",
        "5",
        "--use_hugepages",
    ]);
    if reserved >= 4 {
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("2 MiB huge pages (--use_hugepages)"),
            "{text}"
        );
    } else {
        assert!(!out.status.success(), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("vm.nr_hugepages"),
            "{out:?}"
        );
    }
}

/// The value of `"key":` in a JSON line.
/// The `-U` / `-H` blocks of perftest's report: after each `#, UNIT` line, the values of
/// its `N, value` lines.
fn sample_blocks(text: &str, unit: &str) -> Vec<Vec<f64>> {
    text.split(&format!("#, {unit}\n"))
        .skip(1)
        .map(|b| {
            b.lines()
                .map_while(|l| {
                    let (n, v) = l.split_once(", ")?;
                    n.parse::<usize>().ok()?;
                    v.parse::<f64>().ok()
                })
                .collect()
        })
        .collect()
}

fn json_field(text: &str, k: &str) -> f64 {
    let (_, rest) = text
        .split_once(&format!("\"{k}\":"))
        .unwrap_or_else(|| panic!("{k} in {text}"));
    rest.split([',', '}']).next().unwrap().parse().expect(k)
}

/// perftest's `-q`: N QPs per side, each with `-n` requests, so the row counts N x `-n`
/// (perftest's `iters * num_of_qps`), the header and `--out_json` say how many; latency
/// tests refuse several QPs, as perftest's.
#[test]
fn qp_runs_several_qps_per_side() {
    for test in ["write-bw", "read-bw", "send-bw", "atomic-bw"] {
        let out = bfperf(&[
            test, "-d", "sim", "-q", "3", "-s", "8", "-n", "200", "--warmup", "10", "--json",
        ]);
        assert!(out.status.success(), "{test}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(json_field(&text, "iterations"), 600.0, "{test}: {text}");
        assert!(json_field(&text, "bw_avg_mb_s") > 0.0, "{text}");
    }
    let dir = std::env::temp_dir().join(format!("bfperf-cli-q-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("q.json");
    let arg = format!("--out_json_file={}", file.display());
    let out = bfperf(&[
        "send-bw",
        "-d",
        "sim",
        "-q",
        "2",
        "--srq",
        "-s",
        "8",
        "-n",
        "100",
        "--out_json",
        &arg,
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(" Number of qps  : 2 per side (-q)"), "{text}");
    assert!(text.contains("\n 8          200 "), "{text}");
    let t = std::fs::read_to_string(&file).unwrap();
    assert!(t.contains("\"Number_of_qps\": 2,"), "{t}");
    std::fs::remove_dir_all(&dir).unwrap();
    for refused in [
        &["write-lat", "-d", "sim", "-q", "2"][..],
        &["send-bw", "-d", "sim", "-q", "2", "-c", "ud"][..],
        &["write-bw", "-d", "sim", "-q", "0"][..],
    ] {
        let out = bfperf(refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("-q"),
            "{refused:?}: {out:?}"
        );
    }
}

/// perftest's `-b`: both sides send at once; the row is the sum of both sides' results
/// (the iterations one side's), `--report-both` prints each side's apart, each with its
/// own `-n` requests and a bandwidth of its own, adding up to the row; the title says
/// "Bidirectional" as perftest's. Refused for latency tests, as perftest's.
#[test]
fn bidirectional_sums_both_sides() {
    for test in ["write-bw", "read-bw", "send-bw"] {
        let out = bfperf(&[
            test,
            "-d",
            "sim",
            "-b",
            "-q",
            "2",
            "-s",
            "1024",
            "-n",
            "300",
            "--warmup",
            "10",
            "--report-both",
        ]);
        assert!(out.status.success(), "{test}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(" Bidirectional BW Test (blueflame)"),
            "{text}"
        );
        // The summed row, then "Local results" and "Remote results", one row each.
        let rows: Vec<Vec<f64>> = text
            .lines()
            .filter(|l| l.starts_with(" 1024 "))
            .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
            .collect();
        assert_eq!(rows.len(), 3, "{test}: {text}");
        let (sum, local, remote) = (&rows[0], &rows[1], &rows[2]);
        assert!(text.find(" Local results").unwrap() < text.find(" Remote results").unwrap());
        for r in [sum, local, remote] {
            assert_eq!(r[1], 600.0, "{test}: {text}");
        }
        assert!(local[3] > 0.0 && remote[3] > 0.0, "{test}: {text}");
        // The average and the message rate add up (to the table's rounding).
        assert!(
            (sum[3] - local[3] - remote[3]).abs() <= 0.02,
            "{test}: {text}"
        );
        assert!(
            (sum[4] - local[4] - remote[4]).abs() <= 2e-6,
            "{test}: {text}"
        );
    }
    // perftest's --out_json names the test as its header: "Bidirectional" before "BW".
    let dir = std::env::temp_dir().join(format!("bfperf-cli-b-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("b.json");
    let arg = format!("--out_json_file={}", file.display());
    let out = bfperf(&[
        "write-bw",
        "-d",
        "sim",
        "-b",
        "-q",
        "2",
        "-l",
        "2",
        "-s",
        "8",
        "-n",
        "100",
        "--out_json",
        &arg,
    ]);
    assert!(out.status.success(), "{out:?}");
    let t = std::fs::read_to_string(&file).unwrap();
    assert!(
        t.contains("\"test\": \"RDMA_Write_Bidirectional_Post_List_BW_Test\""),
        "{t}"
    );
    assert!(t.contains("\"Number_of_qps\": 2,"), "{t}");
    std::fs::remove_dir_all(&dir).unwrap();
    for refused in [
        &["write-lat", "-d", "sim", "-b"][..],
        &["write-bw", "-d", "sim", "-b", "-D", "2"][..],
        &["write-bw", "--client", "h", "--perftest", "-b"][..],
    ] {
        let out = bfperf(refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("-b with"),
            "{refused:?}: {out:?}"
        );
    }
}

/// perftest's `--pin_cores=LIST`: every thread of the process (the measuring one and the
/// software NIC's) runs on the CPUs listed, as the kernel says of each while it runs; the
/// header says so; a malformed list or a CPU the system does not have is refused.
#[test]
fn pin_cores_runs_every_thread_on_the_listed_cpus() {
    use std::io::BufRead;
    let allowed = |status: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    // The first CPU this test may use (a cgroup may leave out CPU 0).
    let mine = allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    let cpu: String = mine.chars().take_while(|c| c.is_ascii_digit()).collect();
    let arg = format!("--pin_cores={cpu}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_bfperf"))
        .args([
            "write-bw",
            "-d",
            "sim",
            "--run_infinitely",
            "-D",
            "1",
            "--json",
            &arg,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("bfperf starts");
    // Wait for a row: the device and its thread are up.
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).expect("a row");
    let tasks = format!("/proc/{}/task", child.id());
    let lists: Vec<String> = std::fs::read_dir(&tasks)
        .unwrap()
        .map(|t| allowed(&std::fs::read_to_string(t.unwrap().path().join("status")).unwrap()))
        .collect();
    child.kill().expect("kill");
    let _ = child.wait();
    assert!(line.contains("write_bw"), "{line}");
    assert!(
        lists.len() >= 2,
        "the NIC's thread and the test's: {lists:?}"
    );
    assert!(
        lists.iter().all(|l| *l == cpu),
        "{cpu}: {lists:?} (was {mine})"
    );
    let out = bfperf(&["write-lat", "-d", "sim", "-n", "50", "--warmup", "5", &arg]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(" CPU affinity   : {cpu} (--pin_cores)")),
        "{text}"
    );
    for (bad, why) in [
        ("--pin_cores=1-0", "start > end"),
        ("--pin_cores=100000", "out of range"),
        ("--pin_cores=0,x", "'x' is not a CPU number"),
        ("--pin_cores=", "empty"),
    ] {
        let out = bfperf(&["write-lat", "-d", "sim", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(bad) && err.contains(why), "{bad}: {err}");
    }
}

/// perftest's `--mmap=FILE --mmap-offset=N`: each side's buffer is the file's bytes from
/// the offset (both sides here: the second's window after the first's), so the messages
/// of a write test land in the file itself; the bytes before the offset are left alone.
/// Refused, typed: an offset off the page size, a file too short, a file that is not there.
#[test]
fn mmap_puts_the_buffers_in_the_file() {
    let dir = std::env::temp_dir().join(format!("bfperf-cli-mmap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("buf");
    let off = 65536usize;
    std::fs::write(&file, vec![0xeeu8; 1 << 20]).unwrap();
    let (f, o) = (
        format!("--mmap={}", file.display()),
        format!("--mmap-offset={off}"),
    );
    // 64-byte writes, inline (`-I`: a bandwidth test's default is perftest's 0): 0x5a bytes
    // into the peer's buffer.
    let out = bfperf(&[
        "write-bw", "-d", "sim", "-s", "64", "-n", "300", "--warmup", "10", "-I", "64", &f, &o,
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "Memory         : {} from byte {off} (--mmap)",
            file.display()
        )),
        "{text}"
    );
    let bytes = std::fs::read(&file).unwrap();
    assert!(bytes[..off].iter().all(|&b| b == 0xee), "before the offset");
    // The writer's window starts zeroed; the peer's, a page multiple further, got the 64
    // bytes of every write.
    assert!(
        bytes[off..off + 64].iter().all(|&b| b == 0),
        "the writer's window"
    );
    let at = (off + 4096..bytes.len())
        .step_by(4096)
        .find(|&i| bytes[i] == 0x5a)
        .expect("the writes in the file");
    assert!(bytes[at..at + 64].iter().all(|&b| b == 0x5a), "at {at}");
    assert_eq!(bytes[at + 64], 0, "at {at}");
    for test in [
        &["write-lat"][..],
        &["send-bw", "-q", "2"][..],
        &["read-lat"][..],
    ] {
        let mut args = test.to_vec();
        args.extend_from_slice(&["-d", "sim", "-s", "8", "-n", "100", "--warmup", "5", &f]);
        let out = bfperf(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
    let short = dir.join("short");
    std::fs::write(&short, [0u8; 100]).unwrap();
    for (args, why) in [
        (vec![f.clone(), "--mmap-offset=100".into()], "page size"),
        (vec![format!("--mmap={}", short.display())], "shorter"),
        (
            vec![format!("--mmap={}", dir.join("none").display())],
            "none",
        ),
    ] {
        let mut all = vec!["write-lat", "-d", "sim"];
        all.extend(args.iter().map(String::as_str));
        let out = bfperf(&all);
        assert_eq!(out.status.code(), Some(1), "{all:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{all:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// perftest's `-c DC`: the write and read tests with each side's DCI aimed at the other's
/// DCT (the software NIC models both ends; a request to a DCT that is not the peer's would
/// fail its completion, and the run with it); refused where DC is not run yet.
#[test]
fn dc_runs_write_and_read_tests() {
    // The bandwidth tests first: a request that fails ends them at once (a ping-pong
    // would wait for its echo).
    for test in ["write-bw", "read-bw", "write-lat", "read-lat"] {
        let out = bfperf(&[
            test, "-d", "sim", "-c", "dc", "-s", "64", "-n", "300", "--warmup", "10",
        ]);
        assert!(out.status.success(), "{test}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(
                " Connection     : DC (a DCI a side, aimed at the other's DCT; DC key 0xffeeddcc)"
            ),
            "{text}"
        );
        assert!(text.contains("\n 64 "), "{test}: {text}");
        let out = bfperf(&[
            test, "-d", "sim", "-c", "DC", "-s", "64", "-n", "100", "--json",
        ]);
        assert!(out.status.success(), "{test}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("\"connection\":\"DC\""), "{text}");
    }
    for refused in [
        &["send-lat", "-d", "sim", "-c", "dc"][..],
        &["atomic-bw", "-d", "sim", "-c", "dc"][..],
        &["write-bw", "-d", "sim", "-c", "dc", "-q", "2"][..],
        &["write-lat", "-d", "sim", "-c", "dc", "--write-with-imm"][..],
        &["write-bw", "--client", "h", "-c", "dc", "--perftest"][..],
    ] {
        let out = bfperf(refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("-c dc with"),
            "{refused:?}: {out:?}"
        );
    }
}

/// perftest's default `noPeak`: a counted run of more than 20000 iterations (per QP)
/// measures no peak (`bw_peak_mb_s` 0, the average still there); up to them it does.
#[test]
fn no_peak_above_twenty_thousand_iterations() {
    for (n, peak) in [("20001", false), ("300", true)] {
        let out = bfperf(&[
            "write-bw", "-d", "sim", "-s", "8", "-n", n, "--warmup", "0", "--json",
        ]);
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(json_field(&text, "bw_peak_mb_s") > 0.0, peak, "{text}");
        assert!(json_field(&text, "bw_avg_mb_s") > 0.0, "{text}");
    }
}

/// `--use_dmabuf` (perftest's `--use_*_dmabuf`) on the software NIC: each side's buffer a
/// dma-buf of the NIC's exporter, said in the header; bandwidth tests and the latency tests
/// that learn of messages from completions run as without it (the same row); the
/// combinations where the CPU would touch the buffer are refused, exit 2, before any
/// traffic (no table).
#[test]
fn use_dmabuf_runs_on_the_software_nic_and_refuses_what_needs_a_cpu_view() {
    let common = [
        "-d", "sim", "-s", "4096", "-n", "200", "--warmup", "10", "--json",
    ];
    for test in [
        &["write-bw"][..],
        &["read-bw"][..],
        &["send-bw", "-q", "2"][..],
        &["atomic-bw"][..],
        &["send-lat"][..],
        &["read-lat"][..],
        &["write-lat", "--write-with-imm"][..],
    ] {
        let run = |dmabuf: bool| {
            let mut args = test.to_vec();
            args.extend_from_slice(&common);
            if dmabuf {
                args.push("--use_dmabuf");
            }
            let out = bfperf(&args);
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let (with, without) = (run(true), run(false));
        // The same test, size and count either way (the times are the run's own).
        assert_eq!(
            with.split(',').next(),
            without.split(',').next(),
            "{test:?}"
        );
        assert!(with.starts_with("{\"test\":"), "{with}");
        for k in ["bytes", "iterations"] {
            assert_eq!(
                json_field(&with, k),
                json_field(&without, k),
                "{test:?} {k}: {with} / {without}"
            );
        }
    }
    let out = bfperf(&[
        "write-bw",
        "-d",
        "sim",
        "-s",
        "4096",
        "-n",
        "100",
        "--use_dmabuf",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Memory         : dma-buf from the software NIC's exporter (SimDmaBuf)"),
        "{text}"
    );
    assert!(text.contains("Inline         : up to 0 bytes"), "{text}");
    for (args, why) in [
        (&["write-lat"][..], "add --write-with-imm"),
        (&["write-bw", "-I", "64"][..], "never inline"),
        (&["write-bw", "--use_hugepages"][..], "one memory type"),
        (&["send-lat", "-c", "ud"][..], "-c ud"),
        (&["write-bw", "--odp"][..], "--odp"),
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-d", "sim", "--use_dmabuf"]);
        let out = bfperf(&all);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{all:?}: traffic before the refusal");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("bfperf: --use_dmabuf"), "{all:?}: {err}");
        assert!(err.contains(why), "{all:?}: {err}");
    }
}

/// `-R` (rdma_cm) is bfperf against bfperf across two processes on a kernel RDMA device:
/// refused before anything is opened where it cannot work, and by the software NIC that
/// `-d auto` finds on a machine without RDMA (an error, not a wait for a client).
#[test]
fn rdma_cm_is_refused_where_it_cannot_work() {
    for refused in [
        &["write-lat", "-R"][..],
        &["write-bw", "--rdma_cm", "--server", "-d", "sim"][..],
        &["write-lat", "-R", "--client", "h", "--perftest"][..],
        &["send-lat", "-R", "--client", "h", "--rc-pingpong"][..],
        &["write-lat", "-R", "--server", "-c", "dc"][..],
        &["send-bw", "-R", "--server", "--srq"][..],
        &["write-lat", "-R", "--server", "-p", "65535"][..],
    ] {
        let out = bfperf(refused);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("-R with"),
            "{refused:?}: {out:?}"
        );
    }
    if std::path::Path::new("/dev/infiniband").exists() {
        return; // -d auto would open a real device and wait for a client
    }
    let out = bfperf(&["write-lat", "-R", "--server", "-p", "18599"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("-R with the software NIC"),
        "{out:?}"
    );
}

/// Numbers on the command line never panic or abort bfperf: each is refused with a message
/// (perftest's bounds where it has them: `-t` 1..=15000, `-s` up to UINT_MAX / 2, `-n` up to
/// 2^32, `-D` and `-f` an int), or the run fails with an error (an allocation that cannot
/// be had: perftest's `ALLOC` says " Cannot Allocate").
#[test]
fn huge_numbers_on_the_command_line_are_refused_not_panics() {
    let cases: &[&[&str]] = &[
        // libc::CPU_SET indexes a 1024-bit set: index out of bounds.
        &[
            "write-lat",
            "-d",
            "sim",
            "--pin",
            "5000",
            "-n",
            "100",
            "--warmup",
            "10",
        ],
        // Instant + Duration::from_secs(u64::MAX): "overflow when adding duration to instant".
        &["write-bw", "-d", "sim", "-D", "18446744073709551615"],
        // refusals.rs `2 * m`: attempt to multiply with overflow.
        &[
            "write-bw",
            "-d",
            "sim",
            "-D",
            "5",
            "-f",
            "9223372036854775808",
        ],
        // setup.rs `caps`: `depth * 8` overflows u32.
        &[
            "write-bw",
            "-d",
            "sim",
            "-t",
            "268435456",
            "-n",
            "100",
            "--warmup",
            "10",
        ],
        // setup.rs `caps`: `tx_depth as u32 * 2` overflows.
        &[
            "write-bw",
            "-d",
            "sim",
            "-t",
            "2147483648",
            "-n",
            "100",
            "--warmup",
            "10",
        ],
        // setup.rs `side_cq`: (sq_blocks + rq_entries) * qps overflows u32 (perftest's own limits).
        &[
            "write-bw", "-d", "sim", "-t", "15000", "-q", "16384", "-n", "100", "--warmup", "10",
        ],
        // lat.rs `Vec::with_capacity(warmup + iters)`: capacity overflow.
        &[
            "write-lat",
            "-d",
            "sim",
            "-n",
            "2305843009213693952",
            "--warmup",
            "0",
        ],
        // The same for 8 TiB of stamps: "memory allocation failed", abort.
        &[
            "write-lat",
            "-d",
            "sim",
            "-n",
            "1099511627776",
            "--warmup",
            "0",
        ],
        // setup.rs `buf_len`: 2 * size overflows.
        &[
            "write-lat",
            "-d",
            "sim",
            "-s",
            "9223372036854775808",
            "-n",
            "100",
            "--warmup",
            "10",
        ],
    ];
    let mut bad = Vec::new();
    for args in cases {
        let out = bfperf(args);
        let err = String::from_utf8_lossy(&out.stderr);
        // 101: a panic; 134 or a signal: an abort.
        if !matches!(out.status.code(), Some(1) | Some(2)) || err.contains("panicked") {
            bad.push(format!(
                "{}: {:?}: {}",
                args.join(" "),
                out.status,
                err.lines().take(2).collect::<Vec<_>>().join(" / ")
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// perftest takes `-t` up to MAX_TX (15000), and bfperf's bound says "1 to 15000"; a
/// ConnectX (32768 WQE blocks a QP) runs `ib_write_bw -t 4096`. bfperf asked for 8 blocks
/// per request of twice the depth (65536 blocks) and died at QP creation.
#[test]
fn tx_depth_within_perftests_bound_runs() {
    for t in ["2049", "4096", "15000"] {
        let out = bfperf(&[
            "write-bw", "-d", "sim", "-t", t, "-n", "100", "--warmup", "10",
        ]);
        assert!(
            out.status.success(),
            "-t {t}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// perftest's `-C` (`--report-cycles`) in a latency test: every time of the row, of `-U`
/// and `-H` (`#, cycles` blocks) and of `--out_json` in CPU cycles, the raw differences of
/// the TSC stamps (halved for a ping-pong: multiples of half a cycle), under perftest's
/// table header (which keeps `[usec]`, as perftest's), with a line above it giving the
/// TSC's rate; `-D` keeps perftest's duration report in microseconds; a bandwidth test
/// refuses it in perftest's words.
#[test]
#[cfg(target_arch = "x86_64")]
fn report_cycles_prints_latency_in_cycles_as_perftest() {
    let dir = std::env::temp_dir().join(format!("bfperf-cli-cycles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("r.json");
    let arg = format!("--out_json_file={}", file.display());
    let out = bfperf(&[
        "write-lat",
        "-d",
        "sim",
        "-s",
        "8",
        "-n",
        "300",
        "--warmup",
        "10",
        "-C",
        "-U",
        "-H",
        "--out_json",
        &arg,
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mhz: f64 = text
        .split_once(" Times          : CPU cycles (-C), under perftest's [usec] header; TSC at ")
        .and_then(|(_, r)| r.split_once(" MHz"))
        .map(|(m, _)| m.parse().expect("MHz"))
        .unwrap_or_else(|| panic!("the Times line: {text}"));
    assert!(mhz > 1.0, "{mhz}");
    // perftest's RESULT_FMT_LAT, unchanged by -C.
    assert!(text.contains(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"), "{text}");
    assert!(!text.contains("#, usec"), "{text}");
    let blocks = sample_blocks(&text, "cycles");
    assert_eq!(blocks.len(), 2, "{text}");
    let (unsorted, sorted) = (&blocks[0], &blocks[1]);
    assert_eq!((unsorted.len(), sorted.len()), (299, 297), "{text}");
    // Raw tick differences halved: whole or half cycles, checked where %g prints them
    // exactly (below 10^5). A loaded machine may have none that short (CI saw every
    // sample near 8.4 * 10^6 cycles, 4 ms, with the other tests running beside): the unit
    // itself is checked against the run's clock by `report_cycles_add_up_to_the_run_on_the_run_s_clock`.
    for v in unsorted.iter().copied().filter(|&v| v < 1e5) {
        assert!(
            v > 0.0 && (v * 2.0).fract() == 0.0,
            "{v} is not a half cycle count"
        );
    }
    // The row, in the samples' unit: t_min the smallest sample, the rest ordered. The row
    // prints two decimals, the samples %g's six significant digits: a sample of 10^6
    // cycles or more is rounded to tens (CI saw t_min 4132055 printed as 4.13206e+06), by
    // at most half a unit of its sixth digit, 5 * 10^-6 of it.
    let row: Vec<f64> = text
        .lines()
        .rfind(|l| l.starts_with(" 8 "))
        .expect("the 8-byte row")
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    assert_eq!(row.len(), 9, "{row:?}");
    let (min, max, typical, p99, p999) = (row[2], row[3], row[4], row[7], row[8]);
    assert!(
        (min - sorted[0]).abs() <= 0.5 + 5e-6 * min,
        "{min} vs {}",
        sorted[0]
    );
    assert!(
        min <= typical && typical <= p99 && p99 <= p999 && p999 <= max,
        "{row:?}"
    );
    // --out_json: perftest writes the same cycles (its `delta / cycles_rtt_quotient`).
    let t = std::fs::read_to_string(&file).unwrap();
    assert!(
        t.contains(&format!("\"t_typical\": {typical:.2},")),
        "{typical} in {t}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // -D: perftest's duration report, in microseconds whatever -C says.
    let out = bfperf(&["write-lat", "-d", "sim", "-D", "1", "-f", "0", "-C"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" #bytes        #iterations       t_avg[usec]    tps average")
            && text.contains(" Times          : microseconds: -C does not apply"),
        "{text}"
    );

    for test in ["write-bw", "read-bw", "send-bw", "atomic-bw"] {
        for flag in ["-C", "--report-cycles"] {
            let out = bfperf(&[test, "-d", "sim", "-n", "50", flag]);
            assert_eq!(out.status.code(), Some(2), "{test} {flag}: {out:?}");
            assert!(out.stdout.is_empty(), "{test} {flag}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("available only on latency tests")
                    && err.contains("\"Available only on Latency tests\""),
                "{test} {flag}: {err}"
            );
        }
    }
}

/// `-C`'s cycles are the run's time: a read latency run (one request per sample, no
/// halving) whose kept samples, summed in cycles (`t_avg` x their count) and converted
/// with the TSC rate the same run reports (`clock_mhz`), fit inside the process's wall
/// time and are not vanishingly small beside it (microseconds read as cycles would be some
/// 2000 times too small, nanoseconds some 2 times too small: the half-cycle check above);
/// generous bounds, no timing assertion a loaded machine could break. `--json` and
/// `--csv` carry the same figures under `_cycles` names.
#[test]
#[cfg(target_arch = "x86_64")]
fn report_cycles_add_up_to_the_run_on_the_run_s_clock() {
    let dir = std::env::temp_dir().join(format!("bfperf-cli-cycles-sum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("r.csv");
    let iters = 5000.0;
    let started = std::time::Instant::now();
    let out = bfperf(&[
        "read-lat",
        "-d",
        "sim",
        "-n",
        "5000",
        "--warmup",
        "100",
        "--report-cycles",
        "--json",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let wall_us = started.elapsed().as_secs_f64() * 1e6;
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("_us\""), "{text}");
    let f = |k: &str| json_field(&text, k);
    let mhz = f("clock_mhz");
    let (min, typical, avg, max) = (
        f("t_min_cycles"),
        f("t_typical_cycles"),
        f("t_avg_cycles"),
        f("t_max_cycles"),
    );
    assert!(mhz > 1.0, "{text}");
    assert!(
        min > 0.0 && min <= typical && min <= avg && avg <= max,
        "{text}"
    );
    assert!(
        typical <= f("p99_cycles") && f("p99_cycles") <= f("p999_cycles"),
        "{text}"
    );
    // perftest's count: n - 1 samples, the two largest left out of the mean.
    let kept = iters - 1.0 - 2.0;
    let run_us = avg * kept / mhz;
    assert!(
        run_us <= wall_us * 1.05,
        "{run_us} us of samples in a {wall_us} us process: {text}"
    );
    assert!(
        run_us >= wall_us / 1000.0,
        "{run_us} us of samples in a {wall_us} us process: {text}"
    );
    // A read on the software NIC takes more than 10 ns and less than the run.
    assert!(
        min / mhz > 0.01 && min / mhz < wall_us,
        "{min} cycles at {mhz} MHz"
    );
    let lines: Vec<String> = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let (head, row) = (&lines[0], &lines[1]);
    assert!(
        head.contains(",t_min_cycles,t_max_cycles,t_typical_cycles,"),
        "{head}"
    );
    let col = |name: &str| {
        let i = head.split(',').position(|h| h == name).expect(name);
        row.split(',').nth(i).unwrap().parse::<f64>().unwrap()
    };
    for k in [
        "t_min_cycles",
        "t_typical_cycles",
        "t_avg_cycles",
        "p999_cycles",
    ] {
        assert_eq!(col(k), f(k), "{k}: {row} vs {text}");
    }
}
