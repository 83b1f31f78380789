//! `--plot FILE.svg`: the latency histogram of one message size as an SVG image (plotters,
//! SVG backend only): bars of [`Histogram`] on a logarithmic latency axis, vertical lines at
//! the median, the 99th and the 99.9th percentile, and a title with the test, size and
//! sample count.

use crate::hist::Histogram;
use crate::stats::{Summary, Unit};
use plotters::prelude::*;
use std::io;
use std::path::{Path, PathBuf};

/// Bars of the histogram.
pub const BINS: usize = 60;

/// Where the plot of `bytes` goes: `path` itself for one size; with `-a` (`sweep`), one
/// file per size, the size before the extension (`lat.svg` -> `lat-8.svg`, `lat-16.svg`).
pub fn path_for(path: &Path, bytes: usize, sweep: bool) -> PathBuf {
    if !sweep {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}-{bytes}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{bytes}"),
    };
    path.with_file_name(name)
}

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("plot: {e}"))
}

/// Draws the histogram of `us` (latency samples in `unit`, sorted: microseconds, or cycles
/// with `-C`) with the summary's percentiles into the SVG file `path`, the axis, title and
/// percentile labels naming the unit; returns the histogram drawn.
pub fn write_svg(
    path: &Path,
    title: &str,
    us: &[f64],
    s: &Summary,
    unit: Unit,
) -> io::Result<Histogram> {
    if us.is_empty() {
        return Err(err("no samples"));
    }
    let h = Histogram::new(us, BINS);
    let (x0, x1) = (h.edges[0], h.edges[h.counts.len()]);
    let top = h.counts.iter().copied().max().unwrap_or(1).max(1) as f64 * 1.1;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let caption = format!(
        "{title}: {} samples, {:.2} to {:.2} {}",
        h.total(),
        s.min,
        s.max,
        unit.short()
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x0..x1).log_scale(), 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("latency [{}], logarithmic", unit.name()))
        .y_desc("samples")
        .disable_x_mesh()
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            h.counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| {
                    let (l, r) = h.edges(i);
                    Rectangle::new([(l, 0.0), (r, c as f64)], BLUE.mix(0.6).filled())
                }),
        )
        .map_err(err)?;
    for (name, v, color) in [
        ("typical (median)", s.typical, GREEN),
        ("99%", s.p99, RED),
        ("99.9%", s.p999, MAGENTA),
    ] {
        let v = v.clamp(x0, x1);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(v, 0.0), (v, top)],
                color.stroke_width(2),
            )))
            .map_err(err)?
            .label(format!("{name} {v:.2} {}", unit.short()))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::summarize;

    #[test]
    fn the_svg_has_one_bar_per_non_empty_bin_and_the_bins_hold_every_sample() {
        let p = std::env::temp_dir().join(format!("bfperf-test-{}-h.svg", std::process::id()));
        let mut ns: Vec<f64> = (0..5000)
            .map(|i| 1000.0 + ((i * 7919) % 1000) as f64)
            .collect();
        ns.push(250_000.0); // a tail sample
        let s = summarize(&mut ns, Unit::Usec);
        let us: Vec<f64> = ns.iter().map(|v| v / 1000.0).collect();
        let h = write_svg(&p, "write_lat 8 bytes", &us, &s, Unit::Usec).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        assert_eq!(h.total(), 5001);
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "not an SVG document"
        );
        assert!(svg.contains("5001 samples") && svg.contains("latency [usec]"));
        // -C: the same picture, its axis and labels in cycles.
        write_svg(&p, "write_lat 8 bytes", &us, &s, Unit::Cycles).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        assert!(svg.contains("latency [cycles]") && !svg.contains("[usec]"));
        assert!(
            svg.contains(" cycles<") || svg.contains(" cycles"),
            "labels"
        );
        assert_eq!(h.counts.len(), BINS);
        assert!(svg.contains("99.9%"), "percentile legend missing");
        // The background is one <rect>, the legend box another; each non-empty bin one more.
        let bars = h.counts.iter().filter(|&&c| c > 0).count();
        assert!(
            svg.matches("<rect").count() > bars,
            "{} rects for {bars} bars",
            svg.matches("<rect").count()
        );
    }

    #[test]
    fn sweeps_write_one_file_per_size() {
        let p = Path::new("/tmp/out/lat.svg");
        assert_eq!(path_for(p, 8, false), PathBuf::from("/tmp/out/lat.svg"));
        assert_eq!(path_for(p, 8, true), PathBuf::from("/tmp/out/lat-8.svg"));
        assert_eq!(
            path_for(Path::new("plot"), 4096, true),
            PathBuf::from("plot-4096")
        );
    }

    #[test]
    fn no_samples_or_an_unwritable_path_is_an_error() {
        let s = Summary {
            min: 1.0,
            max: 1.0,
            typical: 1.0,
            avg: 1.0,
            stdev: 0.0,
            p99: 1.0,
            p999: 1.0,
        };
        assert!(write_svg(Path::new("/tmp/x.svg"), "t", &[], &s, Unit::Usec).is_err());
        assert!(write_svg(
            Path::new("/nonexistent-dir/x.svg"),
            "t",
            &[1.0],
            &s,
            Unit::Usec
        )
        .is_err());
    }
}
