//! The latency histogram drawn by `--plot`: bins of equal width on a logarithmic scale, from
//! the fastest sample to the slowest (as HdrHistogram-style latency plots): the body and a
//! tail a thousand times slower both stay readable, and the bins add up to the number of
//! samples.

/// Bins of a latency histogram, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// `counts.len() + 1` bin edges, ascending; bin `i` is `[edges[i], edges[i + 1])`, the
    /// last one closed.
    pub edges: Vec<f64>,
    /// Samples per bin.
    pub counts: Vec<u64>,
}

/// The smallest left edge: the scale is logarithmic, so it must be positive.
const FLOOR: f64 = 1e-3;

impl Histogram {
    /// `bins` bins (at least 1) over `us` (microseconds, sorted ascending, not empty).
    pub fn new(us: &[f64], bins: usize) -> Histogram {
        let bins = bins.max(1);
        let lo = us.first().copied().unwrap_or(FLOOR).max(FLOOR);
        let hi = us.last().copied().unwrap_or(lo);
        // All samples equal (or one sample): a range of 1% above it, the bar still shows.
        let hi = if hi > lo * 1.01 { hi } else { lo * 1.01 };
        let step = (hi / lo).ln() / bins as f64;
        let mut edges: Vec<f64> = (0..=bins).map(|i| lo * (step * i as f64).exp()).collect();
        edges[bins] = hi; // exactly the slowest sample, whatever the rounding
        let mut counts = vec![0u64; bins];
        for &v in us {
            let i = ((v.max(lo) / lo).ln() / step).floor();
            // NaN (impossible for timings) goes to the first bin, rounding past the end to
            // the last.
            let i = if i.is_nan() { 0 } else { i as usize };
            counts[i.min(bins - 1)] += 1;
        }
        Histogram { edges, counts }
    }

    /// Left and right edges of bin `i`.
    pub fn edges(&self, i: usize) -> (f64, f64) {
        (self.edges[i], self.edges[i + 1])
    }

    /// Samples in all bins.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_sum_to_the_sample_count_and_span_fastest_to_slowest() {
        // 1000 samples from 1 to 2 us, and one 1000 us outlier.
        let mut us: Vec<f64> = (0..1000).map(|i| 1.0 + i as f64 / 1000.0).collect();
        us.push(1000.0);
        let h = Histogram::new(&us, 60);
        assert_eq!(h.total(), 1001);
        assert_eq!((h.counts.len(), h.edges.len()), (60, 61));
        assert_eq!((h.edges[0], h.edges[60]), (1.0, 1000.0));
        assert!(h.edges.windows(2).all(|w| w[0] < w[1]));
        // Equal widths on the log scale: each edge is the same factor above the last.
        let r = h.edges[1] / h.edges[0];
        assert!(h.edges.windows(2).all(|w| (w[1] / w[0] - r).abs() < 1e-9));
        // The outlier is alone in the last bin; the body (1 to 2 us: a factor of 2, each bin
        // a factor of 1000^(1/60) = 1.122) fills the first 7 bins, nothing is in between.
        assert_eq!(h.counts[59], 1);
        assert_eq!(h.counts[..7].iter().sum::<u64>(), 1000);
        assert!(h.counts[..7].iter().all(|&c| c > 0));
        assert!(h.counts[7..59].iter().all(|&c| c == 0));
        // Every sample sits inside its bin's edges.
        for &v in &us {
            let i = h.edges.partition_point(|&e| e <= v).clamp(1, 60) - 1;
            assert!(h.counts[i] > 0, "{v} in an empty bin {i}");
        }
    }

    #[test]
    fn equal_samples_single_samples_and_zeros_still_make_a_histogram() {
        let h = Histogram::new(&[3.0; 10], 8);
        assert_eq!((h.total(), h.counts[0], h.edges[0]), (10, 10, 3.0));
        assert!(h.edges[8] > 3.0);
        let h = Histogram::new(&[7.5], 4);
        assert_eq!(h.total(), 1);
        let h = Histogram::new(&[1.0, 2.0], 0);
        assert_eq!((h.counts.len(), h.total()), (1, 2));
        let h = Histogram::new(&[0.0, 0.0, 5.0], 10);
        assert_eq!((h.total(), h.counts[0], h.counts[9]), (3, 2, 1));
    }
}
