//! perftest's `--out_json` (and `--out_json_file FILE`): each result also written to a file
//! as perftest writes it (`write_test_info_to_file`, then `write_report_lat_to_file` or
//! `write_bw_report_to_file`: one JSON object, the file truncated for each result, so that
//! with `-a` it holds the last size, as perftest's). `test_info` holds the fields bfperf
//! can state (perftest's names, values and order); those that describe perftest's own
//! machinery (`ibv_wr_API`, `PCIe_relax_order`, GPU memory, `CQ_Moderation`) are left out.

use crate::opts::{Connection, Opts};
use crate::stats::Summary;

/// The `test_info` object of a test titled `title` ("RDMA_Write Latency Test").
fn test_info(o: &Opts, title: &str, bw: bool, reads: bool) -> String {
    let mut test = title.replace(' ', "_");
    if bw && o.post_list > 1 {
        test = test.replace("_BW_", "_Post_List_BW_");
    }
    let mut s = format!(
        "\"test_info\": {{\n\"test\": \"{test}\",\n\"Dual_port\": \"OFF\",\n\"Device\": \"{}\",\n\
         \"Number_of_qps\": {},\n\"Transport_type\": \"IB\",\n\"Connection_type\": \"{}\",\n\
         \"Using_SRQ\": \"{}\",\n",
        o.device,
        o.qps,
        match o.connection {
            Connection::Ud => "UD",
            Connection::Dc => "DC",
            _ => "RC",
        },
        if o.srq { "ON" } else { "OFF" }
    );
    if !o.server {
        // perftest's latency tests keep one request in flight.
        s += &format!("\"TX_depth\": {},\n", if bw { o.tx_depth } else { 1 });
    }
    if bw && o.post_list > 1 {
        s += &format!("\"Post_List\": {},\n", o.post_list);
    }
    if let Some(g) = o.gid_index {
        s += &format!("\"GID_index\": {g},\n");
    }
    if reads {
        s += "\"Outstand_reads\": 16,\n";
    } else {
        s += &format!("\"Max_inline_data\": {},\n", o.inline);
    }
    s += "\"rdma_cm_QPs\": \"OFF\",\n\"Data_ex_method\": \"Ethernet\"\n},\n";
    s
}

/// Writes `{ test_info, results }` with the `results` body `body`.
fn write(o: &Opts, info: String, body: String) -> std::io::Result<()> {
    let Some(path) = o.out_json.as_deref() else {
        return Ok(());
    };
    std::fs::write(path, format!("{{\n{info}\"results\": {{\n{body}\n}}\n}}\n"))
}

/// A latency result, in the table's unit (microseconds, or cycles with `-C`: perftest
/// writes `delta / cycles_rtt_quotient` here too).
pub fn lat(
    o: &Opts,
    title: &str,
    reads: bool,
    size: usize,
    iters: usize,
    s: &Summary,
) -> std::io::Result<()> {
    let body = format!(
        "\"MsgSize\": {size},\n\"n_iterations\": {iters},\n\"t_min\": {:.2},\n\"t_max\": {:.2},\n\
         \"t_typical\": {:.2},\n\"t_avg\": {:.2},\n\"t_stdev\": {:.2},\n\"percentile_99\": {:.2},\n\
         \"percentile_99.9\": {:.2}",
        s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    );
    write(o, test_info(o, title, false, reads), body)
}

/// A timed latency result (`-D`), as perftest's `write_report_lat_duration_to_file`:
/// `MsgSize`, `n_iterations`, `t_avg` (microseconds) and `tps_average`.
pub fn lat_dur(
    o: &Opts,
    title: &str,
    reads: bool,
    size: usize,
    t: &crate::stats::Timed,
) -> std::io::Result<()> {
    let body = format!(
        "\"MsgSize\": {size},\n\"n_iterations\": {},\n\"t_avg\": {:.2},\n\"tps_average\": {:.2}",
        t.iters,
        t.t_avg_us(),
        t.tps()
    );
    write(o, test_info(o, title, false, reads), body)
}

/// A bandwidth result: `peak` and `avg` in the table's unit (MB/s, or Gb/s with
/// `--report_gbits`, six decimals below 0.1 Gb/s as perftest's `inc_accuracy`).
#[allow(clippy::too_many_arguments)]
pub fn bw(
    o: &Opts,
    title: &str,
    reads: bool,
    size: usize,
    iters: u64,
    peak: f64,
    avg: f64,
    mpps: f64,
) -> std::io::Result<()> {
    let p = if o.gbits && avg < 0.1 { 6 } else { 2 };
    let body = format!(
        "\"MsgSize\": {size},\n\"n_iterations\": {iters},\n\"BW_peak\": {peak:.p$},\n\
         \"BW_average\": {avg:.p$},\n\"MsgRate\": {mpps:.6}"
    );
    write(o, test_info(o, title, true, reads), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &std::path::Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    /// The file is perftest's object, whole JSON, the last result only.
    #[test]
    fn results_as_perftest_writes_them() {
        let dir = std::env::temp_dir().join(format!("bfperf-out-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        let o = Opts {
            out_json: Some(path.clone()),
            post_list: 4,
            ..Opts::default()
        };
        let s = Summary {
            min: 1.0,
            max: 9.0,
            typical: 2.5,
            avg: 3.0,
            stdev: 0.5,
            p99: 8.0,
            p999: 9.0,
        };
        lat(&o, "RDMA_Write Latency Test", false, 8, 1000, &s).unwrap();
        let t = read(&path);
        assert!(
            t.starts_with("{\n\"test_info\": {\n\"test\": \"RDMA_Write_Latency_Test\",\n"),
            "{t}"
        );
        assert!(t.contains("\"TX_depth\": 1,\n"), "{t}");
        assert!(
            t.contains(
                "\"results\": {\n\"MsgSize\": 8,\n\"n_iterations\": 1000,\n\"t_min\": 1.00,"
            ),
            "{t}"
        );
        assert!(t.ends_with("\"percentile_99.9\": 9.00\n}\n}\n"), "{t}");
        bw(
            &o,
            "RDMA_Read BW Test",
            true,
            65536,
            5000,
            1234.5,
            1200.25,
            0.019,
        )
        .unwrap();
        let t = read(&path);
        assert!(!t.contains("t_min"), "truncated for each result: {t}");
        assert!(
            t.contains("\"test\": \"RDMA_Read_Post_List_BW_Test\""),
            "{t}"
        );
        assert!(
            t.contains("\"Outstand_reads\": 16,") && t.contains("\"Post_List\": 4,"),
            "{t}"
        );
        assert!(
            t.contains("\"BW_peak\": 1234.50,\n\"BW_average\": 1200.25,\n\"MsgRate\": 0.019000\n}"),
            "{t}"
        );
        let timed = crate::stats::Timed {
            iters: 250_000,
            secs: 1.0,
            rtt: 2,
        };
        lat_dur(&o, "Send Latency Test", false, 64, &timed).unwrap();
        let d = read(&path);
        assert!(
            d.ends_with(
                "\"results\": {\n\"MsgSize\": 64,\n\"n_iterations\": 250000,\n\"t_avg\": 2.00,\n\"tps_average\": 250000.00\n}\n}\n"
            ),
            "{d}"
        );
        assert!(d.contains("\"test\": \"Send_Latency_Test\""), "{d}");
        // Balanced braces and quotes: one object.
        assert_eq!(t.matches('{').count(), t.matches('}').count());
        assert_eq!(t.matches('"').count() % 2, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
