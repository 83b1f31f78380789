//! Latency statistics, printed as perftest prints them.

/// Summary of latency samples, in microseconds.
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

/// Summarises samples given in nanoseconds (sorted in place).
pub fn summarize(ns: &mut [f64]) -> Summary {
    assert!(!ns.is_empty(), "no samples");
    ns.sort_by(f64::total_cmp);
    let us = |v: f64| v / 1000.0;
    let n = ns.len();
    let pct = |p: f64| ns[(((n as f64) * p).ceil() as usize).clamp(1, n) - 1];
    let avg = ns.iter().sum::<f64>() / n as f64;
    let var = ns.iter().map(|v| (v - avg) * (v - avg)).sum::<f64>() / n as f64;
    Summary {
        min: us(ns[0]),
        max: us(ns[n - 1]),
        typical: us(ns[n / 2]),
        avg: us(avg),
        stdev: us(var.sqrt()),
        p99: us(pct(0.99)),
        p999: us(pct(0.999)),
    }
}

/// The perftest header line.
pub const HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]";

/// One perftest-style row.
pub fn row(bytes: usize, iters: usize, s: &Summary) -> String {
    format!(
        " {:<7} {:<10}  {:<14.2} {:<14.2} {:<16.2} {:<14.2} {:<16.2} {:<22.2} {:<.2}",
        bytes, iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

/// The same as a JSON object.
pub fn json(test: &str, device: &str, bytes: usize, iters: usize, s: &Summary) -> String {
    format!(
        "{{\"test\":\"{test}\",\"device\":\"{device}\",\"bytes\":{bytes},\"iterations\":{iters},\"t_min_us\":{:.3},\"t_max_us\":{:.3},\"t_typical_us\":{:.3},\"t_avg_us\":{:.3},\"t_stdev_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3}}}",
        s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_moments() {
        let mut v: Vec<f64> = (1..=1000).map(|i| i as f64 * 1000.0).collect();
        let s = summarize(&mut v);
        assert_eq!((s.min, s.max), (1.0, 1000.0));
        assert_eq!(s.typical, 501.0);
        assert_eq!(s.p99, 990.0);
        assert_eq!(s.p999, 999.0);
        assert!((s.avg - 500.5).abs() < 1e-9);
        assert!((s.stdev - 288.675).abs() < 1e-3);
    }
}
