//! `--csv FILE`: one row per message size, written as each size finishes.
//!
//! Latency tests, columns (times in microseconds, as the JSON fields of the same names; in
//! CPU cycles with `-C`, the columns then named `t_min_cycles` ... `p999_cycles`):
//! `test,device,bytes,iterations,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p99_us,p999_us,mode,recv,connection`
//! (`t_typical_us` is the median, perftest's "typical"; for write and send tests every time
//! is half a round trip, as perftest reports it; `mode`: `poll`, or `event` with `--events`;
//! `recv`: `rq` (the QP's receive queue), or `srq` with `--srq`; `connection`: `RC`, or `UD`
//! with `-c ud`).
//!
//! Timed latency runs (`-D`), columns:
//! `test,device,bytes,iterations,t_avg_us,tps_average,sample_s,mode,recv,connection`
//! (perftest's duration report: the iterations completed in the measured time, that time
//! over them, halved for write and send, and the iterations per second; `sample_s` the
//! measured seconds).
//!
//! Bandwidth tests, columns:
//! `test,device,bytes,iterations,bw_peak_mb_s,bw_avg_mb_s,msg_rate_mpps,mode,recv,connection`
//! (MB = 10^6 bytes per second, as perftest; message rate in millions per second).

use crate::stats::Summary;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// The header of a latency CSV.
pub const LAT_HEADER: &str = "test,device,bytes,iterations,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,p99_us,p999_us,mode,recv,connection";
/// The header of a latency CSV whose times are in `unit`: [`LAT_HEADER`], or with `-C` its
/// time columns named `_cycles` for `_us` (`t_min_cycles`, ..., `p999_cycles`).
pub fn lat_header(unit: crate::stats::Unit) -> String {
    LAT_HEADER.replace("_us,", &format!("_{},", unit.short()))
}

/// The header of a timed latency run's CSV (`-D`).
pub const LAT_DUR_HEADER: &str =
    "test,device,bytes,iterations,t_avg_us,tps_average,sample_s,mode,recv,connection";
/// The header of a bandwidth CSV.
pub const BW_HEADER: &str =
    "test,device,bytes,iterations,bw_peak_mb_s,bw_avg_mb_s,msg_rate_mpps,mode,recv,connection";

/// An open CSV file.
pub struct Csv {
    out: BufWriter<File>,
}

/// A field as CSV writes it: quoted when it holds a comma, quote or line break.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

