//! Latency statistics, printed as perftest prints them.

/// The unit a latency test reports its times in: microseconds, or CPU cycles with `-C`
/// (perftest's `--report-cycles`: `print_report_lat` then divides its cycle differences by
/// 1 instead of `get_cpu_mhz`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Microseconds (the samples are nanoseconds).
    Usec,
    /// CPU cycles, the TSC's ticks (the samples are ticks).
    Cycles,
}

impl Unit {
    /// `-C` given or not.
    pub fn of(cycles: bool) -> Unit {
        if cycles {
            Unit::Cycles
        } else {
            Unit::Usec
        }
    }

    /// perftest's name of it (`USEC`, `CYCLES`): the header of `-H` and `-U` (`#, usec`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Usec => "usec",
            Unit::Cycles => "cycles",
        }
    }

    /// The suffix of bfperf's JSON keys and CSV columns (`t_min_us`, `t_min_cycles`) and
    /// of the `--plot` labels.
    pub fn short(self) -> &'static str {
        match self {
            Unit::Usec => "us",
            Unit::Cycles => "cycles",
        }
    }

    /// A sample in this unit: a sample is nanoseconds (a thousand to the microsecond), or
    /// cycles with `-C` (perftest's `cycles_to_units = 1`).
    pub fn of_sample(self, v: f64) -> f64 {
        match self {
            Unit::Usec => v / 1000.0,
            Unit::Cycles => v,
        }
    }
}

/// Summary of latency samples, in the report's [`Unit`] (microseconds unless `-C`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Fastest.
    pub min: f64,
    /// Slowest.
    pub max: f64,
    /// Median (perftest's "typical").
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// perftest's `LAT_MEASURE_TAIL`: the two largest samples are left out of the median, mean,
/// deviation and percentiles (`print_report_lat` sorts the samples, then shortens the count
/// by two).
pub const TAIL: usize = 2;

/// How many of `all` sorted samples the statistics (and `-H`) keep: all but the [`TAIL`]
/// largest, or all when there are no more than that.
pub fn kept(all: usize) -> usize {
    if all > TAIL {
        all - TAIL
    } else {
        all
    }
}

/// Summarises samples (sorted in place; nanoseconds for [`Unit::Usec`], cycles for
/// [`Unit::Cycles`]) in `unit` as perftest's `print_report_lat` does: sorted, the [`TAIL`] largest left out (kept when there are no
/// more than that), the median as perftest's `get_median` (the mean of the two middle ones
/// when the count is even), t_max perftest's `delta[measure_cnt]` (the smaller
/// of the two left out), and the percentiles at index
/// `ceil(count * p)`. The deviation is computed in floating point (perftest truncates each
/// difference to an integer number of microseconds).
pub fn summarize(ns: &mut [f64], unit: Unit) -> Summary {
    assert!(!ns.is_empty(), "no samples");
    ns.sort_by(f64::total_cmp);
    let us = |v: f64| unit.of_sample(v);
    let all = ns.len();
    let n = kept(all);
    let kept = &ns[..n];
    let at = |i: usize| ns[i.min(all - 1)];
    let pct = |p: f64| at(((n as f64) * p).ceil() as usize);
    let median = if n >= 2 && !(n - 1).is_multiple_of(2) {
        (kept[n / 2] + kept[n / 2 - 1]) / 2.0
    } else {
        kept[n / 2]
    };
    let avg = kept.iter().sum::<f64>() / n as f64;
    let var = kept.iter().map(|v| (v - avg) * (v - avg)).sum::<f64>() / n as f64;
    Summary {
        min: us(ns[0]),
        max: us(at(n)),
        typical: us(median),
        avg: us(avg),
        stdev: us(var.sqrt()),
        p99: us(pct(0.99)),
        p999: us(pct(0.999)),
    }
}

/// `v` as C's `printf("%g")` prints it (six significant digits, trailing zeros dropped,
/// the exponent form below 1e-4 and from 1e6): perftest's format for the samples of `-H` and
/// `-U`.
pub fn g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    // The exponent after rounding to six significant digits.
    let sci = format!("{v:.5e}");
    let (mant, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    let trim = |t: &str| {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        trim(&format!("{v:.*}", (5 - exp) as usize))
    }
}

