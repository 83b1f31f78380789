//! Command-line options, perftest-like: [`parse`] reads them, [`check_for`] refuses what a
//! test does not take ([`refusals`]), [`cpu_list`] reads `--pin_cores` ([`cpus`]).

mod cpus;
mod refusals;

pub use cpus::{configured_cpus, cpu_list};
pub use refusals::check_for;

/// The fewest iterations a test runs (perftest's `MIN_ITER`).
pub const MIN_ITER: usize = 5;

/// Every option of every subcommand.
#[derive(Clone, Debug, PartialEq)]
pub struct Opts {
    /// `auto`, `sim`, `sim-stepped` or an rdma-core device name.
    pub device: String,
    /// GID index on RoCE (default: the first RoCE v2 IPv4 GID).
    pub gid_index: Option<i32>,
    /// perftest's `-i`: the device's port (default 1).
    pub ib_port: u8,
    /// Message size in bytes: `-s`, else the test's default ([`size_for`]).
    pub size: usize,
    /// `-s` was given: else the test's own default applies ([`size_for`]).
    pub size_given: bool,
    /// Measured iterations: `-n`, else the test's default ([`iters_for`]).
    pub iters: usize,
    /// `-n` was given: else the test's own default applies ([`iters_for`]).
    pub iters_given: bool,
    /// Iterations before measuring.
    pub warmup: usize,
    /// Max inline bytes the QP is created with (messages up to it go inline).
    pub inline: u32,
    /// `-I` was given: else the test's own default applies ([`inline_for`]).
    pub inline_given: bool,
    /// Requests per doorbell (bandwidth tests).
    pub post_list: usize,
    /// Requests outstanding (bandwidth tests).
    pub tx_depth: usize,
    /// Core to pin the measuring thread to.
    pub pin: Option<usize>,
    /// perftest's `--pin_cores=LIST`: the CPUs the process runs on (its threads, the
    /// software NIC's too), as given (`0,2-3`) and as parsed.
    pub pin_cores: Option<(String, Vec<usize>)>,
    /// Sizes 2 .. 8 MiB, powers of two.
    pub all: bool,
    /// `direct`, `verbs` or `auto` (sets BLUEFLAME_PATH).
    pub path: Option<String>,
    /// One JSON object per line.
    pub json: bool,
    /// Bandwidth tables in Gb/s (perftest's `--report_gbits`).
    pub gbits: bool,
    /// perftest's `-N` (`--noPeak`): bandwidth tests measure no peak (it reads 0).
    pub no_peak: bool,
    /// perftest's `-H` (`--report-histogram`): latency tests print every sample, sorted.
    pub histogram: bool,
    /// perftest's `-U` (`--report-unsorted`): latency tests print every sample in the
    /// order measured.
    pub unsorted: bool,
    /// perftest's `-C` (`--report-cycles`): latency tests report their times in CPU cycles
    /// (the TSC's ticks, raw differences) instead of microseconds.
    pub cycles: bool,
    /// Serve on `--port` (the client side connects).
    pub server: bool,
    /// Connect to this host's bfperf server.
    pub client: Option<String>,
    /// TCP port of the out-of-band exchange.
    pub port: u16,
    /// `fa` (fetch-add) or `cs` (compare-swap), atomic tests.
    pub atomic: Atomic,
    /// `-A` or `--atomic` was given (perftest refuses `-A` in a test that is not atomic).
    pub atomic_given: bool,
    /// `--csv FILE`: one row per size (see `csv.rs` for the columns).
    pub csv: Option<std::path::PathBuf>,
    /// perftest's `--out_json`: each result also written to this file as perftest writes it
    /// (`--out_json_file` names it; `perftest_out.json` by default).
    pub out_json: Option<std::path::PathBuf>,
    /// `--out_json_file FILE` (perftest's; `--out_json` turns the output on).
    pub out_json_file: Option<std::path::PathBuf>,
    /// `--plot FILE.svg`: the latency histogram (latency tests; one file per size with `-a`).
    pub plot: Option<std::path::PathBuf>,
    /// The write latency test with RDMA write with immediate (perftest's `--write_with_imm`):
    /// the receiver learns of each message from a receive completion, not by watching a byte.
    pub write_imm: bool,
    /// Event mode (perftest's `-e`): the receiver sleeps on the completion channel instead
    /// of spinning on the CQ.
    pub events: bool,
    /// `--cqe-zip hash|csum|stridx`: CQs created compressed with this mini-CQE format
    /// (bandwidth tests).
    pub cqe_zip: Option<blueflame::MiniCqeFormat>,
    /// `--srq`: the receiver's receives are posted to a shared receive queue (perftest's
    /// `--use-srq`), which its QP takes them from.
    pub srq: bool,
    /// perftest's `--odp`: buffers registered with on-demand paging.
    pub odp: bool,
    /// perftest's `--use_hugepages`: buffers in 2 MiB huge pages.
    pub hugepages: bool,
    /// perftest's `--mmap=FILE`: each side's buffer is bytes of this file, mapped shared.
    pub mmap: Option<std::path::PathBuf>,
    /// perftest's `--mmap-offset=N`: where in the file (default 0; a page multiple).
    pub mmap_offset: Option<u64>,
    /// `--use_dmabuf` (perftest's `--use_cuda_dmabuf` and the like): each side's buffer is a
    /// dma-buf registered with `ibv_reg_dmabuf_mr` (the software NIC's exporter, or udmabuf).
    pub dmabuf: bool,
    /// `--hw-timestamps`: latency round trips split by the NIC's completion timestamps.
    pub hw_ts: bool,
    /// `--perftest`: the server this client connects to is an unmodified perftest program.
    pub perftest: bool,
    /// `--rc-pingpong`: the server this client connects to is rdma-core's `ibv_rc_pingpong`.
    pub rc_pingpong: bool,
    /// perftest's `-D`: run for this many seconds instead of `--iters` (bandwidth tests).
    pub duration: Option<u64>,
    /// perftest's `--run_infinitely`: a bandwidth test that runs until killed, printing a
    /// result every `-D` seconds (5 by default).
    pub run_infinitely: bool,
    /// perftest's `-f`: seconds at each end of a `-D` run left out of the measurement
    /// (default: a quarter of the duration, as perftest).
    pub margin: Option<u64>,
    /// `-c rc|ud` (perftest's `-c RC|UD`): the transport of send-lat and send-bw.
    pub connection: Connection,
    /// perftest's `-q`: QPs per side in a bandwidth test, each with `--iters` requests and
    /// `--tx-depth` in flight of its own, all completing on the side's one CQ.
    pub qps: usize,
    /// perftest's `-b`: a bandwidth test in both directions at once, the row the sum of
    /// both sides' results.
    pub bidirectional: bool,
    /// perftest's `--report-both`: a `-b` run also prints each side's result apart.
    pub report_both: bool,
    /// perftest's `-R` (`--rdma_cm`): the test QPs created and connected through librdmacm
    /// (on the TCP port `--port` + 1); the parameters, sync and results stay on the TCP
    /// connection, so it is not perftest's `-R` on the wire.
    pub rdma_cm: bool,
}

/// The transport a test runs on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Connection {
    /// Reliable connected (every test).
    Rc,
    /// Unreliable datagram (send-lat, send-bw): messages of at most the path MTU.
    Ud,
    /// Dynamically connected (write and read tests): a DCI aimed at the peer's DCT.
    Dc,
}

impl Connection {
    /// The name in the header, JSON and CSV (perftest's spelling).
    pub fn name(self) -> &'static str {
        match self {
            Connection::Rc => "RC",
            Connection::Ud => "UD",
            Connection::Dc => "DC",
        }
    }
}

/// Which atomic the atomic test runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Atomic {
    /// Fetch-and-add.
    FetchAdd,
    /// Compare-and-swap.
    CompareSwap,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            device: "auto".into(),
            gid_index: None,
            // perftest's latency defaults until `size_for` / `iters_for` set the test's.
            size: DEF_SIZE_LAT,
            size_given: false,
            iters: DEF_ITERS,
            iters_given: false,
            warmup: 1000,
            inline: 220,
            inline_given: false,
            post_list: 1,
            tx_depth: 128,
            pin: None,
            pin_cores: None,
            all: false,
            path: None,
            json: false,
            gbits: false,
            no_peak: false,
            histogram: false,
            unsorted: false,
            cycles: false,
            server: false,
            client: None,
            port: 18515,
            atomic: Atomic::FetchAdd,
            atomic_given: false,
            csv: None,
            ib_port: 1,
            out_json: None,
            out_json_file: None,
            plot: None,
            write_imm: false,
            events: false,
            cqe_zip: None,
            srq: false,
            odp: false,
            hugepages: false,
            mmap: None,
            mmap_offset: None,
            dmabuf: false,
            hw_ts: false,
            perftest: false,
            rc_pingpong: false,
            duration: None,
            run_infinitely: false,
            margin: None,
            connection: Connection::Rc,
            qps: 1,
            bidirectional: false,
            report_both: false,
            rdma_cm: false,
        }
    }
}