impl Csv {
    /// Creates (or truncates) `path` and writes `header`.
    pub fn create(path: &Path, header: &str) -> io::Result<Csv> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "{header}")?;
        out.flush()?;
        Ok(Csv { out })
    }

    /// One latency row (flushed, so an interrupted sweep keeps the sizes done).
    #[allow(clippy::too_many_arguments)]
    pub fn lat(
        &mut self,
        test: &str,
        device: &str,
        bytes: usize,
        iters: usize,
        s: &Summary,
        mode: &str,
        recv: &str,
        connection: &str,
    ) -> io::Result<()> {
        writeln!(
            self.out,
            "{},{},{bytes},{iters},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{mode},{recv},{connection}",
            field(test),
            field(device),
            s.min,
            s.max,
            s.typical,
            s.avg,
            s.stdev,
            s.p99,
            s.p999
        )?;
        self.out.flush()
    }

    /// One row of a timed latency run (`-D`).
    pub fn lat_dur(
        &mut self,
        test: &str,
        device: &str,
        bytes: usize,
        t: &crate::stats::Timed,
        (mode, recv, connection): (&str, &str, &str),
    ) -> io::Result<()> {
        writeln!(
            self.out,
            "{},{},{bytes},{},{:.3},{:.3},{:.6},{mode},{recv},{connection}",
            field(test),
            field(device),
            t.iters,
            t.t_avg_us(),
            t.tps(),
            t.secs
        )?;
        self.out.flush()
    }

    /// One bandwidth row.
    #[allow(clippy::too_many_arguments)]
    pub fn bw(
        &mut self,
        test: &str,
        device: &str,
        bytes: usize,
        iters: usize,
        peak: f64,
        avg: f64,
        mpps: f64,
        mode: &str,
        recv: &str,
        connection: &str,
    ) -> io::Result<()> {
        writeln!(
            self.out,
            "{},{},{bytes},{iters},{peak:.3},{avg:.3},{mpps:.6},{mode},{recv},{connection}",
            field(test),
            field(device)
        )?;
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("bfperf-test-{}-{name}", std::process::id()))
    }

    /// A minimal CSV reader for the tests: fields, with quoted fields unquoted.
    fn parse(line: &str) -> Vec<String> {
        let (mut out, mut cur, mut quoted, mut chars) =
            (vec![], String::new(), false, line.chars().peekable());
        while let Some(c) = chars.next() {
            match (c, quoted) {
                ('"', true) if chars.peek() == Some(&'"') => {
                    cur.push('"');
                    chars.next();
                }
                ('"', _) => quoted = !quoted,
                (',', false) => out.push(std::mem::take(&mut cur)),
                (c, _) => cur.push(c),
            }
        }
        out.push(cur);
        out
    }

    #[test]
    fn latency_rows_parse_back_to_the_summary() {
        let p = tmp("lat.csv");
        let s = Summary {
            min: 1.25,
            max: 30.5,
            typical: 2.0,
            avg: 2.125,
            stdev: 0.5,
            p99: 4.75,
            p999: 12.0,
        };
        let mut c = Csv::create(&p, LAT_HEADER).unwrap();
        c.lat("write_lat", "rxe0", 8, 1000, &s, "poll", "rq", "RC")
            .unwrap();
        c.lat(
            "send_lat",
            "odd,\"name\"",
            16,
            1000,
            &s,
            "event",
            "srq",
            "UD",
        )
        .unwrap();
        drop(c);
        let text = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let header = parse(lines[0]);
        assert_eq!(header.len(), 14);
        let rows: Vec<Vec<String>> = lines[1..].iter().map(|l| parse(l)).collect();
        assert!(rows.iter().all(|r| r.len() == header.len()));
        assert_eq!(rows[0][1], "rxe0");
        assert_eq!(rows[1][1], "odd,\"name\"");
        assert_eq!(
            (rows[0][11].as_str(), rows[1][11].as_str()),
            ("poll", "event")
        );
        assert_eq!((rows[0][12].as_str(), rows[1][12].as_str()), ("rq", "srq"));
        assert_eq!((rows[0][13].as_str(), rows[1][13].as_str()), ("RC", "UD"));
        assert_eq!(
            (
                rows[0][2].as_str(),
                rows[1][2].as_str(),
                rows[0][3].as_str()
            ),
            ("8", "16", "1000")
        );
        let col = |name: &str| header.iter().position(|h| h == name).unwrap();
        let num = |r: &Vec<String>, name: &str| r[col(name)].parse::<f64>().unwrap();
        for r in &rows {
            assert_eq!(
                [
                    num(r, "t_min_us"),
                    num(r, "t_max_us"),
                    num(r, "t_typical_us"),
                    num(r, "t_avg_us"),
                    num(r, "t_stdev_us"),
                    num(r, "p99_us"),
                    num(r, "p999_us")
                ],
                [s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999]
            );
        }
    }

    #[test]
    fn bandwidth_rows_parse_back() {
        let p = tmp("bw.csv");
        let mut c = Csv::create(&p, BW_HEADER).unwrap();
        c.bw(
            "send_bw", "sim", 65536, 500, 1234.5, 1200.25, 0.018315, "poll", "srq", "RC",
        )
        .unwrap();
        drop(c);
        let text = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], BW_HEADER);
        let r = parse(lines[1]);
        assert_eq!(r.len(), 10);
        assert_eq!(
            (r[7].as_str(), r[8].as_str(), r[9].as_str()),
            ("poll", "srq", "RC")
        );
        assert_eq!(
            (r[0].as_str(), r[2].as_str(), r[3].as_str()),
            ("send_bw", "65536", "500")
        );
        let f: Vec<f64> = r[4..7].iter().map(|v| v.parse().unwrap()).collect();
        assert_eq!(f, [1234.5, 1200.25, 0.018315]);
    }

    #[test]
    fn timed_latency_rows_parse_back() {
        let p = tmp("lat-dur.csv");
        let mut c = Csv::create(&p, LAT_DUR_HEADER).unwrap();
        let t = crate::stats::Timed {
            iters: 400_000,
            secs: 2.0,
            rtt: 2,
        };
        c.lat_dur("write_lat", "sim", 8, &t, ("poll", "rq", "RC"))
            .unwrap();
        drop(c);
        let text = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], LAT_DUR_HEADER);
        let r = parse(lines[1]);
        assert_eq!(r.len(), parse(LAT_DUR_HEADER).len());
        assert_eq!(
            r,
            [
                "write_lat",
                "sim",
                "8",
                "400000",
                "2.500",
                "200000.000",
                "2.000000",
                "poll",
                "rq",
                "RC"
            ]
        );
    }

    /// With `-C` the time columns are named for cycles, the rest as without.
    #[test]
    fn a_cycles_header_names_its_unit() {
        use crate::stats::Unit;
        assert_eq!(lat_header(Unit::Usec), LAT_HEADER);
        assert_eq!(
            lat_header(Unit::Cycles),
            "test,device,bytes,iterations,t_min_cycles,t_max_cycles,t_typical_cycles,t_avg_cycles,t_stdev_cycles,p99_cycles,p999_cycles,mode,recv,connection"
        );
    }

    #[test]
    fn an_unwritable_path_is_an_error() {
        assert!(Csv::create(Path::new("/nonexistent-dir/x.csv"), LAT_HEADER).is_err());
    }
}