/// perftest's sample lines (`print_report_lat` with `-U` or `-H`): `#, usec` (`#, cycles`
/// with `-C`: perftest's `printf("#, %s\n", units)`), then `N, value` for each sample,
/// numbered from 1, in `unit` (the samples nanoseconds for [`Unit::Usec`], cycles for
/// [`Unit::Cycles`]).
pub fn sample_lines(samples: &[f64], unit: Unit) -> String {
    let mut out = format!("#, {}\n", unit.name());
    for (i, &v) in samples.iter().enumerate() {
        out.push_str(&format!("{}, {}\n", i + 1, g(unit.of_sample(v))));
    }
    out
}

/// perftest's `RESULT_LINE`, around its tables.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// The perftest header line (`RESULT_FMT_LAT`). perftest prints it so with `-C` too: its
/// columns then hold cycles under `[usec]`, and so do bfperf's (a line above the table
/// says so, `main`'s `Times`).
pub const HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";

/// One perftest-style row.
pub fn row(bytes: usize, iters: usize, s: &Summary) -> String {
    format!(
        " {:<7} {:<10}  {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<16.2} {:<22.2} {:<.2}",
        bytes, iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

/// The same as a JSON object, the times in `unit` (keys `t_min_us` ..., or `t_min_cycles`
/// ... with `-C`).
pub fn json(
    test: &str,
    device: &str,
    (mode, recv, connection): (&str, &str, &str),
    bytes: usize,
    iters: usize,
    s: &Summary,
    unit: Unit,
) -> String {
    let u = unit.short();
    format!(
        "{{\"test\":\"{test}\",\"device\":\"{device}\",\"bytes\":{bytes},\"iterations\":{iters},\"t_min_{u}\":{:.3},\"t_max_{u}\":{:.3},\"t_typical_{u}\":{:.3},\"t_avg_{u}\":{:.3},\"t_stdev_{u}\":{:.3},\"p99_{u}\":{:.3},\"p999_{u}\":{:.3},\"mode\":\"{mode}\",\"recv\":\"{recv}\",\"connection\":\"{connection}\"{}}}",
        s.min,
        s.max,
        s.typical,
        s.avg,
        s.stdev,
        s.p99,
        s.p999,
        clock_mhz().map_or(String::new(), |m| format!(",\"clock_mhz\":{m:.3}"))
    )
}

/// What a timed latency run (`-D`) measured, as perftest's `print_report_lat_duration`
/// reports it: no samples, the iterations completed in the run's middle and its length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// Iterations completed in the measured time (perftest's `iters`; at least 1).
    pub iters: u64,
    /// The measured time, seconds (perftest's `tcompleted[0] - tposted[0]`).
    pub secs: f64,
    /// perftest's `rtt_factor`: 2 for a ping-pong (half a round trip reported), 1 for read
    /// and atomic tests.
    pub rtt: u32,
}

impl Timed {
    /// perftest's t_avg: the measured time over the iterations, halved for a ping-pong
    /// (microseconds).
    pub fn t_avg_us(&self) -> f64 {
        self.secs * 1e6 / f64::from(self.rtt) / self.iters as f64
    }

    /// perftest's "tps average": iterations per second of the measured time.
    pub fn tps(&self) -> f64 {
        self.iters as f64 / self.secs
    }
}

/// The header of a timed latency run (perftest's `RESULT_FMT_LAT_DUR`).
pub const HEADER_DUR: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// A timed run's row (perftest's `REPORT_FMT_LAT_DUR`).
pub fn row_dur(bytes: usize, t: &Timed) -> String {
    format!(
        " {:<7}       {}            {:<7.2}        {:<7.2}",
        bytes,
        t.iters,
        t.t_avg_us(),
        t.tps()
    )
}

/// A timed run's row as a JSON object (`sample_s`: the measured seconds).
pub fn json_dur(
    test: &str,
    device: &str,
    (mode, recv, connection): (&str, &str, &str),
    bytes: usize,
    t: &Timed,
) -> String {
    format!(
        "{{\"test\":\"{test}\",\"device\":\"{device}\",\"bytes\":{bytes},\"iterations\":{},\"t_avg_us\":{:.3},\"tps_average\":{:.3},\"sample_s\":{:.6},\"mode\":\"{mode}\",\"recv\":\"{recv}\",\"connection\":\"{connection}\"}}",
        t.iters,
        t.t_avg_us(),
        t.tps(),
        t.secs
    )
}

/// The TSC ticks per microsecond of the first [`Clock`] calibrated in this process (None
/// before one is, and off x86_64). perftest converts the same ticks with `/proc/cpuinfo`'s
/// "cpu MHz" (`get_cpu_mhz`: its own sampling only when the two differ by more than 2%), so
/// the two programs' microseconds can differ by up to 2% for the same ticks; the JSON
/// reports this figure (`clock_mhz`) to put both on one clock (`cargo xtask rxe-compare`).
pub fn clock_mhz() -> Option<f64> {
    CLOCK_MHZ.get().copied()
}

static CLOCK_MHZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

#[cfg(test)]
mod tests {
    use super::*;

    /// perftest's duration report: t_avg the measured time over the iterations (halved for
    /// a ping-pong), tps the iterations over it; its row's and header's columns.
    #[test]
    fn a_timed_run_reports_as_perftest_s_duration_row() {
        let t = Timed {
            iters: 500_000,
            secs: 1.0,
            rtt: 2,
        };
        assert!((t.t_avg_us() - 1.0).abs() < 1e-12);
        assert!((t.tps() - 500_000.0).abs() < 1e-6);
        assert_eq!(
            row_dur(8, &t),
            " 8             500000            1.00           500000.00"
        );
        let read = Timed { rtt: 1, ..t };
        assert!((read.t_avg_us() - 2.0).abs() < 1e-12);
        let j = json_dur("read_lat", "sim", ("poll", "rq", "RC"), 8, &read);
        assert!(j.starts_with("{\"test\":\"read_lat\",\"device\":\"sim\",\"bytes\":8,\"iterations\":500000,\"t_avg_us\":2.000,\"tps_average\":500000.000,\"sample_s\":1.000000,"), "{j}");
        assert!(HEADER_DUR.contains("t_avg[usec]    tps average"));
    }

    /// The JSON line carries the calibrated clock once a `Clock` exists (x86_64: the TSC),
    /// the figure `rxe-compare` needs to put bfperf on perftest's clock.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_json_line_carries_the_calibrated_clock() {
        let _ = Clock::new();
        let mut v = vec![1000.0, 2000.0];
        let line = json(
            "read_lat",
            "sim",
            ("poll", "rq", "RC"),
            8,
            2,
            &summarize(&mut v, Unit::Usec),
            Unit::Usec,
        );
        let mhz = clock_mhz().expect("calibrated");
        assert!(mhz > 1.0, "{mhz}");
        assert!(
            line.ends_with(&format!(",\"clock_mhz\":{mhz:.3}}}")),
            "{line}"
        );
    }

    /// perftest's `print_report_lat` on 1..=1000 us: 998 samples kept (the two largest
    /// left out), median (499 + 500) / 2, t_max `delta[998]` = 999, p99 `delta[989]` = 990,
    /// p99.9 `delta[998]` = 999, mean 499.5.
    #[test]
    fn g_prints_as_printf_g() {
        for (v, want) in [
            (1.0, "1"),
            (0.5, "0.5"),
            (1.234567, "1.23457"),
            (12.3456789, "12.3457"),
            (100.0, "100"),
            (123456.7, "123457"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (999999.5, "1e+06"),
            (0.0, "0"),
        ] {
            assert_eq!(g(v), want, "{v}");
        }
    }

    #[test]
    fn sample_lines_number_each_sample_in_microseconds() {
        assert_eq!(
            sample_lines(&[1500.0, 250.0], Unit::Usec),
            "#, usec\n1, 1.5\n2, 0.25\n"
        );
    }

    /// perftest's `-C`: the samples are cycles and the report divides them by 1
    /// (`cycles_to_units = 1`), so every statistic is in cycles: the same statistics as in
    /// microseconds, a thousand times the figures of the same numbers taken as nanoseconds.
    #[test]
    fn in_cycles_the_statistics_are_the_samples_own_figures() {
        let mut v: Vec<f64> = (1..=1000).map(|i| i as f64 * 1000.0).collect();
        let mut c = v.clone();
        let us = summarize(&mut v, Unit::Usec);
        let cy = summarize(&mut c, Unit::Cycles);
        assert_eq!((cy.min, cy.max, cy.typical), (1000.0, 999_000.0, 499_500.0));
        assert_eq!((cy.p99, cy.p999), (990_000.0, 999_000.0));
        for (a, b) in [
            (us.min, cy.min),
            (us.max, cy.max),
            (us.typical, cy.typical),
            (us.avg, cy.avg),
            (us.stdev, cy.stdev),
            (us.p99, cy.p99),
            (us.p999, cy.p999),
        ] {
            assert!((a * 1000.0 - b).abs() < 1e-6 * b, "{a} {b}");
        }
        // -H / -U: perftest's `#, cycles` header, the values as %g prints them.
        assert_eq!(
            sample_lines(&[12_345.5, 250.0, 1_234_567.0], Unit::Cycles),
            "#, cycles\n1, 12345.5\n2, 250\n3, 1.23457e+06\n"
        );
        assert_eq!(
            (Unit::of(true), Unit::of(false)),
            (Unit::Cycles, Unit::Usec)
        );
        assert_eq!((Unit::Cycles.name(), Unit::Usec.name()), ("cycles", "usec"));
        // The row is the same columns, the header perftest's (it keeps [usec] with -C).
        assert_eq!(
            row(8, 1000, &cy),
            " 8       1000        1000.00        999000.00      499500.00        499500.00      288097.64        990000.00              999000.00"
        );
        assert!(HEADER.contains("t_min[usec]    t_max[usec]"));
        // bfperf's JSON names the unit in its keys.
        let j = json(
            "write_lat",
            "sim",
            ("poll", "rq", "RC"),
            8,
            1000,
            &cy,
            Unit::Cycles,
        );
        assert!(
            j.contains("\"t_min_cycles\":1000.000,\"t_max_cycles\":999000.000,\"t_typical_cycles\":499500.000,"),
            "{j}"
        );
        for k in [
            "t_avg_cycles",
            "t_stdev_cycles",
            "p99_cycles",
            "p999_cycles",
        ] {
            assert!(j.contains(&format!("\"{k}\":")), "{k}: {j}");
        }
        assert!(!j.contains("_us\""), "{j}");
        let j = json(
            "write_lat",
            "sim",
            ("poll", "rq", "RC"),
            8,
            1000,
            &us,
            Unit::Usec,
        );
        assert!(
            j.contains("\"t_min_us\":1.000,") && !j.contains("cycles"),
            "{j}"
        );
    }

    /// A clock for `-C` samples gives the ticks between two stamps as read (perftest's
    /// `tposted[i + 1] - tposted[i]`); otherwise nanoseconds, as before.
    #[test]
    fn a_cycles_clock_samples_raw_ticks() {
        let c = Clock::for_samples(true);
        assert_eq!(c.sample(100, 160), 60.0);
        assert_eq!(c.sample(u64::MAX, 9), 10.0, "the counter wraps");
        let n = Clock::for_samples(false);
        assert_eq!(n.sample(100, 160), n.ns(100, 160));
        // -C changes the samples only: the clock's nanoseconds (--hw-timestamps) stay.
        assert!((c.ns(0, 1_000_000) / n.ns(0, 1_000_000) - 1.0).abs() < 0.05);
    }

    #[test]
    fn percentiles_and_moments_as_perftest() {
        let mut v: Vec<f64> = (1..=1000).map(|i| i as f64 * 1000.0).collect();
        let s = summarize(&mut v, Unit::Usec);
        assert_eq!((s.min, s.max), (1.0, 999.0));
        assert_eq!(s.typical, 499.5);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert!((s.avg - 499.5).abs() < 1e-9);
        assert!((s.stdev - 288.0972).abs() < 1e-3, "{}", s.stdev);
        // An odd count keeps the middle sample; two or fewer samples are all kept.
        let mut odd: Vec<f64> = (1..=5).map(|i| i as f64 * 1000.0).collect();
        assert_eq!(summarize(&mut odd, Unit::Usec).typical, 2.0);
        let mut two = vec![1000.0, 3000.0];
        let t = summarize(&mut two, Unit::Usec);
        assert_eq!((t.min, t.max, t.typical), (1.0, 3.0, 2.0));
    }
}

/// A cheap clock for per-iteration timestamps: the TSC on x86_64 (as perftest's
/// `get_cycles`), calibrated against the OS clock once; `Instant` elsewhere. Under
/// emulation the OS clock can be a system call, which would swamp a latency sample.
#[derive(Copy, Clone, Debug)]
pub struct Clock {
    #[cfg(target_arch = "x86_64")]
    ns_per_tick: f64,
    #[cfg(not(target_arch = "x86_64"))]
    origin: std::time::Instant,
    /// [`Clock::sample`] gives raw ticks (`-C`), not nanoseconds.
    cycles: bool,
}

impl Clock {
    /// A clock whose [`Clock::sample`]s are in the samples' unit of `-C` (`cycles`: the
    /// raw ticks, as perftest's `-C`) or not (nanoseconds). `-C` is refused off x86_64,
    /// where the ticks are the OS clock's nanoseconds.
    pub fn for_samples(cycles: bool) -> Clock {
        Clock {
            cycles,
            ..Clock::new()
        }
    }

    /// Calibrates (about 50 ms).
    pub fn new() -> Clock {
        #[cfg(target_arch = "x86_64")]
        {
            let t = std::time::Instant::now();
            let c = Self::ticks();
            while t.elapsed() < std::time::Duration::from_millis(50) {
                std::hint::spin_loop();
            }
            let ns = t.elapsed().as_nanos() as f64;
            let ticks = Self::ticks().wrapping_sub(c).max(1) as f64;
            let _ = CLOCK_MHZ.set(ticks * 1000.0 / ns.max(1.0));
            Clock {
                ns_per_tick: ns / ticks,
                cycles: false,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Clock {
            origin: std::time::Instant::now(),
            cycles: false,
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn ticks() -> u64 {
        // SAFETY: rdtsc has no memory effects; it is present on every x86_64 CPU.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// A timestamp.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        return Self::ticks();
        #[cfg(not(target_arch = "x86_64"))]
        return self.origin.elapsed().as_nanos() as u64;
    }

    /// Nanoseconds between two timestamps.
    #[inline(always)]
    pub fn ns(&self, from: u64, to: u64) -> f64 {
        #[cfg(target_arch = "x86_64")]
        return to.wrapping_sub(from) as f64 * self.ns_per_tick;
        #[cfg(not(target_arch = "x86_64"))]
        return to.wrapping_sub(from) as f64;
    }

    /// A latency sample between two timestamps, in the unit of [`Clock::for_samples`]:
    /// nanoseconds, or with `-C` the ticks between them as read (perftest's
    /// `tposted[i + 1] - tposted[i]`, no calibration in them).
    #[inline(always)]
    pub fn sample(&self, from: u64, to: u64) -> f64 {
        if self.cycles {
            to.wrapping_sub(from) as f64
        } else {
            self.ns(from, to)
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// An empty vector with room for `n` values, or an error naming what it was for: one per
/// iteration could be more than the machine has (perftest's `ALLOC`: " Cannot Allocate"),
/// which `Vec::with_capacity` turns into an abort.
pub fn room_for<T>(n: usize, what: &'static str) -> blueflame::Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| blueflame::Error::InvalidParameter {
            what,
            value: n as u64,
        })?;
    Ok(v)
}