/// perftest's default message size of the latency tests (`DEF_SIZE_LAT`).
pub const DEF_SIZE_LAT: usize = 2;
/// perftest's default message size of the bandwidth tests (`DEF_SIZE_BW`).
pub const DEF_SIZE_BW: usize = 65536;
/// perftest's message size of the atomic tests (`DEF_SIZE_ATOMIC`).
pub const DEF_SIZE_ATOMIC: usize = 8;
/// perftest's default iterations (`DEF_ITERS`): every test but the write bandwidth test.
pub const DEF_ITERS: usize = 1000;
/// perftest's default iterations of the write bandwidth tests (`DEF_ITERS_WB`:
/// `ib_write_bw`, with or without immediate).
pub const DEF_ITERS_WB: usize = 5000;
/// rdma-core's `ibv_rc_pingpong`'s default `-s` (its exchange does not carry the size).
pub const RC_PINGPONG_SIZE: usize = 4096;
/// rdma-core's `ibv_rc_pingpong`'s default `-n` (its exchange does not carry the count).
pub const RC_PINGPONG_ITERS: usize = 1000;

/// perftest's largest `-q` (`MAX_QP_NUM`).
pub const MAX_QPS: usize = 16384;

/// perftest's largest `-n` (`MAX_ITER`).
pub const MAX_ITER: usize = 1 << 32;
/// perftest's largest `-I` (`MAX_INLINE`).
pub const MAX_INLINE: u32 = 1024;
/// perftest's largest `-t` (`MAX_TX`).
pub const MAX_TX: usize = 15000;
/// perftest's largest `-s` (`UINT_MAX / 2`).
pub const MAX_SIZE: usize = (u32::MAX / 2) as usize;

/// perftest's default `--out_json` file, in the working directory.
pub const OUT_JSON_DEFAULT: &str = "perftest_out.json";

