//! The options that only some tests take: what each test refuses, before any traffic.

use super::{duration, margin, Connection, Opts};

/// The options that only some tests take, checked against the test `name` (the subcommand).
///
/// # Errors
/// A message naming the option the test does not take.
pub fn check_for(name: &str, o: &Opts) -> Result<(), String> {
    // What perftest's parser refuses (perftest_parameters.c, its words quoted), refused here
    // rather than accepted and left unused.
    let atomic = name.starts_with("atomic-");
    if o.post_list > 1 && name.ends_with("-lat") {
        // force_dependecies: post_list > 1 outside BW and LAT_BY_BW tests.
        return Err(format!(
            "--post-list {} with {name}: a latency test posts one request at a time, as \
             perftest's (\"Post list is supported in BW tests only\")",
            o.post_list
        ));
    }
    if o.inline_given && (atomic || name.starts_with("read-")) {
        // parser, case 'I'.
        return Err(format!(
            "-I with {name}: reads and atomics carry no inline data, as perftest's (\"Inline \
             feature not available on READ/Atomic verbs\")"
        ));
    }
    if o.atomic_given && !atomic {
        // parser, case 'A'.
        return Err(format!(
            "-A / --atomic with {name}: the atomic type is for atomic-lat and atomic-bw, as \
             perftest's (\"You are not running the atomic_lat/bw test!\")"
        ));
    }
    if o.all && atomic {
        // force_dependecies: RUN_ALL sets the size to MAX_SIZE, which an atomic refuses.
        return Err(format!(
            "-a with {name}: an atomic moves 8 bytes, one size, as perftest's (\"Message size \
             cannot be changed for Atomic tests\")"
        ));
    }
    if o.plot.is_some() && name.ends_with("-bw") {
        return Err(format!(
            "--plot draws latency histograms: use it with a latency test, not {name}"
        ));
    }
    if o.write_imm && name != "write-lat" {
        return Err(format!(
            "--write-with-imm is an option of write-lat, not {name}"
        ));
    }
    if o.events && !(name == "send-lat" || (name == "write-lat" && o.write_imm)) {
        // As perftest: "Events feature not available on WRITE verb" (a write without
        // immediate produces no completion at the receiver to wake it).
        return Err(format!(
            "--events needs a completion at the receiver: send-lat or write-lat --write-with-imm, not {name}{}",
            if name == "write-lat" { " without --write-with-imm" } else { "" }
        ));
    }
    if o.connection == Connection::Ud {
        if name != "send-lat" && name != "send-bw" {
            return Err(format!(
                "-c ud runs send-lat and send-bw (UD has sends only), not {name}"
            ));
        }
        if o.server || o.client.is_some() {
            return Err("-c ud runs both sides in this process: drop --server/--client".into());
        }
        if o.post_list > 1 {
            return Err("-c ud posts one send per call: --post-list must be 1".into());
        }
        if o.cqe_zip.is_some() {
            return Err("--cqe-zip is not available with -c ud".into());
        }
        if o.srq {
            return Err("--srq is an RC option: UD QPs receive into their own queues here".into());
        }
        if o.odp {
            return Err("--odp is an RC option here: UD buffers are registered as always".into());
        }
    }
    if o.connection == Connection::Dc {
        let why = if !matches!(name, "write-lat" | "read-lat" | "write-bw" | "read-bw") {
            Some("DC runs the write and read tests here (send and atomics: not yet)")
        } else if o.write_imm || o.srq || o.events {
            Some("--write-with-imm, --srq and -e need receives: not over DC yet")
        } else if o.qps > 1 || o.bidirectional {
            Some("-q and -b: one DCI a side here (not yet)")
        } else if o.perftest || o.rc_pingpong {
            Some("a perftest or ibv_rc_pingpong peer: DC is spoken with bfperf only")
        } else if o.hw_ts {
            Some("--hw-timestamps: RC only")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("-c dc with {name}: {why}"));
        }
    }
    if o.srq && !(name == "send-lat" || name == "send-bw" || (name == "write-lat" && o.write_imm)) {
        // As perftest: only tests with receives have an SRQ to post them to.
        return Err(format!(
            "--srq needs receives: send-lat, send-bw or write-lat --write-with-imm, not {name}{}",
            if name == "write-lat" {
                " without --write-with-imm"
            } else {
                ""
            }
        ));
    }
    if (o.histogram || o.unsorted) && !name.ends_with("-lat") {
        return Err(format!(
            "-H / -U print latency samples: use them with a latency test, not {name}"
        ));
    }
    if o.no_peak && name.ends_with("-lat") {
        // perftest's parser: " NoPeak only valid for BW tests".
        return Err(format!(
            "-N (--noPeak) with {name}: a latency test measures no peak, as perftest's \
             (\"NoPeak only valid for BW tests\")"
        ));
    }
    if o.cycles && !name.ends_with("-lat") {
        // perftest's parser: " Available only on Latency tests".
        return Err(format!(
            "-C (--report-cycles) with {name}: available only on latency tests, as perftest's \
             (\"Available only on Latency tests\")"
        ));
    }
    if o.cycles && !cfg!(target_arch = "x86_64") {
        return Err(format!(
            "-C (--report-cycles) on {}: bfperf reads a cycle counter on x86_64 only (the TSC, \
             perftest's get_cycles); here it times with the OS clock, which counts nanoseconds, \
             not cycles: drop -C",
            std::env::consts::ARCH
        ));
    }
    if (o.histogram || o.unsorted) && o.json {
        return Err(
            "-H / -U print samples in perftest's text format: not with --json (one JSON object \
             per line on stdout)"
                .into(),
        );
    }
    if o.qps > 1 {
        let why = if !name.ends_with("-bw") {
            // perftest: "Multiple QPs only available on bw tests".
            Some("several QPs are for bandwidth tests only, as perftest's")
        } else if o.connection == Connection::Ud {
            Some("-c ud runs one QP a side here (not yet several)")
        } else if o.perftest {
            Some("perftest's exchange of several QPs is not spoken yet")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("-q {} with {name}: {why}", o.qps));
        }
    }
    if o.bidirectional {
        let why = if !name.ends_with("-bw") {
            // perftest: "Bidirectional is only available in BW test".
            Some("bidirectional is only available in bandwidth tests, as perftest's")
        } else if o.connection == Connection::Ud {
            Some("-c ud: not yet")
        } else if o.perftest {
            Some("perftest's bidirectional exchange is not spoken yet")
        } else if duration(o).is_some() {
            Some("-D and --run_infinitely run one direction here (not yet both)")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("-b with {name}: {why}"));
        }
    }
    if o.mmap.is_some() {
        if o.hugepages {
            // perftest: "Can't use multiple memory types".
            return Err(
                "--mmap and --use_hugepages: one memory type at a time, as perftest".into(),
            );
        }
        if o.connection == Connection::Ud {
            return Err("--mmap with -c ud: RC only here (not yet)".into());
        }
        if o.mmap.as_deref() == Some(std::path::Path::new("")) {
            return Err("--mmap needs a file".into());
        }
    } else if o.mmap_offset.is_some() {
        return Err("--mmap-offset goes with --mmap".into());
    }
    if o.dmabuf {
        let why = if name == "write-lat" && !o.write_imm {
            // perftest (current): "Perftest doesn't support device memory latency test with
            // write (without immediate) verb; use --write_with_imm".
            Some(
                "write-lat watches the echo's last byte with the CPU, and a dma-buf has no CPU \
                 view: add --write-with-imm (the echo is then a receive completion), as perftest asks",
            )
        } else if o.hugepages || o.mmap.is_some() {
            // perftest: "Can't use multiple memory types".
            Some("--use_hugepages and --mmap: one memory type at a time, as perftest")
        } else if o.odp {
            Some("--odp registers host memory on demand; a dma-buf is registered as a dma-buf")
        } else if o.connection == Connection::Ud {
            Some("-c ud: RC and DC only here (not yet)")
        } else if o.perftest || o.rc_pingpong {
            Some("a perftest or ibv_rc_pingpong peer: not yet (those loops write each message's tag with the CPU)")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("--use_dmabuf with {name}: {why}"));
        }
    }
    if o.report_both && o.json {
        return Err(
            "--report-both prints perftest's Local / Remote tables: not with --json".into(),
        );
    }
    if o.run_infinitely && o.margin.is_some() {
        return Err("--run_infinitely reports every -D seconds whole: -f does not apply".into());
    }
    if let Some(d) = duration(o) {
        if name.ends_with("-lat") {
            // perftest's refusals where they apply (its words quoted), then what a timed
            // latency run does not have: samples.
            let why = if o.run_infinitely {
                Some("--run_infinitely is for bandwidth tests only (perftest: \"run_infinitely exists only in BW tests for now\"); use -D SECS")
            } else if o.events {
                Some("-e: a timed run polls (perftest: \"Duration mode doesn't work with events\")")
            } else if o.histogram || o.unsorted || o.plot.is_some() || o.hw_ts {
                Some("-H, -U, --plot and --hw-timestamps need every sample: a timed run reports the average alone (perftest's duration report)")
            } else if o.rc_pingpong {
                Some("--rc-pingpong: ibv_rc_pingpong counts -n messages, it has no timed mode")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(format!("-D with {name}: {why}"));
            }
        }
        if o.all {
            // perftest: "Duration mode currently doesn't support running on all sizes."
            return Err("-D runs one size: drop -a".into());
        }
        if o.connection == Connection::Ud {
            return Err("-D is not available with -c ud yet".into());
        }
        if name == "send-bw" && (o.server || o.client.is_some()) {
            return Err(
                "-D with send-bw across two processes: the receiver cannot know when the sender stops; run both sides in one process"
                    .into(),
            );
        }
        let m = if o.run_infinitely {
            0
        } else {
            margin(o).unwrap_or(0)
        };
        if d == 0 || d <= 2 * m {
            // perftest: "please check that DURATION > 2*MARGIN".
            return Err(format!(
                "-D {d} with a margin of {m} s: the duration must exceed twice the margin (-f)"
            ));
        }
    } else if o.margin.is_some() {
        return Err("-f (the margin) goes with -D".into());
    }
    if o.cqe_zip.is_some() && !name.ends_with("-bw") {
        return Err(format!(
            "--cqe-zip is an option of the bandwidth tests (a latency test has one completion \
             outstanding: nothing to compress), not {name}"
        ));
    }
    if o.perftest {
        let why = if o.client.is_none() {
            Some("it names the server's program: give it with --client HOST")
        } else if !matches!(
            name,
            "write-lat" | "read-lat" | "send-lat" | "write-bw" | "read-bw" | "send-bw"
        ) || o.write_imm
        {
            Some("perftest's exchange is spoken for write-, read- and send-lat and -bw")
        } else if o.all || o.srq || o.events || o.connection == Connection::Ud {
            Some("-a, --srq, --events and -c ud are not spoken with perftest yet")
        } else if duration(o).is_some() && !name.ends_with("-lat") {
            Some("-D and --run_infinitely are not spoken with perftest's bandwidth tests yet")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("--perftest with {name}: {why}"));
        }
    }
    if o.rc_pingpong {
        let why = if o.client.is_none() {
            Some("it names the server's program: give it with --client HOST")
        } else if name != "send-lat" {
            Some("ibv_rc_pingpong is a send ping-pong: send-lat only")
        } else if o.perftest || o.srq || o.events || o.connection == Connection::Ud || o.all {
            Some("not with --perftest, --srq, --events, -c ud or -a")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("--rc-pingpong with {name}: {why}"));
        }
    }
    if o.hw_ts {
        let why = if !name.ends_with("-lat") {
            Some("it splits a latency test's round trip")
        } else if name == "write-lat" && !o.write_imm {
            Some("write-lat sees the echo in memory, with no completion to stamp: add --write-with-imm")
        } else if o.events {
            Some("a completion waited for on the channel carries no time: poll (no --events)")
        } else if o.connection == Connection::Ud {
            Some("-c ud: RC only")
        } else if o.device == "sim-stepped" {
            Some("the stepped NIC's clock stands still while it works: use --device sim")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("--hw-timestamps with {name}: {why}"));
        }
    }
    if o.rdma_cm {
        let why = if o.perftest || o.rc_pingpong {
            Some(
                "bfperf's -R keeps its parameters, sync and results on its TCP connection, \
                 perftest's -R moves them onto an rdma_cm QP: the two do not speak to each \
                 other (run bfperf on both sides with -R, or drop -R to speak to perftest or \
                 ibv_rc_pingpong)",
            )
        } else if !o.server && o.client.is_none() {
            Some(
                "rdma_cm connects two processes: give --server on one side and --client HOST \
                 on the other (both sides in this process need no rdma_cm)",
            )
        } else if matches!(o.device.as_str(), "sim" | "sim-stepped") {
            Some("the software NIC has no rdma_cm (it is a library in one process, not a kernel RDMA device)")
        } else if o.connection != Connection::Rc {
            Some("rdma_cm connects RC QPs here (-c ud and -c dc: not yet)")
        } else if o.srq {
            Some("--srq: the QPs rdma_cm creates here take no SRQ (not yet)")
        } else if o.port == u16::MAX {
            Some("its rdma_cm port is --port + 1: -p 65535 leaves none")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("-R with {name}: {why}"));
        }
    }
    if o.events && o.device == "sim-stepped" {
        return Err(
            "--events with sim-stepped: nothing would run the NIC while the receiver sleeps; use --device sim"
                .into(),
        );
    }
    Ok(())
}