/// The usage text.
pub const USAGE: &str = "usage: bfperf <write-lat|read-lat|send-lat|atomic-lat|write-bw|read-bw|send-bw|atomic-bw|icount-probe N|icount-verbs N> [options]
  -d, --device auto|sim|sim-stepped|NAME   device (auto: BLUEFLAME_DEVICE, first rdma-core device, else the software NIC)
  -x, --gid-index N       GID index (RoCE; default: first RoCE v2 IPv4 GID)
  -i, --ib-port N         the device's port (default 1, as perftest's -i; the software NIC
                          has one)
  -s, --size N            message size (default perftest's: 2 latency tests, 65536 bandwidth
                          tests, 8 atomics; over UD at most the path MTU; send-lat
                          --rc-pingpong 4096, ibv_rc_pingpong's); as perftest's, N may end in
                          K (x1024) or M (x1048576) and be 0x hexadecimal or 0 octal
  -n, --iters N           iterations (default perftest's: 5000 write-bw, 1000 the others, as
                          ibv_rc_pingpong's; at least 5)
      --warmup N          warm-up iterations (default 1000)
  -I, --inline N          max inline size of the QPs, 0 to 1024 (default perftest's: 220
                          write-lat, 236 send-lat (188 UD, 150 DC), 0 reads, atomics and
                          bandwidth; read and atomic tests refuse -I, as perftest)
  -l, --post-list N       requests per doorbell in bandwidth tests (default 1; a latency test
                          refuses more than 1, as perftest)
  -t, --tx-depth N        outstanding requests in bandwidth tests (default 128)
  -q, --qp N              bandwidth tests: N QPs per side (default 1; perftest's -q), each
                          with -n requests and -t in flight of its own, all completing on
                          the side's one CQ; #iterations counts all QPs' requests (N x -n)
  -b, --bidirectional     bandwidth tests: both sides send at once (perftest's -b); the row
                          is the sum of both sides' results, #iterations one side's, and
                          across two processes both sides print it
      --report-both       with -b: also print each side's result apart (perftest's
                          \"Local results\" and \"Remote results\" tables)
      --pin CORE          pin the measuring thread
      --pin_cores=LIST    run the process on these CPUs (perftest's --pin_cores: 0, 0,1,2,
                          0-3 or 0-3,8,12-15; every thread, the software NIC's too; a CPU
                          the system does not have is refused); --pin then pins the measuring
                          thread to one of them
  -a, --all               sizes 2 .. 8388608 (across two processes too: one connection
                          per size; both sides must give -a, a peer on another size is refused)
      --path direct|verbs|auto   data path on rdma-core devices
      --atomic fa|cs      atomic of atomic-lat and atomic-bw (default fa; atomic-bw: perftest's
                          ib_atomic_bw, 8-byte atomics on one remote word, --tx-depth in flight;
                          other tests refuse it and -A, and atomic tests refuse -a, as perftest)
  -A, --atomic_type FETCH_AND_ADD|CMP_AND_SWAP   the same in perftest's spelling
      --write-with-imm    write-lat with RDMA write with immediate (a receive completion per message)
  -e, --events            sleep on the completion channel instead of polling (send-lat, and
                          write-lat with --write-with-imm; as perftest's -e)
      --cqe-zip hash|csum|stridx   bandwidth tests: CQs created compressed (CQE compression,
                          mini-CQEs of this format; direct path only: mlx5 or the software NIC)
      --srq               receives posted to a shared receive queue (send-lat, send-bw, and
                          write-lat with --write-with-imm; as perftest --use-srq)
  -c, --connection rc|ud|dc  transport (default rc); ud: send-lat and send-bw over UD QPs and
                          address handles (perftest's -c UD), messages up to the path MTU
                          (a larger -s is refused, a default above it becomes it: send-bw's
                          65536; -a stops at the MTU), both sides here;
                          dc: write-lat, read-lat, write-bw, read-bw over DC (perftest's -c DC:
                          each side a DCI aimed at the other's DCT, DC key 0xffeeddcc; mlx5
                          and the software NIC, refused typed elsewhere)
  -D, --duration SECS     bandwidth and latency tests: run SECS seconds instead of --iters,
                          measuring the middle (perftest's -D). Bandwidth: no BW peak,
                          #iterations the requests measured (send-bw in one process only).
                          Latency: perftest's duration row, #iterations (round trips, or
                          read / atomic requests) completed in the middle, t_avg[usec] (the
                          middle over them, halved for write and send) and tps average
                          (iterations per second); no -e, -H, -U, --plot, --hw-timestamps
  -f, --margin SECS       the seconds left out at each end of a -D run (default SECS/4)
      --run_infinitely    bandwidth tests: run until killed, a row every -D seconds (default 5)
                          of what completed in it (perftest's --run_infinitely; no peak)
      --odp               buffers registered with on-demand paging (perftest's --odp; refused,
                          typed, where the device has none)
      --use_hugepages     buffers in 2 MiB huge pages (perftest's --use_hugepages; refused,
                          typed, naming vm.nr_hugepages, where none are reserved)
      --mmap=FILE         each side's buffer is bytes of FILE, mapped shared and writable and
                          zeroed (perftest's --mmap; the file must exist and be long enough);
                          both sides in one process: the second side's just after the first's
      --mmap-offset=N     where in FILE the buffer starts (default 0; a multiple of the page
                          size, as mmap wants)
      --use_dmabuf        each side's buffer is a dma-buf registered with ibv_reg_dmabuf_mr,
                          as perftest's --use_cuda_dmabuf, --use_rocm_dmabuf,
                          --use_neuron_dmabuf and --use_ib_dm_dmabuf=DEV register theirs;
                          bfperf links no GPU runtime (no CUDA, ROCm or Neuron library to
                          build or ship): its dma-buf comes from an exporter every machine has,
                          the software NIC's own (-d sim) or the kernel's udmabuf
                          (/dev/udmabuf, host pages) on an RDMA device. Refused, typed, before
                          any traffic: no /dev/udmabuf (named), a device without dma-buf
                          registration (rxe, siw: Capability DmaBuf). Messages gather from the
                          dma-buf (never inline: -I 0), small sends land in it (no
                          scatter-to-CQE). Not with write-lat without --write-with-imm (it
                          watches a byte with the CPU; as perftest), -I N>0, --odp,
                          --use_hugepages, --mmap, -c ud, --perftest, --rc-pingpong
      --hw-timestamps     latency tests: split each round trip by the NIC's completion
                          timestamps into post (host), NIC+wire (doorbell to the NIC's stamp
                          of the completion that ends it) and poll (host), printed after the
                          row (a JSON line with --json); send-lat, read-lat, atomic-lat,
                          write-lat --write-with-imm; refused, typed, where the device has no
                          completion clock (rxe)
      --perftest          with --client: the server is perftest's program of the test
                          (ib_write_lat, ib_read_lat, ib_send_lat, ib_write_bw, ib_read_bw,
                          ib_send_bw; 4.5 and later), spoken to
                          with its exchange and its test loop; a bfperf --server tells a
                          perftest client from a bfperf one by itself
      --rc-pingpong       send-lat with --client: the server is rdma-core's ibv_rc_pingpong
                          (its 52-byte exchange and send ping-pong, which carry no size or
                          count: without -s / -n both sides take ibv_rc_pingpong's defaults,
                          4096 bytes and 1000 iterations, else give both the same -s and -n;
                          -g on RoCE); a bfperf --server tells its client by itself
  -R, --rdma_cm           across two processes (--server / --client HOST, bfperf on both
                          sides, both with -R): the test QPs (all -q of them) are created and
                          connected through librdmacm (rdma_cm), the server listening on
                          rdma_cm port --port + 1 (so that on iWARP, where rdma_cm ports are
                          the kernel's TCP ports, it does not clash with the TCP connection
                          on --port), each side's buffer in the connection's private data;
                          librdmacm picks the device from the address (it must be the one
                          -d opens; -x and -i do not apply). The parameters, sync and
                          results stay on bfperf's TCP connection: unlike perftest's -R
                          (which moves that exchange onto an rdma_cm QP too) this is not
                          perftest's -R on the wire: a perftest peer, --perftest and
                          --rc-pingpong are refused, and so are the software NIC (no rdma_cm),
                          one-process runs, -c ud, -c dc and --srq (not yet)
      --server            wait for a client on --port
      --client HOST       connect to a bfperf server
  -p, --port N            TCP port of the exchange (default 18515)
      --json              one JSON object per result line (fields below)
      --report_gbits      bandwidth tables in Gb/s (10^9 bits) instead of MB/s (2^20 bytes),
                          as perftest's --report_gbits (JSON and CSV keep MB/s)
  -N, --noPeak            bandwidth tests: no peak measured (it reads 0), as perftest's -N; a
                          run keeps only its first post and last completion times (a
                          latency test refuses it, as perftest)
  -H, --report-histogram  latency tests: print every sample (microseconds; cycles with -C),
                          sorted, as perftest's -H (\"#, usec\" then \"N, value\" lines, before
                          the table row)
  -U, --report-unsorted   latency tests: the same in the order measured, as perftest's -U
  -C, --report-cycles     latency tests: report times in CPU cycles (default microseconds), as
                          perftest's -C: the TSC's ticks, raw (perftest's get_cycles), halved
                          for write and send, in every time of the row (t_min .. 99.9%
                          percentile), -H / -U (\"#, cycles\"), --out_json, and --json / --csv
                          (fields *_cycles for *_us) and --plot; the table's header keeps
                          perftest's [usec] (perftest prints it so with -C) and a line above it
                          gives the TSC's rate to convert; -D reports microseconds (as
                          perftest's duration report); x86_64 only (refused elsewhere)
  -F, --CPU-freq          accepted and ignored, as perftest's -F (bfperf does not warn about
                          the CPU frequency: it calibrates the TSC it times with)
      --csv FILE          also write the results to FILE as CSV, one row per size (columns below)
      --out_json          also write each result to a file as perftest's --out_json writes it
                          (one object: test_info and results; the file holds the last result)
      --out_json_file FILE   that file (also --out_json_file=FILE; default perftest_out.json)
      --plot FILE.svg     latency tests: draw the latency histogram (with -a: FILE-SIZE.svg per size)

Results are written by the side that measures (the client, or this process when both sides
run here). During -a sweeps a progress line (size i of n, time elapsed) is shown on stderr
when stderr is a terminal; --json does not hide it (JSON goes to stdout).

JSON, one object per size. Latency tests (times in microseconds, or CPU cycles with -C, the
keys then ending in _cycles for _us; write and send report half the round trip, read and
atomic the whole request, as perftest):
  test          write_lat | write_imm_lat | read_lat | send_lat | atomic_lat
  device        the --device argument (auto, sim, or a device name)
  bytes         message size;  iterations  measured iterations (after --warmup)
  t_min_us t_max_us t_typical_us (median) t_avg_us t_stdev_us p99_us p999_us
  mode          poll (busy polling) | event (--events)
  recv          rq (the QP's receive queue) | srq (--srq)
  connection    RC | UD | DC (-c)
Latency tests with -D: test, device, bytes, iterations (completed in the measured time),
  t_avg_us (perftest's t_avg), tps_average, sample_s (the measured seconds), mode, recv,
  connection
Bandwidth tests:
  test          write_bw | read_bw | send_bw | atomic_bw;  device, bytes, iterations as above
  bw_peak_mb_s  perftest's peak: size over the least time per request from a post to a
                later completion, MB/s (perftest's MB: 2^20 bytes/s); 0 with -N, in a
                timed run or above 20000 iterations per QP or over all QPs (perftest's
                noPeak)
  bw_avg_mb_s   measured run, first measured post to last completion, MB/s
  msg_rate_mpps messages per second, millions;  mode, recv  as above
CSV columns: the same names in the same order, after a header line.";

/// Parses the options after the subcommand.
///
/// # Errors
/// A message naming the bad option or value.
pub fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts::default();
    let mut inline_given = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        fn num<T: std::str::FromStr>(name: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{name}: '{v}' is not a valid number"))
        }
        match a.as_str() {
            // perftest's long names beside bfperf's (`long_options` of
            // `parser` in perftest_parameters.c), so its command lines run unchanged.
            "-d" | "--device" | "--ib-dev" => o.device = val(a)?,
            "-x" | "--gid-index" => o.gid_index = Some(num(a, val(a)?)?),
            "-i" | "--ib-port" => o.ib_port = num(a, val(a)?)?,
            "-s" | "--size" => {
                o.size = size_arg(a, &val(a)?)?;
                o.size_given = true;
            }
            "-n" | "--iters" => {
                o.iters = num(a, val(a)?)?;
                o.iters_given = true;
            }
            "--warmup" => o.warmup = num(a, val(a)?)?,
            "-I" | "--inline" | "--inline_size" => {
                o.inline = num(a, val(a)?)?;
                inline_given = true;
                o.inline_given = true;
            }
            "-l" | "--post-list" | "--post_list" => o.post_list = num(a, val(a)?)?,
            "-t" | "--tx-depth" => o.tx_depth = num(a, val(a)?)?,
            "--pin" => o.pin = Some(num(a, val(a)?)?),
            "--pin_cores" | "--pin-cores" => {
                let l = val(a)?;
                o.pin_cores = Some((l.clone(), cpu_list(&l, configured_cpus())?));
            }
            f if f.starts_with("--pin_cores=") || f.starts_with("--pin-cores=") => {
                let l = &f["--pin_cores=".len()..];
                o.pin_cores = Some((l.to_string(), cpu_list(l, configured_cpus())?));
            }
            "-a" | "--all" => o.all = true,
            "--path" => {
                let p = val(a)?;
                if !["direct", "verbs", "auto"].contains(&p.as_str()) {
                    return Err(format!("--path: '{p}' is not direct, verbs or auto"));
                }
                o.path = Some(p);
            }
            // perftest's spelling (ib_atomic_lat / ib_atomic_bw -A).
            "-A" | "--atomic_type" => {
                o.atomic_given = true;
                o.atomic = match val(a)?.as_str() {
                    "FETCH_AND_ADD" => Atomic::FetchAdd,
                    "CMP_AND_SWAP" => Atomic::CompareSwap,
                    other => {
                        return Err(format!(
                            "-A: '{other}' is not FETCH_AND_ADD or CMP_AND_SWAP"
                        ))
                    }
                }
            }
            "--atomic" => {
                o.atomic_given = true;
                o.atomic = match val(a)?.as_str() {
                    "fa" => Atomic::FetchAdd,
                    "cs" => Atomic::CompareSwap,
                    other => return Err(format!("--atomic: '{other}' is not fa or cs")),
                }
            }
            "--server" => o.server = true,
            "--client" => o.client = Some(val(a)?),
            "-p" | "--port" => o.port = num(a, val(a)?)?,
            "--json" => o.json = true,
            "--report_gbits" | "--report-gbits" => o.gbits = true,
            "-N" | "--noPeak" => o.no_peak = true,
            "-H" | "--report-histogram" | "--report-histogrm" => o.histogram = true,
            "-U" | "--report-unsorted" => o.unsorted = true,
            "-C" | "--report-cycles" | "--report_cycles" => o.cycles = true,
            // perftest's -F: no warning about the CPU frequency governor. bfperf gives none
            // (it calibrates the TSC it times with): accepted, so that perftest's command
            // lines run unchanged.
            "-F" | "--CPU-freq" => {}
            "--csv" => o.csv = Some(val(a)?.into()),
            "--out_json" => o.out_json = Some(OUT_JSON_DEFAULT.into()),
            "--out_json_file" => o.out_json_file = Some(val(a)?.into()),
            f if f.starts_with("--out_json_file=") => {
                o.out_json_file = Some(f["--out_json_file=".len()..].into())
            }
            "--plot" => o.plot = Some(val(a)?.into()),
            "--write-with-imm" | "--write_with_imm" => o.write_imm = true,
            "-e" | "--events" => o.events = true,
            "--srq" | "--use-srq" => o.srq = true,
            "--odp" => o.odp = true,
            "--use_hugepages" | "--use-hugepages" => o.hugepages = true,
            "--mmap" => o.mmap = Some(val(a)?.into()),
            f if f.starts_with("--mmap=") => o.mmap = Some(f["--mmap=".len()..].into()),
            "--mmap-offset" | "--mmap_offset" => o.mmap_offset = Some(num(a, val(a)?)?),
            f if f.starts_with("--mmap-offset=") || f.starts_with("--mmap_offset=") => {
                o.mmap_offset = Some(num("--mmap-offset", f["--mmap-offset=".len()..].into())?)
            }
            "--use_dmabuf" | "--use-dmabuf" => o.dmabuf = true,
            "--hw-timestamps" | "--hw_timestamps" => o.hw_ts = true,
            "--perftest" => o.perftest = true,
            "--rc-pingpong" | "--rc_pingpong" => o.rc_pingpong = true,
            "-D" | "--duration" => o.duration = Some(num(a, val(a)?)?),
            "-f" | "--margin" => o.margin = Some(num(a, val(a)?)?),
            "--run_infinitely" | "--run-infinitely" => o.run_infinitely = true,
            "-q" | "--qp" => o.qps = num(a, val(a)?)?,
            "-b" | "--bidirectional" => o.bidirectional = true,
            "--report-both" | "--report_both" => o.report_both = true,
            "-R" | "--rdma_cm" | "--rdma-cm" => o.rdma_cm = true,
            "-c" | "--connection" => {
                o.connection = match val(a)?.to_ascii_lowercase().as_str() {
                    "rc" => Connection::Rc,
                    "ud" => Connection::Ud,
                    "dc" => Connection::Dc,
                    other => return Err(format!("--connection: '{other}' is not rc, ud or dc")),
                }
            }
            "--cqe-zip" => {
                o.cqe_zip = Some(match val(a)?.as_str() {
                    "hash" => blueflame::MiniCqeFormat::Hash,
                    "csum" => blueflame::MiniCqeFormat::Csum,
                    "stridx" => blueflame::MiniCqeFormat::CsumStridx,
                    other => {
                        return Err(format!("--cqe-zip: '{other}' is not hash, csum or stridx"))
                    }
                })
            }
            other => return Err(format!("unknown option '{other}'")),
        }
    }
    if o.size == 0 || o.post_list == 0 || o.tx_depth == 0 {
        return Err("--size, --post-list and --tx-depth must be at least 1".into());
    }
    if o.iters < MIN_ITER {
        // perftest's MIN_ITER: a latency run keeps iters - 1 differences, less its two
        // largest.
        return Err(format!(
            "--iters {}: at least {MIN_ITER} (perftest's MIN_ITER)",
            o.iters
        ));
    }
    // perftest's bounds (`CHECK_VALUE_IN_RANGE` for -n and -t, UINT_MAX / 2 for -s, an int
    // for -D and -f): past them a buffer length, a queue size or a deadline overflowed
    // (a panic, or an abort on an allocation no machine has).
    for (name, v, max, range, why) in [
        ("--iters", o.iters, MAX_ITER, "at most", "MAX_ITER"),
        ("--tx-depth", o.tx_depth, MAX_TX, "1 to", "MAX_TX"),
        ("--size", o.size, MAX_SIZE, "1 to", "UINT_MAX / 2"),
    ] {
        if v > max {
            return Err(format!("{name} {v}: {range} {max} (perftest's {why})"));
        }
    }
    for (name, v) in [("-D", o.duration), ("-f", o.margin)] {
        if let Some(v) = v.filter(|&v| v > i32::MAX as u64) {
            return Err(format!(
                "{name} {v}: at most {} seconds (an int, as perftest's)",
                i32::MAX
            ));
        }
    }
    if let Some(c) = o.pin {
        let cpus = configured_cpus();
        if c >= cpus || c >= libc::CPU_SETSIZE as usize {
            return Err(format!(
                "--pin {c}: the system has {cpus} CPUs (0-{})",
                cpus - 1
            ));
        }
    }
    if !(1..=MAX_QPS).contains(&o.qps) {
        // perftest's MIN_QP_NUM and MAX_QP_NUM.
        return Err(format!("-q: {} QPs, not 1 to {MAX_QPS}", o.qps));
    }
    // Every run counts `warmup + iters` requests per QP, over all its QPs.
    if o.iters
        .checked_add(o.warmup)
        .and_then(|n| n.checked_mul(o.qps))
        .is_none()
    {
        return Err(format!(
            "--iters {} with --warmup {} over {} QPs: more requests than a count holds",
            o.iters, o.warmup, o.qps
        ));
    }
    if o.inline > MAX_INLINE {
        // perftest's parser: CHECK_VALUE_IN_RANGE(inline_size, 0, MAX_INLINE).
        return Err(format!(
            "-I {}: 0 to {MAX_INLINE} (perftest's MAX_INLINE)",
            o.inline
        ));
    }
    if o.post_list > o.tx_depth {
        return Err(format!(
            "--post-list {} exceeds --tx-depth {}",
            o.post_list, o.tx_depth
        ));
    }
    if o.server && o.client.is_some() {
        return Err("--server and --client exclude each other".into());
    }
    if o.dmabuf {
        // Messages gather from the dma-buf: an inline message would be copied by the CPU
        // from host memory (perftest refuses inline with device memory).
        if inline_given && o.inline > 0 {
            return Err(format!(
                "--use_dmabuf with -I {}: messages are gathered from the dma-buf, never inline \
                 (it has no CPU view; perftest refuses inline with device memory): drop -I or give -I 0",
                o.inline
            ));
        }
        o.inline = 0;
    }
    // perftest: --out_json turns the file on, --out_json_file names it.
    if let (Some(f), Some(out)) = (o.out_json_file.clone(), o.out_json.as_mut()) {
        *out = f;
    }
    Ok(o)
}

/// `-s`'s value as perftest's parser reads it (`case 's'`): a trailing `K` multiplies by
/// 1024, a trailing `M` by 1024 * 1024, and the number is read as `strtol(optarg, NULL, 0)`
/// reads it (`0x` hexadecimal, a leading `0` octal, else decimal). perftest takes what
/// `strtol` stops at; here a value that is not all digits of its base is refused, named.
fn size_arg(name: &str, v: &str) -> Result<usize, String> {
    let bad = || format!("{name}: '{v}' is not a valid number");
    let (digits, factor) = match v.strip_suffix('K') {
        Some(d) => (d, 1024),
        None => match v.strip_suffix('M') {
            Some(d) => (d, 1024 * 1024),
            None => (v, 1),
        },
    };
    let (digits, radix) = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (h, 16)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (&digits[1..], 8)
    } else {
        (digits, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(bad());
    }
    let n = usize::from_str_radix(digits, radix)
        .map_err(|_| format!("--size {v}: more than {MAX_SIZE} bytes (perftest's UINT_MAX / 2)"))?;
    n.checked_mul(factor)
        .ok_or_else(|| format!("--size {v}: more than {MAX_SIZE} bytes (perftest's UINT_MAX / 2)"))
}

/// The seconds of a timed run: `-D`, or perftest's default of 5 with `--run_infinitely`
/// alone; None for a run of `--iters`.
pub fn duration(o: &Opts) -> Option<u64> {
    o.duration.or(o.run_infinitely.then_some(5))
}

/// The margin of a `-D` run: `-f`, or a quarter of the duration (perftest's default when
/// `-f` is not given); None without `-D`.
pub fn margin(o: &Opts) -> Option<u64> {
    duration(o).map(|d| o.margin.unwrap_or(d / 4))
}

/// The sizes to run.
pub fn sizes(o: &Opts) -> Vec<usize> {
    if o.all {
        (1..=23).map(|s| 1usize << s).collect()
    } else {
        vec![o.size]
    }
}

/// Sets what the test `name` takes by default where its option was not given: the inline
/// limit ([`inline_for`]), the message size ([`size_for`]) and the iterations
/// ([`iters_for`]), perftest's each.
pub fn resolve(name: &str, o: &mut Opts) {
    o.inline = inline_for(name, o);
    o.size = size_for(name, o);
    o.iters = iters_for(name, o);
}

/// The message size a test runs with: `-s` when given, else perftest's default for it
/// (`init_perftest_params`): 8 bytes for the atomics (`DEF_SIZE_ATOMIC`), 65536 for the
/// other bandwidth tests (`DEF_SIZE_BW`), 2 for the other latency tests (`DEF_SIZE_LAT`);
/// `send-lat --rc-pingpong` takes `ibv_rc_pingpong`'s 4096, whose exchange carries no size.
/// Over UD a default above the path MTU becomes the MTU (`ud::sizes`, as perftest's); `-a`
/// runs every size whatever this says. One 8 bytes for every test measured something else
/// than perftest's program of the same name run without options (a review's finding).
pub fn size_for(name: &str, o: &Opts) -> usize {
    if o.size_given {
        return o.size;
    }
    match name {
        "atomic-lat" | "atomic-bw" => DEF_SIZE_ATOMIC,
        "send-lat" if o.rc_pingpong => RC_PINGPONG_SIZE,
        n if n.ends_with("-bw") => DEF_SIZE_BW,
        _ => DEF_SIZE_LAT,
    }
}

/// The iterations a test runs: `-n` when given, else perftest's default for it
/// (`init_perftest_params`): 5000 for the write bandwidth test (`DEF_ITERS_WB`), 1000 for
/// every other (`DEF_ITERS`); `send-lat --rc-pingpong` takes `ibv_rc_pingpong`'s 1000.
pub fn iters_for(name: &str, o: &Opts) -> usize {
    if o.iters_given {
        return o.iters;
    }
    match name {
        "send-lat" if o.rc_pingpong => RC_PINGPONG_ITERS,
        "write-bw" => DEF_ITERS_WB,
        _ => DEF_ITERS,
    }
}

/// The inline limit a test runs with: `-I` when given, else perftest's default for it
/// (`set_max_inline`: 220 for write latency, 236 for send latency over RC (188 over UD, 150
/// over DC), 0 for reads, atomics and every bandwidth test). One 220 for every test made
/// bfperf's bandwidth tests inline small messages where perftest's do not (a review's
/// finding).
pub fn inline_for(name: &str, o: &Opts) -> u32 {
    if o.inline_given || o.dmabuf {
        return o.inline;
    }
    match (name, o.connection) {
        ("write-lat", Connection::Dc) | ("send-lat", Connection::Dc) => 150,
        ("write-lat", _) => 220,
        ("send-lat", Connection::Ud) => 188,
        ("send-lat", _) => 236,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_perftest_like_options() {
        let o = parse(&args(
            "-d rxe0 -x 1 -s 64 -n 500 -I 0 -l 8 -t 64 --path verbs --atomic cs --json",
        ))
        .unwrap();
        assert_eq!(
            (o.device.as_str(), o.gid_index, o.size, o.iters, o.inline),
            ("rxe0", Some(1), 64, 500, 0)
        );
        assert_eq!(
            (o.post_list, o.tx_depth, o.atomic, o.json),
            (8, 64, Atomic::CompareSwap, true)
        );
        assert_eq!(o.path.as_deref(), Some("verbs"));
        assert_eq!(sizes(&parse(&args("-a")).unwrap()).last(), Some(&(8 << 20)));
    }

    #[test]
    fn cqe_zip_takes_a_format_for_bandwidth_tests() {
        let o = parse(&args("--cqe-zip hash")).unwrap();
        assert_eq!(o.cqe_zip, Some(blueflame::MiniCqeFormat::Hash));
        assert_eq!(
            parse(&args("--cqe-zip stridx")).unwrap().cqe_zip,
            Some(blueflame::MiniCqeFormat::CsumStridx)
        );
        assert!(parse(&args("--cqe-zip lz4")).unwrap_err().contains("lz4"));
        assert!(check_for("write-bw", &o).is_ok());
        assert!(check_for("write-lat", &o)
            .unwrap_err()
            .contains("bandwidth"));
    }

    #[test]
    fn csv_and_plot_take_a_file() {
        let o = parse(&args("-a --csv out/lat.csv --plot lat.svg")).unwrap();
        assert_eq!(o.csv, Some("out/lat.csv".into()));
        assert_eq!(o.plot, Some("lat.svg".into()));
        assert!(o.all);
        let o = parse(&args("-s 64")).unwrap();
        assert_eq!((o.csv, o.plot), (None, None));
        assert!(parse(&args("--csv"))
            .unwrap_err()
            .contains("--csv needs a value"));
        assert!(parse(&args("--plot"))
            .unwrap_err()
            .contains("--plot needs a value"));
        assert!(USAGE.contains("--csv FILE") && USAGE.contains("p999_us"));
        let plot = parse(&args("--plot h.svg")).unwrap();
        assert!(check_for("write-lat", &plot).is_ok());
        assert!(check_for("read-bw", &plot).unwrap_err().contains("latency"));
        assert!(check_for("write-bw", &parse(&args("--csv b.csv")).unwrap()).is_ok());
    }

    #[test]
    fn refuses_bad_values() {
        assert!(parse(&args("-s 0")).is_err());
        assert!(parse(&args("-s many")).unwrap_err().contains("many"));
        assert!(parse(&args("--path fast")).is_err());
        assert!(parse(&args("-l 8 -t 4")).is_err());
        assert!(parse(&args("--server --client h")).is_err());
        assert!(parse(&args("--bogus")).unwrap_err().contains("--bogus"));
        assert!(parse(&args("-n")).unwrap_err().contains("needs a value"));
        // Counts a run adds up (warm-up and measured requests, over every QP): refused
        // before they overflow (a debug build panicked, a release one ran a wrapped count).
        assert!(parse(&args("-n 18446744073709551615"))
            .unwrap_err()
            .contains("--iters 18446744073709551615"));
        assert!(parse(&args("-q 2 --warmup 9223372036854775808"))
            .unwrap_err()
            .contains("over 2 QPs"));
    }

    #[test]
    fn srq_only_where_there_are_receives() {
        let s = parse(&args("--srq")).unwrap();
        assert!(s.srq);
        assert!(!parse(&[]).unwrap().srq);
        assert!(check_for("send-lat", &s).is_ok());
        assert!(check_for("send-bw", &s).is_ok());
        assert!(check_for("write-lat", &s)
            .unwrap_err()
            .contains("without --write-with-imm"));
        assert!(check_for(
            "write-lat",
            &parse(&args("--srq --write-with-imm")).unwrap()
        )
        .is_ok());
        for t in ["read-lat", "atomic-lat", "write-bw", "read-bw"] {
            assert!(check_for(t, &s)
                .unwrap_err()
                .contains("--srq needs receives"));
        }
        assert!(USAGE.contains("--srq") && USAGE.contains("recv"));
    }

    #[test]
    fn ud_for_send_tests_only() {
        let ud = parse(&args("-c UD -s 64")).unwrap();
        assert_eq!(ud.connection, Connection::Ud);
        assert_eq!(
            parse(&args("--connection rc")).unwrap().connection,
            Connection::Rc
        );
        assert_eq!(parse(&args("")).unwrap().connection, Connection::Rc);
        assert!(parse(&args("-c xrc")).unwrap_err().contains("'xrc'"));
        assert!(check_for("send-lat", &ud).is_ok());
        assert!(check_for("send-bw", &ud).is_ok());
        assert!(check_for("write-lat", &ud)
            .unwrap_err()
            .contains("sends only"));
        let srv = parse(&args("-c ud --server")).unwrap();
        assert!(check_for("send-lat", &srv)
            .unwrap_err()
            .contains("--server"));
        let pl = parse(&args("-c ud -l 4")).unwrap();
        assert!(check_for("send-bw", &pl)
            .unwrap_err()
            .contains("--post-list"));
        assert!(USAGE.contains("-c, --connection rc|ud"));
        let srq = parse(&args("-c ud --srq")).unwrap();
        assert!(check_for("send-lat", &srq).unwrap_err().contains("--srq"));
    }

    #[test]
    fn mmap_takes_a_file_and_an_offset() {
        let o = parse(&args("--mmap=/dev/shm/x --mmap-offset=8192")).unwrap();
        assert_eq!(o.mmap.as_deref(), Some(std::path::Path::new("/dev/shm/x")));
        assert_eq!(o.mmap_offset, Some(8192));
        let p = parse(&args("--mmap /dev/shm/x --mmap-offset 4096")).unwrap();
        assert_eq!((p.mmap, p.mmap_offset), (o.mmap.clone(), Some(4096)));
        assert!(check_for("write-lat", &o).is_ok());
        assert!(parse(&args("--mmap-offset=x")).unwrap_err().contains("'x'"));
        let e = check_for("write-lat", &parse(&args("--mmap-offset=0")).unwrap());
        assert!(e.unwrap_err().contains("goes with --mmap"));
        let e = check_for(
            "write-lat",
            &parse(&args("--mmap=f --use_hugepages")).unwrap(),
        );
        assert!(e.unwrap_err().contains("one memory type"));
        let e = check_for("send-lat", &parse(&args("--mmap=f -c ud")).unwrap());
        assert!(e.unwrap_err().contains("-c ud"));
    }

    #[test]
    fn use_dmabuf_is_parsed_and_refused_where_the_cpu_would_touch_the_buffer() {
        let o = parse(&args("--use_dmabuf")).unwrap();
        assert!(o.dmabuf && !parse(&[]).unwrap().dmabuf);
        assert_eq!(parse(&args("--use-dmabuf")).unwrap(), o);
        // Messages gather from the dma-buf: no inline, and an explicit -I N is refused.
        assert_eq!(o.inline, 0);
        let given = parse(&args("--use_dmabuf -I 0")).unwrap();
        assert_eq!((given.inline, given.dmabuf), (0, true));
        assert_eq!(inline_for("write-lat", &given), 0);
        let e = parse(&args("-I 64 --use_dmabuf")).unwrap_err();
        assert!(e.contains("never inline") && e.contains("-I 64"), "{e}");
        for t in [
            "write-bw",
            "read-bw",
            "send-bw",
            "atomic-bw",
            "send-lat",
            "read-lat",
            "atomic-lat",
        ] {
            assert!(check_for(t, &o).is_ok(), "{t}");
        }
        let wi = parse(&args("--use_dmabuf --write-with-imm")).unwrap();
        assert!(check_for("write-lat", &wi).is_ok());
        let e = check_for("write-lat", &o).unwrap_err();
        assert!(
            e.contains("no CPU") && e.contains("--write-with-imm"),
            "{e}"
        );
        for (more, why) in [
            ("--use_hugepages", "one memory type"),
            ("--mmap=f", "one memory type"),
            ("--odp", "--odp"),
            ("-c ud", "-c ud"),
            ("--client h --perftest", "perftest"),
            ("--client h --rc-pingpong", "ibv_rc_pingpong"),
        ] {
            let x = parse(&args(&format!("--use_dmabuf {more}"))).unwrap();
            let e = check_for("send-lat", &x).unwrap_err();
            assert!(
                e.starts_with("--use_dmabuf with send-lat") && e.contains(why),
                "{e}"
            );
        }
        let dc = parse(&args("--use_dmabuf -c dc")).unwrap();
        assert!(check_for("write-bw", &dc).is_ok());
        assert!(USAGE.contains("--use_dmabuf") && USAGE.contains("--use_cuda_dmabuf"));
        assert!(USAGE.contains("links no GPU runtime"));
    }

    #[test]
    fn cpu_lists_as_perftest_parses_them() {
        assert_eq!(cpu_list("0", 4), Ok(vec![0]));
        assert_eq!(cpu_list("0,2-3", 4), Ok(vec![0, 2, 3]));
        assert_eq!(cpu_list("3,0-1,1", 8), Ok(vec![0, 1, 3]));
        assert_eq!(cpu_list("0-3,8,12-15", 16).unwrap().len(), 9);
        for (bad, why) in [
            ("", "empty"),
            ("0,", "empty"),
            ("a", "'a' is not a CPU number"),
            ("1-0", "start > end"),
            ("0-x", "'x'"),
            ("4", "CPU 4 out of range: the system has 4 (0-3)"),
            ("2-9", "CPU 9 out of range"),
            ("-1", "'' is not"),
            ("1;2", "'1;2'"),
        ] {
            let e = cpu_list(bad, 4).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert!(e.starts_with(&format!("--pin_cores={bad}:")), "{e}");
        }
        let o = parse(&args("--pin_cores=0")).unwrap();
        assert_eq!(o.pin_cores, Some(("0".into(), vec![0])));
        assert_eq!(
            parse(&args("--pin_cores 0")).unwrap().pin_cores,
            o.pin_cores
        );
        assert!(parse(&args("--pin_cores=100000")).is_err());
    }

    #[test]
    fn qps_and_bidirectional_for_bandwidth_tests_only() {
        let q = parse(&args("-q 4 -b")).unwrap();
        assert_eq!((q.qps, q.bidirectional), (4, true));
        assert_eq!(parse(&args("--qp 2")).unwrap().qps, 2);
        assert_eq!(parse(&[]).unwrap().qps, 1);
        assert!(parse(&args("-q 0")).unwrap_err().contains("-q"));
        assert!(parse(&args("-q 16385")).unwrap_err().contains("16384"));
        for t in ["write-bw", "read-bw", "send-bw", "atomic-bw"] {
            assert!(check_for(t, &q).is_ok(), "{t}");
        }
        for t in ["write-lat", "read-lat", "send-lat", "atomic-lat"] {
            assert!(check_for(t, &parse(&args("-q 2")).unwrap())
                .unwrap_err()
                .contains("bandwidth tests only"));
            assert!(check_for(t, &parse(&args("-b")).unwrap())
                .unwrap_err()
                .contains("only available in bandwidth tests"));
        }
        // -q 1 is every test's default.
        assert!(check_for("write-lat", &parse(&args("-q 1")).unwrap()).is_ok());
        let peer = parse(&args("-q 2 --client h --perftest")).unwrap();
        assert!(check_for("write-bw", &peer).unwrap_err().contains("-q 2"));
        let peer = parse(&args("-b --client h --perftest")).unwrap();
        assert!(check_for("write-bw", &peer)
            .unwrap_err()
            .contains("-b with"));
        let timed = parse(&args("-b -D 4")).unwrap();
        assert!(check_for("write-bw", &timed).unwrap_err().contains("-D"));
        let ud = parse(&args("-q 2 -c ud")).unwrap();
        assert!(check_for("send-bw", &ud).unwrap_err().contains("-c ud"));
        let both = parse(&args("-b --report-both --json")).unwrap();
        assert!(check_for("write-bw", &both).unwrap_err().contains("--json"));
    }

    /// perftest's -D for the latency tests: every latency test takes it (the margin a
    /// quarter of it unless -f says); what a timed latency run cannot do is refused, naming
    /// the option (perftest's words where it has them).
    #[test]
    fn duration_times_latency_tests_as_perftest() {
        let o = parse(&args("-D 3 -f 1")).unwrap();
        assert_eq!((o.duration, o.margin), (Some(3), Some(1)));
        let o = parse(&args("--duration 8")).unwrap();
        assert_eq!((duration(&o), margin(&o)), (Some(8), Some(2)));
        assert!(parse(&args("-D soon")).unwrap_err().contains("'soon'"));
        for t in ["write-lat", "send-lat", "read-lat", "atomic-lat"] {
            for a in ["-D 2", "-D 4 -f 1", "-D 3 --server", "-D 3 --client h"] {
                assert_eq!(check_for(t, &parse(&args(a)).unwrap()), Ok(()), "{t} {a}");
            }
        }
        // perftest's timed latency loops are spoken (not its timed bandwidth tests).
        let peer = parse(&args("-D 4 --client h --perftest")).unwrap();
        for t in ["write-lat", "send-lat", "read-lat"] {
            assert_eq!(check_for(t, &peer), Ok(()), "{t}");
        }
        assert!(check_for("write-bw", &peer)
            .unwrap_err()
            .contains("bandwidth tests"));
        for a in ["-D 2 --write-with-imm", "-D 2 --write-with-imm --srq"] {
            assert_eq!(
                check_for("write-lat", &parse(&args(a)).unwrap()),
                Ok(()),
                "{a}"
            );
        }
        for (t, a, why) in [
            ("write-lat", "--run_infinitely", "bandwidth tests only"),
            (
                "read-lat",
                "--run_infinitely -D 2",
                "run_infinitely exists only in BW",
            ),
            ("send-lat", "-D 2 -e", "doesn't work with events"),
            ("send-lat", "-D 2 -H", "-H, -U"),
            ("write-lat", "-D 2 -U", "average alone"),
            ("write-lat", "-D 2 --plot p.svg", "--plot"),
            ("read-lat", "-D 2 --hw-timestamps", "--hw-timestamps"),
            ("send-lat", "-D 2 --client h --rc-pingpong", "no timed mode"),
            (
                "write-lat",
                "-D 2 --client h --perftest --write-with-imm",
                "--perftest",
            ),
            ("atomic-lat", "-D 2 --client h --perftest", "--perftest"),
            ("write-lat", "-D 2 -a", "drop -a"),
            ("send-lat", "-D 2 -c ud", "-c ud"),
            ("write-lat", "-D 2 -f 1", "twice the margin"),
            ("write-lat", "-f 1", "goes with -D"),
        ] {
            let e = check_for(t, &parse(&args(a)).unwrap()).unwrap_err();
            assert!(e.contains(why), "{t} {a}: {e}");
        }
        assert!(USAGE.contains("bandwidth and latency tests: run SECS"));
        assert!(USAGE.contains("tps_average, sample_s"));
    }

    #[test]
    fn rdma_cm_across_two_bfperf_processes_only() {
        for spelling in ["-R", "--rdma_cm", "--rdma-cm"] {
            assert!(parse(&args(spelling)).unwrap().rdma_cm, "{spelling}");
        }
        assert!(!parse(&[]).unwrap().rdma_cm);
        for side in ["--server", "--client h"] {
            let o = parse(&args(&format!("-R -d rxe0 {side}"))).unwrap();
            for t in ["write-lat", "read-lat", "send-lat", "atomic-lat"] {
                assert!(check_for(t, &o).is_ok(), "{t} {side}");
            }
            let q = parse(&args(&format!("-R -q 2 -b {side}"))).unwrap();
            for t in ["write-bw", "read-bw", "send-bw", "atomic-bw"] {
                assert!(check_for(t, &q).is_ok(), "{t} {side}");
            }
        }
        let refused = |line: &str, test: &str, why: &str| {
            let e = check_for(test, &parse(&args(line)).unwrap()).unwrap_err();
            assert!(e.starts_with(&format!("-R with {test}: ")), "{line}: {e}");
            assert!(e.contains(why), "{line}: {e}");
        };
        refused("-R", "write-lat", "--server on one side");
        refused(
            "-R --server -d sim",
            "write-bw",
            "software NIC has no rdma_cm",
        );
        refused("-R --client h -d sim-stepped", "write-lat", "no rdma_cm");
        refused(
            "-R --client h --perftest",
            "write-lat",
            "not speak to each other",
        );
        refused("-R --client h --rc-pingpong", "send-lat", "perftest's -R");
        // -c ud runs in one process: refused before -R is looked at.
        assert!(check_for("send-lat", &parse(&args("-R --server -c ud")).unwrap()).is_err());
        refused("-R --server -c dc", "write-lat", "-c dc");
        refused("-R --client h --srq", "send-bw", "--srq");
        refused("-R --server -p 65535", "write-lat", "--port + 1");
        assert!(check_for("write-lat", &parse(&args("-R --server -p 65534")).unwrap()).is_ok());
        assert!(USAGE.contains("-R, --rdma_cm") && USAGE.contains("perftest's -R on the wire"));
    }

    #[test]
    fn events_only_where_the_receiver_gets_a_completion() {
        let e = parse(&args("-e")).unwrap();
        assert!(e.events && !e.write_imm);
        assert!(check_for("send-lat", &e).is_ok());
        assert!(check_for("write-lat", &e)
            .unwrap_err()
            .contains("without --write-with-imm"));
        assert!(check_for("read-lat", &e).is_err());
        assert!(check_for("send-bw", &e).is_err());
        let wi = parse(&args("--events --write_with_imm")).unwrap();
        assert!(wi.events && wi.write_imm);
        assert!(check_for("write-lat", &wi).is_ok());
        assert!(check_for("send-lat", &wi)
            .unwrap_err()
            .contains("write-lat"));
        assert!(check_for("read-lat", &parse(&args("")).unwrap()).is_ok());
        let stepped = parse(&args("-e -d sim-stepped")).unwrap();
        assert!(check_for("send-lat", &stepped)
            .unwrap_err()
            .contains("--device sim"));
    }

    /// perftest's inline defaults (`set_max_inline`), `-I` over them.
    #[test]
    fn inline_defaults_are_perftests() {
        let d = parse(&[]).unwrap();
        for (t, c, want) in [
            ("write-lat", "rc", 220),
            ("write-lat", "dc", 150),
            ("send-lat", "rc", 236),
            ("send-lat", "ud", 188),
            ("read-lat", "rc", 0),
            ("atomic-lat", "rc", 0),
            ("write-bw", "rc", 0),
            ("send-bw", "ud", 0),
        ] {
            let o = parse(&args(&format!("-c {c}"))).unwrap();
            assert_eq!(inline_for(t, &o), want, "{t} -c {c}");
        }
        assert_eq!(inline_for("write-bw", &parse(&args("-I 64")).unwrap()), 64);
        assert!(!d.inline_given);
    }

    /// perftest's defaults of `-s` and `-n` (`init_perftest_params`: `DEF_SIZE_LAT`,
    /// `DEF_SIZE_BW`, `DEF_SIZE_ATOMIC`, `DEF_ITERS`, `DEF_ITERS_WB`), per test, so that
    /// `bfperf write-lat` measures what `ib_write_lat` does; `-s` and `-n` kept as given.
    /// One 8 bytes and 10000 iterations for every test failed every row here.
    #[test]
    fn size_and_iters_defaults_are_perftests() {
        let resolved = |t: &str, line: &str| {
            let mut o = parse(&args(line)).unwrap();
            assert_eq!(check_for(t, &o), Ok(()), "{t} {line}");
            resolve(t, &mut o);
            o
        };
        for (t, extra, size, iters) in [
            ("write-lat", "", 2, 1000),
            ("read-lat", "", 2, 1000),
            ("send-lat", "", 2, 1000),
            ("atomic-lat", "", 8, 1000),
            ("write-bw", "", 65536, 5000),
            ("read-bw", "", 65536, 1000),
            ("send-bw", "", 65536, 1000),
            ("atomic-bw", "", 8, 1000),
            ("atomic-lat", "--atomic cs", 8, 1000),
            ("write-lat", "--write-with-imm", 2, 1000),
            // Over UD perftest's default, which `ud::sizes` makes the path MTU.
            ("send-bw", "-c ud", 65536, 1000),
            ("send-lat", "-c ud", 2, 1000),
            ("write-bw", "-c dc", 65536, 5000),
            ("read-lat", "-c dc", 2, 1000),
            ("write-bw", "-q 2 -b", 65536, 5000),
            ("write-bw", "-D 4", 65536, 5000),
            ("send-lat", "-D 4", 2, 1000),
            // A perftest peer runs its own defaults: the same.
            ("write-lat", "--client h --perftest", 2, 1000),
            ("send-bw", "--client h --perftest", 65536, 1000),
            ("write-bw", "--client h --perftest", 65536, 5000),
            // ibv_rc_pingpong's: -s 4096, -n 1000.
            ("send-lat", "--client h --rc-pingpong", 4096, 1000),
        ] {
            let o = resolved(t, extra);
            assert_eq!((o.size, o.iters), (size, iters), "{t} {extra}");
            assert!(!o.size_given && !o.iters_given, "{t} {extra}");
            // -a runs every size whatever -s says (an atomic test refuses it, as
            // perftest's: one size).
            if !extra.contains("-D") && !extra.contains("--") && !t.starts_with("atomic-") {
                let all = resolved(t, &format!("{extra} -a"));
                assert_eq!(sizes(&all).len(), 23, "{t} {extra} -a");
            }
            // Given values are kept, each alone and both.
            let g = resolved(t, &format!("{extra} -s 64 -n 300"));
            assert_eq!((g.size, g.iters), (64, 300), "{t} {extra}");
            assert!(g.size_given && g.iters_given, "{t} {extra}");
            let g = resolved(t, &format!("{extra} --size 4096"));
            assert_eq!((g.size, g.iters), (4096, iters), "{t} {extra}");
            let g = resolved(t, &format!("{extra} --iters 7"));
            assert_eq!((g.size, g.iters), (size, 7), "{t} {extra}");
            // A value that happens to be the default is still given (not taken as
            // ibv_rc_pingpong's or the MTU's).
            let g = resolved(t, &format!("{extra} -s 2 -n 1000"));
            assert!(g.size_given && g.iters_given && g.size == 2, "{t} {extra}");
        }
        // A bfperf server and client of one test agree on the defaults (their parameter
        // lines, which `setup` compares, are the same).
        for t in [
            "write-lat",
            "read-lat",
            "send-lat",
            "atomic-lat",
            "write-bw",
            "read-bw",
            "send-bw",
            "atomic-bw",
        ] {
            let (srv, cli) = (resolved(t, "--server"), resolved(t, "--client h"));
            let name = t.replace('-', "_");
            assert_eq!(
                crate::setup::params(&name, &srv, size_for(t, &srv)),
                crate::setup::params(&name, &cli, size_for(t, &cli)),
                "{t}"
            );
        }
        for old in ["(default 8)", "(default 10000"] {
            assert!(!USAGE.contains(old), "{old}");
        }
        assert!(USAGE.contains("2 latency tests, 65536 bandwidth"));
        assert!(USAGE.contains("5000 write-bw, 1000 the others"));
    }

    /// perftest's `-C` (`--report-cycles`): every latency test takes it, with whatever else
    /// a latency test takes (`-D` too, whose report stays in microseconds, as perftest's);
    /// a bandwidth test refuses it in perftest's words (its parser: " Available only on
    /// Latency tests"), and so does a build off x86_64 (no cycle counter read there).
    #[test]
    fn report_cycles_for_latency_tests_only_as_perftest() {
        for spelling in ["-C", "--report-cycles", "--report_cycles"] {
            assert!(parse(&args(spelling)).unwrap().cycles, "{spelling}");
        }
        assert!(!parse(&[]).unwrap().cycles);
        for t in ["write-lat", "read-lat", "send-lat", "atomic-lat"] {
            for more in [
                "",
                " -H -U",
                " --json --csv c.csv --plot p.svg",
                " --out_json",
                " -D 4",
                " --client h --perftest",
                " --server",
            ] {
                let o = parse(&args(&format!("-C{more}"))).unwrap();
                let r = check_for(t, &o);
                if cfg!(target_arch = "x86_64") {
                    if t == "atomic-lat" && more.contains("--perftest") {
                        // Refused for the peer (atomics are not spoken), not for -C.
                        assert!(!r.unwrap_err().contains("-C"), "{t} -C{more}");
                    } else {
                        assert_eq!(r, Ok(()), "{t} -C{more}");
                    }
                } else {
                    let e = r.unwrap_err();
                    assert!(e.contains("x86_64") && e.contains("drop -C"), "{e}");
                }
            }
        }
        for (line, t) in [
            ("send-lat", "-C -c ud"),
            ("write-lat", "-C --write-with-imm -e"),
        ] {
            let o = parse(&args(t)).unwrap();
            assert_eq!(
                check_for(line, &o).is_ok(),
                cfg!(target_arch = "x86_64"),
                "{line} {t}"
            );
        }
        for t in ["write-bw", "read-bw", "send-bw", "atomic-bw"] {
            for spelling in ["-C", "--report-cycles"] {
                let e = check_for(t, &parse(&args(spelling)).unwrap()).unwrap_err();
                assert!(
                    e.starts_with(&format!("-C (--report-cycles) with {t}: "))
                        && e.contains("\"Available only on Latency tests\""),
                    "{t} {spelling}: {e}"
                );
            }
        }
        assert!(USAGE.contains("-C, --report-cycles     latency tests: report times in CPU cycles"));
        assert!(USAGE.contains("keys then ending in _cycles for _us"));
    }

    /// perftest's `-N` (`--noPeak`): bandwidth tests take it; a latency test refuses it in
    /// perftest's words (its parser: " NoPeak only valid for BW tests").
    #[test]
    fn no_peak_for_bandwidth_tests_only_as_perftest() {
        for spelling in ["-N", "--noPeak"] {
            let o = parse(&args(spelling)).unwrap();
            assert!(o.no_peak, "{spelling}");
            for t in ["write-bw", "read-bw", "send-bw", "atomic-bw"] {
                assert_eq!(check_for(t, &o), Ok(()), "{t} {spelling}");
            }
            for t in ["write-lat", "read-lat", "send-lat", "atomic-lat"] {
                let e = check_for(t, &o).unwrap_err();
                assert!(
                    e.starts_with(&format!("-N (--noPeak) with {t}: "))
                        && e.contains("\"NoPeak only valid for BW tests\""),
                    "{t} {spelling}: {e}"
                );
            }
        }
    }

    /// perftest's own long option names are taken as its short ones.
    #[test]
    fn perftests_long_names() {
        for (theirs, ours) in [
            ("--ib-dev sim", "-d sim"),
            ("--inline_size 64", "-I 64"),
            ("--post_list 4", "-l 4"),
            ("--report-histogrm", "-H"),
            ("--use-srq", "--srq"),
        ] {
            assert_eq!(
                parse(&args(theirs)).unwrap(),
                parse(&args(ours)).unwrap(),
                "{theirs}"
            );
        }
    }

    /// perftest's `-s` (`parser`, `case 's'` of perftest_parameters.c): a `K` or `M` suffix
    /// multiplies by 1024 or 1024 * 1024, and the number is read by `strtol(optarg, NULL, 0)`
    /// (`0x` hexadecimal, a leading 0 octal); `-s 64K` and `-s 1M` were refused here as "not a
    /// valid number", so perftest's command lines with them did not run.
    #[test]
    fn sizes_take_perftests_suffixes_and_bases() {
        for (given, want) in [
            ("64K", 65536),
            ("1M", 1 << 20),
            ("8M", 8 << 20),
            ("0x40", 64),
            ("010", 8),
            ("4096", 4096),
            ("0", 0),
        ] {
            match parse(&args(&format!("-s {given}"))) {
                Ok(o) => assert_eq!((o.size, o.size_given), (want, true), "-s {given}"),
                Err(e) => assert!(want == 0 && e.contains("at least 1"), "-s {given}: {e}"),
            }
        }
        assert_eq!(parse(&args("--size 2K")).unwrap().size, 2048);
        // perftest's bound (UINT_MAX / 2) after the factor; no wrap on the multiplication.
        assert!(parse(&args("-s 2048M")).unwrap_err().contains("--size"));
        assert!(parse(&args("-s 18446744073709551615K"))
            .unwrap_err()
            .contains("--size"));
        for bad in ["K", "M", "x", "1.5K", "-1", "0x", "09"] {
            let e = parse(&args(&format!("-s {bad}"))).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "-s {bad}: {e}");
        }
    }

    /// What perftest's parser refuses, refused here rather than accepted and ignored
    /// (perftest_parameters.c, `parser` and `check_opts` / `force_dependecies`): a post list
    /// above 1 in a latency test (" Post list is supported in BW tests only"), `-I` with a read
    /// or atomic test (" Inline feature not available on READ/Atomic verbs") or above
    /// `MAX_INLINE` (1024), `-A` with a test that is not an atomic one (" You are not running
    /// the atomic_lat/bw test!"), and `-a` with an atomic test (RUN_ALL makes the size
    /// `MAX_SIZE`: "Message size cannot be changed for Atomic tests"; bfperf printed 23
    /// identical rows of 8 bytes).
    #[test]
    fn options_perftest_refuses_are_refused_not_ignored() {
        let refused = |test: &str, line: &str, why: &str| {
            let e =
                check_for(test, &parse(&args(line)).unwrap()).expect_err(&format!("{test} {line}"));
            assert!(e.contains(why), "{test} {line}: {e}");
        };
        for t in ["write-lat", "read-lat", "send-lat", "atomic-lat"] {
            refused(t, "-l 2", "Post list is supported in BW tests only");
            refused(
                t,
                "--post_list 4 -t 8",
                "Post list is supported in BW tests only",
            );
            assert_eq!(check_for(t, &parse(&args("-l 1")).unwrap()), Ok(()), "{t}");
        }
        for t in ["write-bw", "read-bw", "send-bw", "atomic-bw"] {
            assert_eq!(check_for(t, &parse(&args("-l 4")).unwrap()), Ok(()), "{t}");
        }
        for t in ["read-lat", "read-bw", "atomic-lat", "atomic-bw"] {
            for line in ["-I 64", "-I 0", "--inline_size 8"] {
                refused(t, line, "Inline feature not available on READ/Atomic verbs");
            }
        }
        for t in ["write-lat", "send-lat", "write-bw", "send-bw"] {
            assert_eq!(check_for(t, &parse(&args("-I 64")).unwrap()), Ok(()), "{t}");
        }
        assert!(parse(&args("-I 1024")).is_ok());
        let e = parse(&args("-I 1025")).unwrap_err();
        assert!(e.contains("-I 1025") && e.contains("MAX_INLINE"), "{e}");
        for t in [
            "write-lat",
            "read-lat",
            "send-lat",
            "write-bw",
            "read-bw",
            "send-bw",
        ] {
            for line in [
                "-A CMP_AND_SWAP",
                "-A FETCH_AND_ADD",
                "--atomic cs",
                "--atomic fa",
            ] {
                refused(t, line, "You are not running the atomic_lat/bw test!");
            }
        }
        for t in ["atomic-lat", "atomic-bw"] {
            assert_eq!(
                check_for(t, &parse(&args("-A CMP_AND_SWAP")).unwrap()),
                Ok(())
            );
            refused(t, "-a", "Message size cannot be changed for Atomic tests");
        }
        assert_eq!(check_for("write-lat", &parse(&args("-a")).unwrap()), Ok(()));
    }
}
