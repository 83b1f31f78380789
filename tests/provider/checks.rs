//! What only the provider mode can check: the kernel's decisions from the flags the crate
//! hands rdma-core (the crate's side of them cannot be seen on the software NIC's own
//! creation path, where the crate tells the NIC directly).

use crate::model;
use crate::scenarios;
use crate::Case;
use blueflame::*;

fn check(name: &str, f: fn(&Device) -> Result<(), String>) -> Case {
    (format!("provider::{name}"), Box::new(f))
}

pub fn all() -> Vec<Case> {
    vec![
        check("scatter_to_cqe_off_reaches_the_kernel", scatter_off),
        check("scatter_to_cqe_default_is_on", scatter_default),
        check("each_qp_rings_a_register_of_its_own", own_registers),
        check("compressed_cq_reaches_the_device", compressed_cq),
        check("dc_traffic_as_on_the_software_nic", dc_traffic),
        check(
            "compressed_sessions_as_on_the_software_nic",
            compressed_traffic,
        ),
        check("teardown_with_outstanding_work", teardown),
        check("write_pingpong_both_ways", pingpong),
        check("what_the_model_lacks_is_refused_typed", refused_typed),
        check("srq_page_faults_as_rdma_core_handles_them", srq_page_faults),
        check("completion_timestamps_through_rdma_core", timestamps),
        check(
            "real_time_completion_stamps_on_both_paths",
            real_time_stamps,
        ),
        check("creation_limits_as_on_the_software_nic", creation_limits),
        check("receive_limits_as_on_the_software_nic", receive_limits),
        check(
            "receive_entries_of_2_gib_are_refused_on_both_paths",
            huge_receive_entries,
        ),
        check(
            "a_verbs_path_address_handle_makes_no_dc_peer",
            verbs_ah_dc_peer,
        ),
        check("ud_send_limits_as_on_the_software_nic", ud_send_limits),
        check("a_device_without_atomics_on_both_paths", no_atomics),
        check("a_peer_that_never_connects_back", peer_never_connects),
        check("device_errors_name_their_objects", device_errors),
        check(
            "a_port_that_comes_back_is_no_longer_an_error",
            port_comes_back,
        ),
        check(
            "a_stranded_dci_recovers_as_on_the_software_nic",
            dci_recovery,
        ),
        check("qp_signature_set_after_open", qp_signature_after_open),
        check(
            "blueflame_switches_are_the_contexts",
            blueflame_switches_after_open,
        ),
        check(
            "a_forgotten_batch_is_posted_on_both_paths",
            forgotten_batches,
        ),
        check(
            "an_srq_limit_event_dies_with_its_srq",
            srq_limit_event_dies_with_its_srq,
        ),
        check("dropped_objects_leave_nothing_in_the_kernel", no_leftovers),
        check(
            "srq_slots_of_a_dropped_qps_unpolled_receives_come_back",
            srq_slots_of_a_dropped_qp,
        ),
        check(
            "send_cq_entries_of_dropped_srq_qps_come_back",
            send_cq_entries_of_dropped_srq_qps,
        ),
        check(
            "a_gid_index_past_the_table_is_refused_at_open",
            gid_index_past_the_table,
        ),
        check(
            "a_qp_left_in_rtr_by_a_failed_connect_goes_to_error",
            failed_rts,
        ),
        check(
            "a_bare_qp_number_is_no_address_on_an_rdma_core_device",
            bare_qp_number,
        ),
        check(
            "a_receive_posted_before_connect_is_taken_on_both_paths",
            recv_before_connect,
        ),
        check(
            "an_unconnected_qp_gives_everything_back_on_both_paths",
            unconnected_teardown,
        ),
        check(
            "an_init_qps_drop_frees_its_cq_entries_at_once_on_both_paths",
            init_drop_frees_the_cq,
        ),
        check(
            "the_requester_depth_is_what_the_peer_accepts",
            requester_depth,
        ),
        check(
            "a_ud_address_without_a_lid_is_refused_on_both_paths",
            ud_address_without_a_lid,
        ),
    ]
}

/// A UD address with no LID (a bare QP number and Q_Key, `UdEndpoint { qpn, qkey, .. }`):
/// libmlx5's `mlx5_create_ah` makes an address handle of it on an InfiniBand port (it
/// copies `dlid` 0 into the AV's `rlid` and never asks the kernel, whose
/// `rdma_check_ah_attr` would not look at the LID either), and a datagram sent to it goes
/// to LID 0: lost on a ConnectX, its send completed with success. Refused now at
/// `create_ah`, typed, on both paths; the peer's real endpoint then carries a datagram.
fn ud_address_without_a_lid(_dev: &Device) -> Result<(), String> {
    for verbs in [false, true] {
        let d = open_fresh(verbs)?;
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        let mut a = pd
            .create_ud_qp(&cq, &cq, QpCaps::default(), 0x11)
            .map_err(e)?;
        let mut b = pd
            .create_ud_qp(&cq, &cq, QpCaps::default(), 0x11)
            .map_err(e)?;
        let to = b.endpoint();
        let bare = UdEndpoint {
            qpn: to.qpn,
            qkey: to.qkey,
            ..UdEndpoint::default()
        };
        match pd.create_ah(bare) {
            Err(Error::InvalidParameter { what, .. }) if what.contains("address") => {}
            other => return Err(format!("verbs {verbs}: an AH to LID 0: {other:?}")),
        }
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        b.post_recv(&[mr.sge(0, 128).map_err(e)?], 7).map_err(e)?;
        let ah = pd.create_ah(to).map_err(e)?;
        a.send_to(
            &ah,
            to.qpn,
            to.qkey,
            Payload::Inline(b"x"),
            1,
            PostFlags::SIGNALED,
        )
        .map_err(e)?;
        let mut got: Vec<_> = scenarios::wait_on(&d, &mut cq, 2)
            .iter()
            .map(|c| (c.cookie, c.status))
            .collect();
        got.sort_by_key(|c| c.0);
        if got != [(1, WcStatus::Success), (7, WcStatus::Success)] {
            return Err(format!("verbs {verbs}: to the real endpoint: {got:?}"));
        }
    }
    Ok(())
}

/// A receive posted before `connect`, the usual way to have one ready for the peer's first
/// send (no RNR): verbs take receives from INIT on, and refuse them in RESET (IBA
/// C10-97.2.1; libmlx5's `set_qp_operational_state` gives `qp_state_max_gs` -1 in RESET,
/// which `mlx5_post_recv` checks). An RC QP stayed in RESET until `connect`, so the verbs
/// path failed the receive with a bare `ibv_post_recv` EINVAL while the direct path wrote
/// it into a RESET QP's ring. Created in INIT (perftest's `ctx_modify_qp_to_init`, UCX's
/// `uct_rc_iface_qp_init`), the QP takes it on both paths, and the peer's message lands
/// in it once both sides are connected.
fn recv_before_connect(_dev: &Device) -> Result<(), String> {
    for verbs in [false, true] {
        let d = open_fresh(verbs)?;
        let e = |e: Error| format!("verbs {verbs}: {e}");
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let state = model::qp_state(b.qpn());
        if state != Some(1) {
            return Err(format!(
                "verbs {verbs}: a new QP is in state {state:?}, not INIT (1)"
            ));
        }
        let mr = pd.alloc_mr(4096, scenarios::RIGHTS).map_err(e)?;
        b.post_recv(&[mr.sge(256, 64).map_err(e)?], 21)
            .map_err(|x| format!("verbs {verbs}: a receive before connect: {x}"))?;
        let (ea, eb) = (a.endpoint().map_err(e)?, b.endpoint().map_err(e)?);
        a.connect_with(&eb, &Timing::default()).map_err(e)?;
        b.connect_with(&ea, &Timing::default()).map_err(e)?;
        a.send(Payload::Inline(b"early receive"), 22, PostFlags::SIGNALED)
            .map_err(e)?;
        let mut got: Vec<_> = scenarios::wait_on(&d, &mut cq, 2)
            .iter()
            .map(|c| {
                (
                    c.cookie,
                    c.status,
                    c.opcode,
                    (c.cookie == 21).then_some(c.byte_len),
                )
            })
            .collect();
        got.sort_by_key(|g| g.0);
        let want = [
            (21, WcStatus::Success, WcOpcode::Recv, Some(13)),
            (22, WcStatus::Success, WcOpcode::Send, None),
        ];
        if got != want {
            return Err(format!("verbs {verbs}: {got:?}, want {want:?}"));
        }
        let mut bytes = [0u8; 13];
        mr.read(256, &mut bytes).map_err(e)?;
        if &bytes != b"early receive" {
            return Err(format!("verbs {verbs}: the receive holds {bytes:?}"));
        }
    }
    Ok(())
}

/// A QP's requester may have no more reads and atomics in flight than its peer's responder
/// accepts: against a peer that advertises 4 (perftest `-o 4`, a device whose
/// `max_qp_rd_atom` is 4) `connect` programmed `max_rd_atomic` 16 whatever the peer said,
/// and the peer's responder NAKs the fifth read (Invalid Request), the QP in error. It is
/// programmed with 4 now, on both paths; the responder keeps its own depth (16), which its
/// endpoint advertises (the model's device: `max_qp_rd_atom` 16).
fn requester_depth(_dev: &Device) -> Result<(), String> {
    for verbs in [false, true] {
        let d = open_fresh(verbs)?;
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let cq = d.create_cq(64).map_err(e)?;
        let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let (ea, eb) = (a.endpoint().map_err(e)?, b.endpoint().map_err(e)?);
        let shallow = Endpoint {
            max_dest_rd_atomic: 4,
            ..eb
        };
        // connect_with: whichever form `connect` takes its endpoint in.
        a.connect_with(&shallow, &Timing::default()).map_err(e)?;
        b.connect_with(&ea, &Timing::default()).map_err(e)?;
        let got = (model::qp_depths(a.qpn()), model::qp_depths(b.qpn()));
        if got != (Some((4, 16)), Some((16, 16))) {
            return Err(format!(
                "verbs {verbs}: (max_rd_atomic, max_dest_rd_atomic) of the QP connected to a \
                 peer of depth 4 and of its peer: {got:?}, want (4, 16) and (16, 16)"
            ));
        }
        if (ea.max_dest_rd_atomic, eb.max_dest_rd_atomic) != (16, 16) {
            return Err(format!(
                "verbs {verbs}: the endpoints advertise responder depths {} and {}, not 16",
                ea.max_dest_rd_atomic, eb.max_dest_rd_atomic
            ));
        }
    }
    Ok(())
}

/// The drop of a QP never connected, refused or moved to error before connecting, with
/// receives posted (own receive queue, SRQ), on both paths over libmlx5: nothing of it
/// completes afterwards, its region and buffer come back, an SRQ keeps the WQEs it never
/// consumed, the CQ's whole capacity is there again (`memory_cases`). On the verbs path
/// such a QP met no receive before RC QPs were created in INIT.
fn unconnected_teardown(_dev: &Device) -> Result<(), String> {
    for verbs in [false, true] {
        let d = open_fresh(verbs)?;
        catch(verbs, || {
            crate::memory_cases::an_unconnected_qp_gives_everything_back(&d)
        })?;
    }
    Ok(())
}

/// A QP dropped in INIT with receives filling its CQ leaves every entry of the CQ to the
/// next QP at once, on both paths over libmlx5 (`memory_cases`).
fn init_drop_frees_the_cq(_dev: &Device) -> Result<(), String> {
    for verbs in [false, true] {
        let d = open_fresh(verbs)?;
        catch(verbs, || {
            crate::memory_cases::an_init_qps_drop_frees_its_cq_entries_at_once(&d)
        })?;
    }
    Ok(())
}

/// Runs `f`, a case that fails by panicking: its message, with the path.
fn catch(verbs: bool, f: impl FnOnce()) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let why = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("verbs {verbs}: {why}")
    })
}

/// A bare QP number (`Endpoint { qpn, ..Endpoint::default() }`, what
/// `qp.connect(other.qpn())` once built) on an rdma-core device: the endpoint has no LID,
/// no GID and PSN 0, and a ConnectX QP programmed with it sends to LID 0 (InfiniBand's
/// reserved LID) and expects its peer's first PSN to be 0. The model connected it by number
/// then (it read no address vector), so it passed here and left a dead QP on hardware. It is
/// refused now, on both paths (and on the software NIC), with the QP still in INIT: a
/// connect with the peer's real endpoint then works.
fn bare_qp_number(_dev: &Device) -> Result<(), String> {
    for verbs in [false, true] {
        let d = open_fresh(verbs)?;
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let bare = Endpoint {
            qpn: b.qpn(),
            ..Endpoint::default()
        };
        match a.connect(&bare) {
            Err(Error::InvalidParameter { what, .. }) if what.contains("address") => {}
            other => return Err(format!("verbs {verbs}: connect by number: {other:?}")),
        }
        if model::qp_state(a.qpn()) != Some(1) {
            return Err(format!(
                "verbs {verbs}: the refused QP is in state {:?}, not INIT (1)",
                model::qp_state(a.qpn())
            ));
        }
        let (ea, eb) = (a.endpoint().map_err(e)?, b.endpoint().map_err(e)?);
        a.connect(&eb).map_err(e)?;
        b.connect(&ea).map_err(e)?;
        let mr = pd.alloc_mr(64, scenarios::RIGHTS).map_err(e)?;
        a.write_inline(&[3; 8], mr.remote(0).map_err(e)?, 1, PostFlags::SIGNALED)
            .map_err(e)?;
        let got: Vec<_> = scenarios::wait_on(&d, &mut cq, 1)
            .iter()
            .map(|c| (c.cookie, c.status))
            .collect();
        if got != [(1, WcStatus::Success)] {
            return Err(format!("verbs {verbs}: after the real connect: {got:?}"));
        }
    }
    Ok(())
}

/// A `connect` whose move to RTS the device refuses (a firmware error, injected) left the
/// QP in RTR: unable to send or to connect again, yet taking the peer's messages into an
/// SRQ's WQEs, and, on the verbs path, dropped without the SRQ's drain (`leave_the_srq`
/// skipped a QP never connected). It goes to error now, on both paths: a second `connect`
/// says so, the peer's send meets no responder (it used to land in an SRQ receive of a QP
/// its user was told had not connected), and its drop gives every SRQ slot back.
fn failed_rts(_dev: &Device) -> Result<(), String> {
    for verbs in [false, true] {
        let d = open_fresh(verbs)?;
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        let mut srq = pd.create_srq(&cq, SrqCaps::default()).map_err(e)?;
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        for k in 0..4 {
            srq.post_recv(&[mr.sge(k as usize * 64, 64).map_err(e)?], k)
                .map_err(e)?;
        }
        let free = srq.free();
        let mut s = pd
            .create_qp_with_srq(&cq, &srq, scenarios::caps())
            .map_err(e)?;
        let mut c = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        // The peer connected first (quick retries: its send to a QP in error fails fast).
        let quick = Timing {
            timeout: 1,
            retry_cnt: 1,
            ..Timing::default()
        };
        c.connect_with(&s.endpoint().map_err(e)?, &quick)
            .map_err(e)?;
        if !model::fail_next_modify(3, libc::EIO) {
            return Err("the model is not loaded".into());
        }
        let first = s.connect(&c.endpoint().map_err(e)?);
        if first.is_ok() {
            return Err(format!("verbs {verbs}: the injected RTS failure connected"));
        }
        let state = model::qp_state(s.qpn());
        if state != Some(6) {
            return Err(format!(
                "verbs {verbs}: after {first:?}, the QP is in state {state:?}, not ERR (6)"
            ));
        }
        match s.connect(&c.endpoint().map_err(e)?) {
            Err(Error::InvalidState { state }) if state.contains("in error") => {}
            other => return Err(format!("verbs {verbs}: a second connect: {other:?}")),
        }
        c.send(Payload::Inline(&[7; 8]), 9, PostFlags::SIGNALED)
            .map_err(e)?;
        let got: Vec<_> = scenarios::wait_on(&d, &mut cq, 1)
            .iter()
            .map(|c| (c.cookie, c.status, c.opcode))
            .collect();
        if got != [(9, WcStatus::RetryExcErr, WcOpcode::Send)] {
            return Err(format!(
                "verbs {verbs}: the peer's send to the failed QP: {got:?}, want its retries \
                 spent and no receive"
            ));
        }
        drop(s);
        let mut out = [Completion::default(); 8];
        for _ in 0..4 {
            cq.poll(&mut out);
        }
        if srq.free() != free {
            return Err(format!(
                "verbs {verbs}: SRQ free {} after the drop, {free} before",
                srq.free()
            ));
        }
    }
    Ok(())
}

/// A GID index past the port's table (the model's port has one entry) is refused when the
/// device is opened, naming the index, whether `Device::open` or `BLUEFLAME_GID_INDEX` gave
/// it: it used to open, and the first `endpoint()` failed with `ibv_query_gid`'s ENOENT.
fn gid_index_past_the_table(_dev: &Device) -> Result<(), String> {
    let refused = |r: Result<Device, Error>, index: u64| match r {
        Err(Error::InvalidParameter { what, value }) if value == index => {
            match what.contains("BLUEFLAME_GID_INDEX") && what.contains("gid_tbl_len") {
                true => Ok(()),
                false => Err(format!("index {index}: the message names neither: {what}")),
            }
        }
        Err(other) => Err(format!("index {index}: {other:?}, not InvalidParameter")),
        Ok(d) => Err(format!("index {index}: {d} opened")),
    };
    refused(Device::open("mlx5_0", Some(1)), 1)?;
    refused(Device::open("mlx5_0", Some(-1)), u64::MAX)?;
    std::env::set_var("BLUEFLAME_DEVICE", "mlx5_0");
    std::env::set_var("BLUEFLAME_GID_INDEX", "7");
    let from_env = Device::open_default();
    std::env::remove_var("BLUEFLAME_GID_INDEX");
    std::env::remove_var("BLUEFLAME_DEVICE");
    refused(from_env, 7)?;
    // The table's one entry still opens, and a QP of it gives its endpoint.
    let d = Device::open("mlx5_0", Some(0)).map_err(|e| e.to_string())?;
    let pd = d.alloc_pd().map_err(|e| e.to_string())?;
    let cq = d.create_cq(8).map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(&cq, &cq, scenarios::caps())
        .map_err(|e| e.to_string())?;
    qp.endpoint().map_err(|e| e.to_string())?;
    Ok(())
}

/// One of everything the crate has rdma-core create (a domain, a region, a window, a
/// completion channel, a CQ on it, an SRQ, a QP on the SRQ and one to send to it, a write
/// completed), then all of it dropped.
fn create_and_drop(d: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let pd = d.alloc_pd().map_err(e)?;
    let ch = d.create_channel().map_err(e)?;
    let mut cq = d
        .create_cq_with(&CqOptions::new(64).channel(&ch))
        .map_err(e)?;
    let srq = pd.create_srq(&cq, SrqCaps::default()).map_err(e)?;
    let (s, mut c) = srq_pair(&pd, &cq, &srq)?;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let mr = pd.alloc_mr(4096, rw).map_err(e)?;
    let mw = pd.alloc_mw(MwType::Two).map_err(e)?;
    c.write_inline(b"cycle", mr.remote(0).map_err(e)?, 1, PostFlags::SIGNALED)
        .map_err(e)?;
    let done = scenarios::wait_on(d, &mut cq, 1);
    if !done[0].is_ok() {
        return Err(format!("the cycle's write: {:?}", done[0]));
    }
    drop((mw, mr, c, s, srq, cq, ch, pd));
    Ok(())
}

/// Objects created and dropped in cycles leave nothing in the kernel, on the direct path
/// and on the verbs path: every PD, region, window, completion channel, CQ, QP and SRQ is
/// destroyed at its drop (counted by the model's kernel, per kind, over every open device
/// file). The model kept a closed completion channel's object until its device file was
/// closed, and took a later CQ on a descriptor of that number as a CQ on a channel (the
/// kernel releases the channel with its descriptor; a review's finding).
fn no_leftovers(dev: &Device) -> Result<(), String> {
    let verbs = open_fresh(true)?;
    let count = || model::live_objects().ok_or("the kernel model is not loaded");
    // One cycle each first: what a device creates once (and keeps) is not a leftover.
    create_and_drop(dev)?;
    create_and_drop(&verbs)?;
    let before = count()?;
    for _ in 0..10 {
        create_and_drop(dev)?;
        create_and_drop(&verbs)?;
    }
    let after = count()?;
    if before != after {
        return Err(format!(
            "live kernel objects (PD, MR, MW, channel, CQ, QP, SRQ) {before:?} before 10 \
             cycles on each path, {after:?} after"
        ));
    }
    Ok(())
}

/// `mlx5_0` opened anew (a context of its own, which reads the model's NIC as it is now),
/// on the verbs path with `verbs`, else on the direct path.
fn open_fresh(verbs: bool) -> Result<Device, String> {
    if verbs {
        std::env::set_var("BLUEFLAME_PATH", "verbs");
    }
    let d = Device::open("mlx5_0", crate::GID_INDEX);
    std::env::remove_var("BLUEFLAME_PATH");
    d.map_err(|e| e.to_string())
}

/// A QP on `srq` and a QP to send to it, both completing their sends on `scq`, connected.
fn srq_pair(pd: &Pd, scq: &Cq, srq: &Srq) -> Result<(Qp, Qp), String> {
    let e = |e: Error| e.to_string();
    let mut s = pd
        .create_qp_with_srq(scq, srq, scenarios::caps())
        .map_err(e)?;
    let mut c = pd.create_qp(scq, scq, scenarios::caps()).map_err(e)?;
    let (es, ec) = (s.endpoint().map_err(e)?, c.endpoint().map_err(e)?);
    s.connect(&ec).map_err(e)?;
    c.connect(&es).map_err(e)?;
    Ok((s, c))
}

/// An SRQ's events are forgotten when it is destroyed, on both paths over rdma-core's
/// objects: rdma-core devices name an SRQ in their events by its `ibv_srq`'s address, and
/// the crate forgot the events under its number instead, so a later SRQ that libmlx5 put
/// at the same address, never armed, said its limit was reached (a review's finding: round
/// 7 on the direct path). A dropped QP's wait for its last-WQE event reads the limit event
/// each round.
fn srq_limit_event_dies_with_its_srq(dev: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    for d in [dev, crate::verbs_device()?] {
        let pd = d.alloc_pd().map_err(e)?;
        let mut scq = d.create_cq(64).map_err(e)?;
        let mut rcq = d.create_cq(64).map_err(e)?;
        let src = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        let dst = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        let caps = SrqCaps {
            entries: 15,
            max_sge: 1,
        };
        for round in 0..16 {
            let mut srq = pd.create_srq(&rcq, caps).map_err(e)?;
            if srq.limit_reached() {
                return Err(format!(
                    "{:?}: round {round}: an SRQ never armed says its limit was reached (an \
                     earlier SRQ's event)",
                    d.data_path()
                ));
            }
            let (s, mut c) = srq_pair(&pd, &scq, &srq)?;
            for i in 0..4u64 {
                srq.post_recv(&[dst.sge(64 * i as usize, 64).map_err(e)?], i)
                    .map_err(e)?;
            }
            srq.set_limit(4).map_err(e)?;
            c.send(
                Payload::Sgl(&[src.sge(0, 8).map_err(e)?]),
                0,
                PostFlags::SIGNALED,
            )
            .map_err(e)?;
            scenarios::wait_on(d, &mut rcq, 1);
            scenarios::wait_on(d, &mut scq, 1);
            drop(s);
            drop(c);
            drop(srq);
        }
    }
    Ok(())
}

/// A batch that filled the send queue and was forgotten (`mem::forget` is safe): the next
/// post, refused for want of the room the batch holds, posts the batch's requests all the
/// same, on the direct path (which wrote them into the ring) and on the verbs path over
/// libmlx5 (which queued them); every one completes and the room comes back. Refused
/// before anything was rung, the queue stayed full for good (a review's finding).
fn forgotten_batches(dev: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    for d in [dev, crate::verbs_device()?] {
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(256).map_err(e)?;
        let caps = QpCaps {
            sq_blocks: 16,
            ..QpCaps::default()
        };
        let mut qp = pd.create_qp(&cq, &cq, caps).map_err(e)?;
        let me = qp.endpoint().map_err(e)?;
        qp.connect(&me).map_err(e)?;
        let mr = pd
            .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(e)?;
        let mut b = qp.batch();
        let mut n = 0u64;
        loop {
            let req = Request::Write {
                remote: mr.remote(n as usize).map_err(e)?,
                data: Payload::Inline(&[1]),
            };
            match b.push(&req, n, PostFlags::SIGNALED) {
                Ok(()) => n += 1,
                Err(Error::QueueFull { .. }) => break,
                Err(other) => return Err(format!("{:?}: push {n}: {other}", d.data_path())),
            }
        }
        std::mem::forget(b);
        let mut got = 0;
        let mut posted = false;
        for _ in 0..200 {
            match qp.write_inline(&[2], mr.remote(1024).map_err(e)?, 1000, PostFlags::SIGNALED) {
                Ok(()) => {
                    posted = true;
                    break;
                }
                Err(Error::QueueFull { .. }) => {
                    let mut out = [Completion::default(); 32];
                    d.process();
                    got += cq.poll(&mut out);
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(other) => return Err(format!("{:?}: {other}", d.data_path())),
            }
        }
        if !posted {
            return Err(format!(
                "{:?}: the queue stayed full after a forgotten batch of {n} ({got} completions)",
                d.data_path()
            ));
        }
        let rest = scenarios::wait_on(d, &mut cq, (n as usize + 1) - got);
        if rest.iter().any(|c| !c.is_ok()) {
            return Err(format!("{:?}: {rest:?}", d.data_path()));
        }
    }
    Ok(())
}

/// What rdma-core's provider takes at creation is what the software NIC takes: the same
/// caps give the same send depth and the same largest inline payload on both (the ring
/// the caps name, not rdma-core's rounding of it), and what rdma-core would refuse with a
/// bare `EINVAL` both refuse naming the same field and value; so do CQ sizes past the
/// device's `max_cqe`.
fn creation_limits(dev: &Device) -> Result<(), String> {
    let sim = Device::sim();
    let outcome = |d: &Device, caps: QpCaps| -> Result<String, String> {
        let pd = d.alloc_pd().map_err(|e| e.to_string())?;
        let cq = d.create_cq(64).map_err(|e| e.to_string())?;
        Ok(match pd.create_qp(&cq, &cq, caps) {
            Ok(mut qp) => {
                let me = qp.endpoint().map_err(|e| e.to_string())?;
                qp.connect(&me).map_err(|e| e.to_string())?;
                let mr = pd
                    .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                    .map_err(|e| e.to_string())?;
                let over = vec![1u8; caps.max_inline as usize + 1];
                let r = qp.write_inline(
                    &over,
                    mr.remote(0).map_err(|e| e.to_string())?,
                    1,
                    PostFlags::SIGNALED,
                );
                format!("depth {}, one byte past max_inline: {r:?}", qp.send_depth())
            }
            Err(e) => format!("{e:?}"),
        })
    };
    let d = QpCaps::default();
    for caps in [
        d,
        QpCaps { sq_blocks: 16, ..d },
        QpCaps {
            sq_blocks: 32768,
            ..d
        },
        QpCaps { sq_blocks: 0, ..d },
        QpCaps { sq_blocks: 8, ..d },
        QpCaps {
            sq_blocks: 65536,
            ..d
        },
        QpCaps {
            sq_blocks: 100,
            ..d
        },
        QpCaps {
            max_inline: 0,
            max_send_sge: 1,
            ..d
        },
        QpCaps {
            max_inline: 828,
            ..d
        },
        QpCaps {
            max_inline: 829,
            ..d
        },
        QpCaps {
            max_send_sge: 52,
            ..d
        },
        QpCaps {
            max_send_sge: 53,
            ..d
        },
        QpCaps {
            max_recv_sge: 32,
            ..d
        },
        QpCaps {
            max_recv_sge: 33,
            ..d
        },
        QpCaps {
            rq_entries: 32769,
            ..d
        },
    ] {
        let (here, there) = (outcome(dev, caps)?, outcome(&sim, caps)?);
        if here != there {
            return Err(format!(
                "{caps:?}: {here} through rdma-core, {there} on the software NIC"
            ));
        }
    }
    // Past the device's `max_cqe`, refused on both with the same maximum (the largest CQ
    // itself, 256 MiB of ring on each, is left out: the memcheck stage runs this case).
    for entries in [1 << 22, u32::MAX] {
        let size = |d: &Device| match d.create_cq(entries) {
            Ok(cq) => format!("{} entries", cq.capacity()),
            Err(e) => format!("{e:?}"),
        };
        let (here, there) = (size(dev), size(&sim));
        if here != there {
            return Err(format!(
                "create_cq({entries}): {here} through rdma-core, {there} on the software NIC"
            ));
        }
    }
    Ok(())
}

/// Completion timestamps as a ConnectX user gets them: rdma-core's provider creates the CQ
/// (`ibv_create_cq_ex` with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, the kernel's
/// `IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION`), the crate polls its ring and converts each
/// stamp with the clock-info page `mlx5dv_get_clock_info` copies out of the kernel's
/// mapping; `Device::clock` reads the counter page through `ibv_query_rt_values_ex`. Each
/// write's time lies between the device's clock read before it was posted and after its
/// completion was polled; the compressed pair is refused typed.
fn timestamps(dev: &Device) -> Result<(), String> {
    use std::time::{Duration, Instant};
    let e = |e: Error| e.to_string();
    let pd = dev.alloc_pd().map_err(e)?;
    let mut cq = dev
        .create_cq_with(&CqOptions::new(64).timestamps())
        .map_err(e)?;
    let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
    let mut b = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
    let (ea, eb) = (a.endpoint().map_err(e)?, b.endpoint().map_err(e)?);
    a.connect(&eb).map_err(e)?;
    b.connect(&ea).map_err(e)?;
    let mr = pd
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(e)?;
    let mut last = 0;
    for i in 0..20u64 {
        let before = dev.clock().map_err(e)?;
        if before.format != TimestampFormat::FreeRunning || before.ns < last {
            return Err(format!("clock {before:?} after {last}"));
        }
        a.write_inline(
            &[i as u8],
            mr.remote(i as usize).map_err(e)?,
            i,
            PostFlags::SIGNALED,
        )
        .map_err(e)?;
        let (mut out, mut times) = ([Completion::default(); 2], [None; 2]);
        let t = Instant::now();
        while cq.poll_timed(&mut out, &mut times).map_err(e)? == 0 {
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!("write {i} never completed"));
            }
        }
        let after = dev.clock().map_err(e)?;
        let at = times[0].ok_or(format!("no time for {:?}", out[0]))?;
        if out[0].cookie != i || !(before.ns <= at && at <= after.ns) {
            return Err(format!(
                "{:?} at {at}: not within {before:?} .. {after:?}",
                out[0]
            ));
        }
        last = at;
    }
    match dev.create_cq_with(
        &CqOptions::new(8)
            .timestamps()
            .compression(MiniCqeFormat::Hash),
    ) {
        Err(Error::Timestamps { .. }) => Ok(()),
        other => Err(format!("timestamps with compression: {other:?}")),
    }
}

/// A ConnectX whose clock runs in real-time mode (the context's
/// `MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS`, `mlx5dv_query_device`'s
/// `MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS`): CQs asked for timestamps get real-time ones (the
/// direct path asks the kernel for `MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS` through an extended
/// CQ with wall-clock times; the verbs path reads them through rdma-core), each a time of
/// the NIC's real-time clock, in order, on both paths; `Device::clock` is refused, typed
/// (the clock is the PTP clock).
fn real_time_stamps(_dev: &Device) -> Result<(), String> {
    use std::time::{Duration, Instant};
    if !model::set_real_time(true) {
        return Err("the kernel model is not loaded".into());
    }
    let _restore = model::Restore(|| {
        model::set_real_time(false);
    });
    // The NIC's real-time clock starts at 2026-11-01 00:00:00 UTC (`HwClock::default`).
    let epoch = mlx5::sim::HwClock::default().epoch_ns;
    let run = |verbs: bool| -> Result<Vec<u64>, String> {
        let e = |e: Error| e.to_string();
        let d = open_fresh(verbs)?;
        match d.clock() {
            Err(Error::Timestamps { .. }) => {}
            other => return Err(format!("Device::clock on a real-time device: {other:?}")),
        }
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d
            .create_cq_with(&CqOptions::new(64).timestamps())
            .map_err(e)?;
        let mut qp = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        qp.connect(&qp.endpoint().map_err(e)?).map_err(e)?;
        let mr = pd.alloc_mr(64, scenarios::RIGHTS).map_err(e)?;
        let mut at = Vec::new();
        for i in 0..5u64 {
            qp.write_inline(&[1], mr.remote(0).map_err(e)?, i, PostFlags::SIGNALED)
                .map_err(e)?;
            let (mut out, mut times) = ([Completion::default(); 1], [None; 1]);
            let t = Instant::now();
            while cq.poll_timed(&mut out, &mut times).map_err(e)? == 0 {
                if t.elapsed() > Duration::from_secs(20) {
                    return Err(format!("write {i} never completed"));
                }
            }
            at.push(times[0].ok_or(format!("no time for {:?}", out[0]))?);
        }
        Ok(at)
    };
    for (name, verbs) in [("direct path", false), ("verbs path", true)] {
        let at = run(verbs)?;
        let day = 86_400_000_000_000;
        if !at.windows(2).all(|w| w[0] <= w[1]) || at[0] < epoch || at[4] > epoch + day {
            return Err(format!(
                "{name}: stamps {at:?}, not in order within a day after {epoch}"
            ));
        }
    }
    Ok(())
}

/// What one run of [`srq_page_fault_run`] showed: (cookie, status, byte count) of each
/// receive completion, and the two buffers' first bytes.
type FaultRun = (Vec<(u64, WcStatus, u32)>, [u8; 2]);

/// Two receives of an SRQ into an on-demand region, its pages invalidated (the kernel's
/// MMU notifier), then two sends of 200 and 120 bytes: the first receive's WQE meets the
/// page fault, which the device reports in a CQE (REMOTE_ABORTED, vendor syndrome 0x93)
/// that is no completion of the user's; the message lands in the second receive, and the
/// first, posted again, takes the second message.
fn srq_page_fault_run(dev: &Device, invalidate: &dyn Fn(u32) -> bool) -> Result<FaultRun, String> {
    let e = |e: Error| e.to_string();
    let pd = dev.alloc_pd().map_err(e)?;
    let mut scq = dev.create_cq(64).map_err(e)?;
    let mut rcq = dev.create_cq(64).map_err(e)?;
    let caps = SrqCaps {
        entries: 7,
        max_sge: 1,
    };
    let mut srq = pd.create_srq(&rcq, caps).map_err(e)?;
    let (_s, mut c) = srq_pair(&pd, &scq, &srq)?;
    let odp = pd
        .register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::ON_DEMAND)
        .map_err(|r| r.error.to_string())?;
    let src = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
    srq.post_recv(&[odp.sge(0, 256).map_err(e)?], 10)
        .map_err(e)?;
    srq.post_recv(&[odp.sge(256, 256).map_err(e)?], 11)
        .map_err(e)?;
    if !invalidate(odp.lkey()) {
        return Err(format!(
            "no on-demand region {:#x} to invalidate",
            odp.lkey()
        ));
    }
    let mut seen = Vec::new();
    for (fill, len) in [(0xa1u8, 200u32), (0xb2, 120)] {
        src.write(0, &vec![fill; len as usize]).map_err(e)?;
        c.send(
            Payload::Sgl(&[src.sge(0, len).map_err(e)?]),
            fill as u64,
            PostFlags::SIGNALED,
        )
        .map_err(e)?;
        let r = scenarios::wait_on(dev, &mut rcq, 1);
        seen.push((r[0].cookie, r[0].status, r[0].byte_len));
        scenarios::wait_on(dev, &mut scq, 1);
    }
    let (mut a, mut b) = ([0u8], [0u8]);
    odp.read(0, &mut a).map_err(e)?;
    odp.read(256, &mut b).map_err(e)?;
    Ok((seen, [a[0], b[0]]))
}

/// Issue 27, item 4, against rdma-core itself: the same SRQ page fault on the direct path
/// over the provider's objects (the crate swallows the fault's CQE and posts the WQE again,
/// as `mlx5_complete_odp_fault`), on the verbs path (rdma-core's own `ibv_poll_cq`:
/// `is_odp_pfault_err`, `srq_repost`, with the WQE's data segments read from its ring) and
/// on the software NIC's own creation path; all three see the expected outcome. A CQE that
/// rdma-core did not take for a page fault would reach the user as `RemAbortErr`.
fn srq_page_faults(dev: &Device) -> Result<(), String> {
    let want: FaultRun = (
        vec![(11, WcStatus::Success, 200), (10, WcStatus::Success, 120)],
        [0xb2, 0xa1],
    );
    let direct = srq_page_fault_run(dev, &model::invalidate_odp)?;
    let verbs = srq_page_fault_run(crate::verbs_device()?, &model::invalidate_odp)?;
    let sim = Device::sim();
    let own = srq_page_fault_run(&sim, &|lkey| {
        sim.nic().is_some_and(|n| n.invalidate_odp(lkey))
    })?;
    for (label, got) in [("direct", direct), ("verbs", verbs), ("sim", own)] {
        if got != want {
            return Err(format!("{label}: {got:?}, want {want:?}"));
        }
    }
    Ok(())
}

/// What the model does not have reaches the caller as typed refusals: implicit on-demand
/// paging (`Capability::ImplicitOnDemandPaging`) and dma-buf registration (no ioctl
/// framework, `ENOTTY` from `ibv_reg_dmabuf_mr`: `Capability::DmaBuf`). Explicit on-demand
/// paging it has, as the NIC's memory caps say.
fn refused_typed(dev: &Device) -> Result<(), String> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    if !dev.odp_caps().rc(true) || !dev.odp_caps().srq_recv() || dev.odp_caps().implicit() {
        return Err(format!("on-demand caps: {:?}", dev.odp_caps()));
    }
    // SAFETY: local write only; refused (nothing registered).
    match unsafe { pd.register_implicit_odp(Access::LOCAL_WRITE) } {
        Err(Error::Capability(Capability::ImplicitOnDemandPaging)) => {}
        other => return Err(format!("implicit on-demand: {other:?}")),
    }
    // SAFETY: memfd_create with a valid C string; the descriptor is owned from here on.
    let fd = unsafe { libc::memfd_create(c"provider-dmabuf".as_ptr(), 0) };
    if fd < 0 {
        return Err("memfd_create".into());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    match pd.register_dmabuf(fd.as_fd(), 0, 4096, 0x10000, Access::LOCAL_WRITE) {
        Err(Error::Capability(Capability::DmaBuf)) => Ok(()),
        other => Err(format!("dma-buf: {other:?}")),
    }
}

/// A ping-pong of RDMA writes, perftest's `ib_write_lat` pattern: each side waits for the
/// other's byte in its own buffer, then writes its own; 200 round trips, each write's
/// completion polled.
fn pingpong(dev: &Device) -> Result<(), String> {
    use std::time::{Duration, Instant};
    let mut p = scenarios::Pair::new(
        dev,
        scenarios::RIGHTS,
        scenarios::caps(),
        &Timing::default(),
    );
    let wait_byte = |mr: &MemoryRegion, tag: u8| -> Result<(), String> {
        let t = Instant::now();
        while mr.read_volatile_u8(0).map_err(|e| e.to_string())? != tag {
            if t.elapsed() > Duration::from_secs(20) {
                return Err(format!("byte {tag} never arrived"));
            }
            std::hint::spin_loop();
        }
        Ok(())
    };
    for i in 1..=200u32 {
        let tag = (i % 255 + 1) as u8;
        let to_b = p.mr_b.remote(0).map_err(|e| e.to_string())?;
        p.a.write_inline(&[tag], to_b, i as u64, PostFlags::SIGNALED)
            .map_err(|e| e.to_string())?;
        wait_byte(&p.mr_b, tag)?;
        let to_a = p.mr_a.remote(0).map_err(|e| e.to_string())?;
        p.b.write_inline(&[tag], to_a, i as u64, PostFlags::SIGNALED)
            .map_err(|e| e.to_string())?;
        wait_byte(&p.mr_a, tag)?;
        let (ca, cb) = (p.wait(false, 1), p.wait(true, 1));
        if ca[0].0 != i as u64 || cb[0].0 != i as u64 || ca[0].1 != WcStatus::Success {
            return Err(format!("round {i}: {ca:?} {cb:?}"));
        }
    }
    Ok(())
}

/// 48 receives completing on a compressed CQ of the provider's (sessions of mini-CQEs the
/// software NIC writes into the provider's ring, decoded by the crate), against the
/// software NIC's own run; the NIC must have written at least one session there.
fn compressed_traffic(dev: &Device) -> Result<(), String> {
    type Seen = (
        Vec<(u64, WcStatus, WcOpcode, u32, Option<u32>)>,
        Option<u64>,
    );
    fn run(dev: &Device, sessions: fn(u32) -> Option<u64>) -> Seen {
        let pd = dev.alloc_pd().expect("pd");
        let cq_a = dev.create_cq(256).expect("cq a");
        let opts = CqOptions::new(256).compression(mlx5::MiniCqeFormat::Hash);
        let mut cq_b = dev.create_cq_with(&opts).expect("compressed cq");
        let caps = QpCaps {
            sq_blocks: 128,
            rq_entries: 64,
            ..scenarios::caps()
        };
        let mut a = pd.create_qp(&cq_a, &cq_a, caps).expect("qp a");
        let mut b = pd.create_qp(&cq_b, &cq_b, caps).expect("qp b");
        let (ea, eb) = (a.endpoint().expect("ep a"), b.endpoint().expect("ep b"));
        a.connect_with(&eb, &Timing::default()).expect("connect a");
        b.connect_with(&ea, &Timing::default()).expect("connect b");
        let mr = pd.alloc_mr(64 * 64, scenarios::RIGHTS).expect("mr");
        for i in 0..48 {
            b.post_recv(&[mr.sge(64 * i, 64).expect("sge")], 1000 + i as u64)
                .expect("recv");
        }
        // One doorbell for all (a batch): the NIC takes them in one pass, and its
        // completions of one QP and opcode share sessions (the immediates change every 16).
        let mut batch = a.batch();
        for i in 0..48u64 {
            // 48 bytes: past the 32 a 64-byte CQE carries, so no receive completes inside
            // its CQE (those are never compressed).
            let data = Payload::Inline(&[i as u8; 48]);
            let req = if i < 16 {
                Request::Send { data }
            } else {
                Request::SendImm {
                    data,
                    imm: (i / 16) as u32,
                }
            };
            batch.push(&req, i, PostFlags::UNSIGNALED).expect("send");
        }
        batch.ring().expect("ring");
        let got = scenarios::wait_on(dev, &mut cq_b, 48)
            .iter()
            .map(|c| (c.cookie, c.status, c.opcode, c.byte_len, c.imm))
            .collect();
        (got, sessions(cq_b.cqn()))
    }
    let ((here, sessions), (sim, _)) = (
        run(dev, crate::model::cq_sessions),
        run(&Device::sim(), |_| None),
    );

    if here != sim {
        return Err(format!("mlx5_0: {here:?}\nsim:    {sim:?}"));
    }
    match sessions {
        Some(n) if n > 0 => Ok(()),
        other => Err(format!(
            "no compressed session on the provider's CQ: {other:?}"
        )),
    }
}

/// Objects dropped with work outstanding, in the orders a program may drop them (QP before
/// its CQ with receives posted and requests in flight, a CQ with unpolled entries, the
/// domain last), leave the device working: a new pair then runs every scenario's traffic.
fn teardown(dev: &Device) -> Result<(), String> {
    for order in 0..3 {
        let mut p = scenarios::Pair::new(
            dev,
            scenarios::RIGHTS,
            scenarios::caps(),
            &Timing::default(),
        );
        for i in 0..8 {
            p.b.post_recv(&[p.mr_b.sge(64 * i, 64).expect("sge")], i as u64)
                .expect("recv");
        }
        for i in 0..16u64 {
            p.a.write_inline(
                b"x",
                p.mr_b.remote(0).expect("remote"),
                i,
                PostFlags::SIGNALED,
            )
            .expect("write");
        }
        p.a.send(Payload::Inline(b"y"), 99, PostFlags::SIGNALED)
            .expect("send");
        let scenarios::Pair {
            a,
            b,
            cq_a,
            cq_b,
            mr_a,
            mr_b,
            ..
        } = p;
        match order {
            0 => drop((a, b, cq_a, cq_b, mr_a, mr_b)),
            1 => drop((cq_b, cq_a, mr_b, b, a, mr_a)),
            _ => drop((mr_a, mr_b, b, cq_b, a, cq_a)),
        }
    }
    let o = scenarios::ALL
        .iter()
        .find(|(n, _)| *n == "send_recv")
        .map(|(_, f)| f(dev))
        .ok_or("no send_recv scenario")?;
    let sim = scenarios::ALL
        .iter()
        .find(|(n, _)| *n == "send_recv")
        .map(|(_, f)| f(&Device::sim()))
        .ok_or("no send_recv scenario")?;
    let d = scenarios::diff("mlx5_0", &[o], "sim", &[sim]);
    if d.is_empty() {
        Ok(())
    } else {
        Err(d)
    }
}

/// DC through the provider, against the software NIC's own run.
fn dc_traffic(dev: &Device) -> Result<(), String> {
    let here = crate::dc::traffic(dev);
    let sim = crate::dc::traffic(&Device::sim());
    if here == sim {
        Ok(())
    } else {
        Err(format!("mlx5_0: {here:?}\nsim:    {sim:?}"))
    }
}

fn qp_view(qp: &Qp) -> Result<model::QpView, String> {
    model::qp(qp.qpn()).ok_or_else(|| format!("the model has no QP {}", qp.qpn()))
}

/// `QpCaps::scatter_to_cqe = false` must reach the kernel as a QP created without
/// `MLX5_QP_FLAG_SCATTER_CQE` (`mlx5dv_create_qp` with
/// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`): a plain `ibv_create_qp_ex` gets the
/// provider's default, scatter-to-CQE on, and a receive into memory the CPU cannot write
/// would then complete inside its CQE (issue 27 item 1).
fn scatter_off(dev: &Device) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cq = dev.create_cq(64).map_err(|e| e.to_string())?;
    let caps = QpCaps {
        scatter_to_cqe: false,
        ..scenarios::caps()
    };
    let qp = pd.create_qp(&cq, &cq, caps).map_err(|e| e.to_string())?;
    let v = qp_view(&qp)?;
    if v.scatter_to_cqe {
        return Err(format!("QP {} has scatter-to-CQE on: {v:?}", qp.qpn()));
    }
    Ok(())
}

/// Without the flag the QP keeps rdma-core's default (scatter-to-CQE on), as on hardware.
fn scatter_default(dev: &Device) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cq = dev.create_cq(64).map_err(|e| e.to_string())?;
    let qp = pd
        .create_qp(&cq, &cq, scenarios::caps())
        .map_err(|e| e.to_string())?;
    let v = qp_view(&qp)?;
    if !v.scatter_to_cqe {
        return Err(format!(
            "QP {} lost the default scatter-to-CQE: {v:?}",
            qp.qpn()
        ));
    }
    Ok(())
}

/// Every direct-path QP is on a thread domain of its own: it rings a dynamic bfreg (the
/// domain's, `MLX5_QP_FLAG_BFREG_INDEX`) that no other QP rings.
fn own_registers(dev: &Device) -> Result<(), String> {
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cq = dev.create_cq(64).map_err(|e| e.to_string())?;
    let qps: Vec<Qp> = (0..4)
        .map(|_| pd.create_qp(&cq, &cq, scenarios::caps()))
        .collect::<Result<_>>()
        .map_err(|e| e.to_string())?;
    let views: Vec<model::QpView> = qps.iter().map(qp_view).collect::<Result<_, _>>()?;
    if let Some(v) = views.iter().find(|v| !v.dynamic) {
        return Err(format!("a QP rings a register of the context: {v:?}"));
    }
    let mut regs: Vec<u32> = views.iter().map(|v| v.bfreg).collect();
    regs.sort_unstable();
    regs.dedup();
    if regs.len() != views.len() {
        return Err(format!("QPs share a register: {views:?}"));
    }
    Ok(())
}

/// A CQ created with compression compresses on the device (`cqe_comp_en` and the format
/// reach `create_cq_user`), and a burst of receives on it comes back whole.
fn compressed_cq(dev: &Device) -> Result<(), String> {
    let format = mlx5::MiniCqeFormat::Hash;
    let cq = dev
        .create_cq_with(&CqOptions::new(256).compression(format))
        .map_err(|e| e.to_string())?;
    match model::cq_compression(cq.cqn()) {
        Some(bit) if bit == format.bit() => Ok(()),
        other => Err(format!("CQ {} compresses with {other:?}", cq.cqn())),
    }
}

/// The receive side of a QP as created through rdma-core and on the software
/// NIC's own path: how many receives of how many scatter entries each accepts for the same
/// caps.
/// A UD QP of the largest limits a ConnectX can post at (59 gather entries, 940 inline
/// bytes: libmlx5 takes 60 and reports 956, then writes 64 DS, which the control segment
/// cannot say), on both paths over libmlx5 and on the software NIC: created, posts at the
/// limits complete, one more inline byte is refused as too long.
fn ud_send_limits(dev: &Device) -> Result<(), String> {
    let outcome = |d: &Device| -> Result<String, String> {
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        let caps = QpCaps {
            sq_blocks: 64,
            max_send_sge: 59,
            max_inline: 940,
            ..QpCaps::default()
        };
        let over = pd
            .create_ud_qp(
                &cq,
                &cq,
                QpCaps {
                    max_inline: 941,
                    ..caps
                },
                0x11,
            )
            .map(|_| ())
            .map_err(e);
        let mut a = pd.create_ud_qp(&cq, &cq, caps, 0x11).map_err(e)?;
        let b = pd
            .create_ud_qp(&cq, &cq, QpCaps::default(), 0x22)
            .map_err(e)?;
        let to = b.endpoint();
        let ah = pd.create_ah(to).map_err(e)?;
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        let sgl: Vec<Sge> = (0..59).map(|i| mr.sge(i * 8, 8).expect("sge")).collect();
        let data = [7u8; 941];
        let f = PostFlags::SIGNALED;
        let posts = [
            a.send_to(&ah, to.qpn, to.qkey, Payload::Sgl(&sgl), 1, f),
            a.send_to(&ah, to.qpn, to.qkey, Payload::Inline(&data[..940]), 2, f),
            a.send_to(&ah, to.qpn, to.qkey, Payload::Inline(&data), 3, f),
        ];
        let got: Vec<_> = scenarios::wait_on(d, &mut cq, 2)
            .iter()
            .map(|c| (c.cookie, c.status))
            .collect();
        Ok(format!(
            "941 inline at creation: {over:?}; posts: {posts:?}; completions {got:?}"
        ))
    };
    let sim = outcome(&Device::sim())?;
    let want = "Err(InlineTooLong { len: 941, max: 940 })";
    if !sim.contains(want) || !sim.contains("(2, Success)]") {
        return Err(format!("the software NIC: {sim}"));
    }
    for (name, d) in [("direct path", dev), ("verbs path", crate::verbs_device()?)] {
        let here = outcome(d)?;
        if here != sim {
            return Err(format!("{name}: {here}\nsoftware NIC: {sim}"));
        }
    }
    Ok(())
}

/// A ConnectX the kernel reports `IBV_ATOMIC_NONE` for (`get_atomic_caps`): one whose
/// 8-byte atomics answer big-endian (the usual reason), and one with no atomic operations
/// at all, where the kernel refuses a QP's remote atomic right at RTR (`get_atomic_mode`,
/// EOPNOTSUPP). On both paths the QP connects (without the right, on the second), an
/// atomic is refused typed before posting and a write completes, and the verbs path still
/// posts with `ibv_wr_*` (it asked libmlx5 for the atomic opcodes, which
/// `mlx5_qp_fill_wr_pfns` refuses there: the QP fell back to `ibv_post_send`, or was
/// refused under `BLUEFLAME_VERBS_API=extended`).
fn no_atomics(_dev: &Device) -> Result<(), String> {
    for mode in [model::Atomics::BigEndian, model::Atomics::None] {
        if !model::set_atomics(mode) {
            return Err("the kernel model is not loaded".into());
        }
        let _restore = model::Restore(|| {
            model::set_atomics(model::Atomics::Own);
        });
        no_atomics_on(mode)?;
    }
    Ok(())
}

/// [`no_atomics`] on a NIC whose atomics are `mode`.
fn no_atomics_on(mode: model::Atomics) -> Result<(), String> {
    let run = |verbs: bool| -> Result<String, String> {
        let e = |e: Error| e.to_string();
        let d = open_fresh(verbs)?;
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        std::env::set_var("BLUEFLAME_VERBS_API", "extended");
        let qp = pd.create_qp(&cq, &cq, scenarios::caps());
        std::env::remove_var("BLUEFLAME_VERBS_API");
        let mut qp = qp.map_err(e)?;
        qp.connect(&qp.endpoint().map_err(e)?).map_err(e)?;
        let mr = pd
            .alloc_mr(
                64,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            )
            .map_err(e)?;
        let remote = mr.remote(8).map_err(e)?;
        let atomic = qp.fetch_add(remote, 1, mr.sge(0, 8).map_err(e)?, 1, PostFlags::SIGNALED);
        qp.write_inline(&[1; 8], remote, 2, PostFlags::SIGNALED)
            .map_err(e)?;
        let got: Vec<_> = scenarios::wait_on(&d, &mut cq, 1)
            .iter()
            .map(|c| (c.cookie, c.status))
            .collect();
        Ok(format!(
            "{:?} {:?}: atomic {atomic:?}, completions {got:?}",
            qp.data_path(),
            qp.verbs_api()
        ))
    };
    let direct = run(false)?;
    let verbs = run(true)?;
    // A DC target's atomic right: refused, typed, where the kernel has no atomic mode
    // (`mlx5_ib_modify_dct`); taken where it has one (big-endian replies).
    {
        let e = |e: Error| e.to_string();
        let d = open_fresh(false)?;
        let pd = d.alloc_pd().map_err(e)?;
        let cq = d.create_cq(16).map_err(e)?;
        let srq = pd.create_srq(&cq, SrqCaps::default()).map_err(e)?;
        let all = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        let dct = pd.create_dct(&cq, &srq, 7, all);
        match (mode, &dct) {
            (model::Atomics::None, Err(Error::Capability(Capability::RemoteAtomics))) => {}
            (model::Atomics::BigEndian, Ok(_)) => {}
            _ => return Err(format!("{mode:?}: a DCT with REMOTE_ATOMIC: {dct:?}")),
        }
    }
    let refused = "atomic Err(Unsupported(";
    let (want_direct, want_verbs) = ("Direct None", "Verbs Some(Extended)");
    let done = "completions [(2, Success)]";
    for (text, want) in [(&direct, want_direct), (&verbs, want_verbs)] {
        if !text.starts_with(want) || !text.contains(refused) || !text.ends_with(done) {
            return Err(format!(
                "{mode:?}: want {want}, {refused}.., {done}: {text}"
            ));
        }
    }
    Ok(())
}

/// A QP whose peer never connects back (it stays in INIT): on a ConnectX its RTR names the
/// peer in its own context only, so it reaches RTS and its request fails with
/// `RetryExcErr` once its retries are spent, on both paths over libmlx5 as on the software
/// NIC. (The kernel model connected the NIC's QPs only when both ends had named each other:
/// such a request never completed.)
fn peer_never_connects(dev: &Device) -> Result<(), String> {
    let outcome = |d: &Device| -> Result<String, String> {
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        let mut a = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let b = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let quick = Timing {
            timeout: 1,
            retry_cnt: 1,
            ..Timing::default()
        };
        a.connect_with(&b.endpoint().map_err(e)?, &quick)
            .map_err(e)?;
        let mr = pd.alloc_mr(64, scenarios::RIGHTS).map_err(e)?;
        a.write_inline(&[1; 8], mr.remote(0).map_err(e)?, 1, PostFlags::SIGNALED)
            .map_err(e)?;
        // Bounded in time (`wait_on`): without the peer's connect the request used to stay
        // queued for good.
        let got: Vec<_> = scenarios::wait_on(d, &mut cq, 1)
            .iter()
            .map(|c| (c.cookie, c.status))
            .collect();
        Ok(format!("completions {got:?}"))
    };
    let want = "completions [(1, RetryExcErr)]";
    for (name, d) in [
        ("software NIC", &Device::sim()),
        ("direct path", dev),
        ("verbs path", crate::verbs_device()?),
    ] {
        let got = outcome(d)?;
        if got != want {
            return Err(format!("{name}: {got}, want {want}"));
        }
    }
    Ok(())
}

/// A DCI stranded by a DCT that went away (its retries run out, every later request to
/// every target is flushed: the DCI is in error until reset, UCX
/// `uct_dc_mlx5_iface_reset_dci`) recovers (`Dci::recover`: a new DCI made by rdma-core's
/// `mlx5dv_create_qp`, the old one destroyed) and serves the other DCT; moved to error by its
/// owner, an auto-recovering DCI refuses posts until its flush is polled, then goes on. On
/// the direct path over libmlx5 as on the software NIC (the rdma backend's DCI recovery
/// and `set_error` ran on no test before).
fn dci_recovery(dev: &Device) -> Result<(), String> {
    let run = |d: &Device| -> Result<String, String> {
        let e = |e: Error| e.to_string();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let pd = d.alloc_pd().map_err(e)?;
        let tcq = d.create_cq(16).map_err(e)?;
        let srq = pd.create_srq(&tcq, SrqCaps::default()).map_err(e)?;
        let mr = pd.alloc_mr(4096, all).map_err(e)?;
        let mut cq = d.create_cq(64).map_err(e)?;
        let timing = Timing {
            timeout: 8,
            retry_cnt: 1,
            ..Timing::default()
        };
        let mut dci = pd
            .create_dci_with(&cq, QpCaps::default(), &timing)
            .map_err(e)?;
        let rights = Access::REMOTE_WRITE | Access::REMOTE_READ;
        let a = pd.create_dct(&tcq, &srq, 1, rights).map_err(e)?;
        let b = pd.create_dct(&tcq, &srq, 2, rights).map_err(e)?;
        // The targets' port address as a user gets it: an address handle to a UD QP's
        // endpoint (a DC destination on a ConnectX is an AV, the DCT number and key).
        let caps = QpCaps {
            sq_blocks: 16,
            rq_entries: 1,
            ..QpCaps::default()
        };
        let probe = pd.create_ud_qp(&tcq, &tcq, caps, 1).map_err(e)?;
        let ah = pd.create_ah(probe.endpoint()).map_err(e)?;
        let pa = DcPeer::from_ah(&ah, a.dctn(), 1).map_err(e)?;
        let pb = DcPeer::from_ah(&ah, b.dctn(), 2).map_err(e)?;
        let mut log = Vec::new();
        let next = |cq: &mut Cq, log: &mut Vec<String>| {
            let c = scenarios::wait_on(d, cq, 1)[0];
            log.push(format!("{}:{:?}", c.cookie, c.status));
        };
        let f = PostFlags::SIGNALED;
        let at = |off: usize| mr.remote(off).map_err(e);
        dci.to(&pa).write_inline(b"a", at(0)?, 1, f).map_err(e)?;
        next(&mut cq, &mut log);
        drop(a);
        dci.to(&pa).write_inline(b"a", at(8)?, 2, f).map_err(e)?;
        dci.to(&pb).write_inline(b"b", at(16)?, 3, f).map_err(e)?;
        next(&mut cq, &mut log);
        next(&mut cq, &mut log);
        log.push(format!("in error {}", dci.in_error()));
        let old = dci.qpn();
        dci.recover().map_err(e)?;
        log.push(format!("new DCI {}", dci.qpn() != old));
        dci.to(&pb).write_inline(b"B", at(16)?, 4, f).map_err(e)?;
        next(&mut cq, &mut log);
        // Moved to error by its owner with nothing outstanding: an auto-recovering DCI
        // recovers at the next post, which goes out.
        dci.set_error().map_err(e)?;
        log.push(format!("set to error {}", dci.in_error()));
        dci.set_auto_recover(true);
        let old = dci.qpn();
        dci.to(&pb).write_inline(b"C", at(24)?, 5, f).map_err(e)?;
        log.push(format!("recovered at the post {}", dci.qpn() != old));
        next(&mut cq, &mut log);
        let bytes: Vec<u8> = [16, 24]
            .iter()
            .map(|&o| mr.read_u64(o).map(|v| v as u8).unwrap_or(0))
            .collect();
        log.push(format!("bytes {:?}", String::from_utf8_lossy(&bytes)));
        Ok(log.join(", "))
    };
    let sim = run(&Device::sim())?;
    let want = "1:Success, 2:RetryExcErr, 3:WrFlushErr, in error true, new DCI true, \
                4:Success, set to error true, recovered at the post true, 5:Success, \
                bytes \"BC\"";
    let here = run(dev)?;
    if sim != want || here != sim {
        return Err(format!(
            "mlx5_0: {here}\nsoftware NIC: {sim}\nwanted: {want}"
        ));
    }
    Ok(())
}

/// The device's error events (`IBV_EVENT_SRQ_ERR`, `IBV_EVENT_CQ_ERR`,
/// `IBV_EVENT_QP_FATAL`) through libibverbs' asynchronous event file, as on the software
/// NIC: each is reported by its own object's `check` (and an SRQ's by its receivers'),
/// naming the object's number, and by no other object. (Through rdma-core the SRQ and CQ
/// errors named number 0: libibverbs names them by their `ibv_srq` / `ibv_cq` only.)
/// `IBV_EVENT_PORT_ERR` then `IBV_EVENT_PORT_ACTIVE` through libibverbs' event file: the
/// port's error is reported while it is down and no longer once it is up (libibverbs hands
/// the port number in the event's element; the crate read and dropped the port-active
/// event, so the error stayed every QP's for good).
fn port_comes_back(dev: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let pd = dev.alloc_pd().map_err(e)?;
    let cq = dev.create_cq(64).map_err(e)?;
    let qp = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
    let mut log = Vec::new();
    for (what, kind) in [("port error", 10), ("port active", 9)] {
        model::raise_event(kind, 1);
        // The model forwards events every 0.5 ms.
        std::thread::sleep(std::time::Duration::from_millis(50));
        log.push(format!("{what}: qp {:?}, cq {:?}", qp.check(), cq.check()));
    }
    let got = log.join("; ");
    let want = "port error: qp Err(AsyncEvent(PortError { port: 1 })), cq \
                Err(AsyncEvent(PortError { port: 1 })); port active: qp Ok(()), cq Ok(())";
    if got != want {
        return Err(format!("{got}\nwanted: {want}"));
    }
    Ok(())
}

fn device_errors(dev: &Device) -> Result<(), String> {
    let run = |d: &Device, raise: &dyn Fn(i32, u32)| -> Result<String, String> {
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let cq = d.create_cq(64).map_err(e)?;
        let other_cq = d.create_cq(64).map_err(e)?;
        let srq = pd.create_srq(&cq, SrqCaps::default()).map_err(e)?;
        let on_srq = pd
            .create_qp_with_srq(&cq, &srq, scenarios::caps())
            .map_err(e)?;
        let own = pd.create_qp(&cq, &cq, scenarios::caps()).map_err(e)?;
        let mut log = Vec::new();
        let show = |r: Result<(), Error>| match r {
            Ok(()) => "ok".to_string(),
            Err(Error::AsyncEvent(AsyncEvent::SrqError { srqn })) => {
                format!("SrqError(own number {})", srqn == srq.srqn())
            }
            Err(Error::AsyncEvent(AsyncEvent::CqError { cqn })) => {
                format!("CqError(own number {})", cqn == other_cq.cqn())
            }
            Err(Error::AsyncEvent(AsyncEvent::QpFatal { qpn })) => {
                format!("QpFatal(own number {})", qpn == own.qpn())
            }
            Err(other) => format!("{other:?}"),
        };
        for (what, kind, n) in [
            ("SRQ error", 14, srq.srqn()),
            ("QP fatal", 1, own.qpn()),
            ("CQ error", 0, other_cq.cqn()),
        ] {
            raise(kind, n);
            // The model forwards events every 0.5 ms.
            std::thread::sleep(std::time::Duration::from_millis(50));
            log.push(format!(
                "{what}: srq {}, on srq {}, own {}, cq {}",
                show(srq.check()),
                show(on_srq.check()),
                show(own.check()),
                show(other_cq.check())
            ));
        }
        Ok(log.join("; "))
    };
    let sim_dev = Device::sim();
    let nic = sim_dev.nic().ok_or("no software NIC")?;
    let sim = run(&sim_dev, &|kind, n| {
        use mlx5::sim::AsyncEvent as E;
        nic.raise_event(match kind {
            0 => E::CqError { cqn: n },
            1 => E::QpFatal { qpn: n },
            _ => E::SrqError { srqn: n },
        })
    })?;
    let here = run(dev, &|kind, n| {
        model::raise_event(kind, n);
    })?;
    let want = "SRQ error: srq SrqError(own number true), on srq SrqError(own number true), \
                own ok, cq ok; QP fatal: srq SrqError(own number true), on srq SrqError(own \
                number true), own QpFatal(own number true), cq ok; CQ error: srq SrqError(own \
                number true), on srq SrqError(own number true), own QpFatal(own number true), \
                cq CqError(own number true)";
    if sim != want || here != sim {
        return Err(format!(
            "mlx5_0: {here}\nsoftware NIC: {sim}\nwanted: {want}"
        ));
    }
    Ok(())
}

fn receive_limits(dev: &Device) -> Result<(), String> {
    let sim = Device::sim();
    let outcome = |d: &Device, caps: QpCaps, sges: usize| -> Result<String, String> {
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let cq = d.create_cq(64).map_err(e)?;
        let mut qp = pd.create_qp(&cq, &cq, caps).map_err(e)?;
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        let sgl: Vec<Sge> = (0..sges)
            .map(|i| mr.sge(64 * i, 64).expect("sge"))
            .collect();
        let mut posted = 0;
        let mut last = String::new();
        for i in 0..8u64 {
            match qp.post_recv(&sgl, i) {
                Ok(()) => posted += 1,
                Err(err) => {
                    last = format!("{err:?}");
                    break;
                }
            }
        }
        Ok(format!(
            "{posted} receives of {sges} entries posted, then {last}"
        ))
    };
    let d = QpCaps::default();
    let mut diffs = Vec::new();
    for (caps, sges) in [
        (
            QpCaps {
                rq_entries: 1,
                max_recv_sge: 1,
                ..d
            },
            1,
        ),
        (
            QpCaps {
                rq_entries: 2,
                max_recv_sge: 1,
                ..d
            },
            1,
        ),
        (
            QpCaps {
                rq_entries: 4,
                max_recv_sge: 3,
                ..d
            },
            4,
        ),
        (
            QpCaps {
                rq_entries: 4,
                max_recv_sge: 5,
                ..d
            },
            8,
        ),
    ] {
        let (here, there) = (outcome(dev, caps, sges)?, outcome(&sim, caps, sges)?);
        if here != there {
            diffs.push(format!(
                "rq_entries {}, max_recv_sge {}: {here} through rdma-core; {there} on the \
                 software NIC",
                caps.rq_entries, caps.max_recv_sge
            ));
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("\n"))
    }
}

/// A receive entry of 2^31 bytes or more: the direct path refuses it before anything is
/// written (`check_recv_list`: a data segment's byte count is 31 bits, and no message is
/// longer), with the entry's length in the error. The verbs path handed it to rdma-core:
/// `ibv_sge.length` is a u32 and the providers take it as it is (mlx5's `mlx5_post_recv`
/// writes it into the WQE's `byte_count`, whose bit 31 is no length; rxe's `rxe_post_one_recv`
/// sums the lengths into an int), so the receive was posted. Both paths must refuse it
/// the same way, nothing posted: one entry (the queue's room cached by an earlier
/// receive), one of two entries, an SRQ's receive; with and without scatter-to-CQE (with
/// it, the verbs path checks the entries against the domain's regions too).
fn huge_receive_entries(dev: &Device) -> Result<(), String> {
    let outcome = |d: &Device, scatter_to_cqe: bool| -> Result<String, String> {
        let e = |e: Error| e.to_string();
        let pd = d.alloc_pd().map_err(e)?;
        let cq = d.create_cq(64).map_err(e)?;
        let caps = QpCaps {
            scatter_to_cqe,
            ..scenarios::caps()
        };
        let mut qp = pd.create_qp(&cq, &cq, caps).map_err(e)?;
        let mut peer = pd.create_qp(&cq, &cq, caps).map_err(e)?;
        let (eq, ep) = (qp.endpoint().map_err(e)?, peer.endpoint().map_err(e)?);
        qp.connect(&ep).map_err(e)?;
        peer.connect(&eq).map_err(e)?;
        let mut srq = pd.create_srq(&cq, SrqCaps::default()).map_err(e)?;
        let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        let small = mr.sge(0, 64).map_err(e)?;
        let huge = Sge {
            len: 1 << 31,
            ..small
        };
        qp.post_recv(&[small], 1).map_err(e)?;
        let mut out = Vec::new();
        for sgl in [
            vec![huge],
            vec![small, huge],
            vec![Sge {
                len: u32::MAX,
                ..small
            }],
        ] {
            let free = qp.free_recv();
            let r = qp.post_recv(&sgl, 2);
            out.push(format!("qp {r:?}, {} posted", free - qp.free_recv()));
        }
        let free = srq.free();
        let r = srq.post_recv(&[huge], 3);
        out.push(format!("srq {r:?}, {} posted", free - srq.free()));
        // In a region longer than 2^31 bytes (reserved, never touched), after a receive
        // that landed in it: the verbs path's usual receive (`VerbsRecvQueue::post_one`)
        // takes an entry in the region its last receive landed in straight.
        let len = (1usize << 31) + 4096;
        // SAFETY: a private anonymous mapping of our own, unmapped below after every
        // object that names it is dropped.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err("mmap of 2 GiB failed".into());
        }
        {
            // SAFETY: the mapping is ours, writable, and outlives the region (dropped in
            // this block, with the QP that pins it).
            let big = unsafe { pd.register_raw(p.cast(), len, true, Access::LOCAL_WRITE) };
            let big = big.map_err(e)?;
            let first = big.sge(0, 64).map_err(e)?;
            let r = qp.post_recv(&[first], 4);
            out.push(format!("big region {r:?}"));
            let free = qp.free_recv();
            let r = qp.post_recv(
                &[Sge {
                    len: 1 << 31,
                    ..first
                }],
                5,
            );
            out.push(format!(
                "qp in big region {r:?}, {} posted",
                free - qp.free_recv()
            ));
            drop((qp, peer, srq));
        }
        // SAFETY: the mapping made above; nothing names it any more.
        unsafe { libc::munmap(p, len) };
        Ok(out.join("; "))
    };
    let sim = Device::sim();
    let verbs = crate::verbs_device()?;
    let mut diffs = Vec::new();
    for scatter in [true, false] {
        let want = outcome(&sim, scatter)?;
        for (label, d) in [("direct", dev), ("verbs", verbs)] {
            let here = outcome(d, scatter)?;
            if here != want {
                diffs.push(format!(
                    "scatter_to_cqe {scatter}, {label} path: {here}\n  software NIC: {want}"
                ));
            }
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("\n"))
    }
}

/// An address handle of a device on the verbs path is rdma-core's `ibv_ah` alone: the crate
/// reads no mlx5 address vector out of it (`mlx5dv_init_obj` only on the direct path), and
/// its `AddressHandle` carried an all-zero one (LID 0, no GRH). `DcPeer::from_ah` took it
/// as the DCT's address: a DCI request to that peer goes to LID 0, InfiniBand's reserved
/// LID, and never arrives (the DCI's retries run out and it goes to error). Refused now,
/// typed, as UD sends refuse an address handle they cannot use; an address handle of the
/// direct path to the same port makes a peer.
fn verbs_ah_dc_peer(dev: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let mut handles = Vec::new();
    for d in [dev, crate::verbs_device()?] {
        let pd = d.alloc_pd().map_err(e)?;
        let cq = d.create_cq(16).map_err(e)?;
        let caps = QpCaps {
            sq_blocks: 16,
            rq_entries: 1,
            ..QpCaps::default()
        };
        let ud = pd.create_ud_qp(&cq, &cq, caps, 1).map_err(e)?;
        handles.push(pd.create_ah(ud.endpoint()).map_err(e)?);
    }
    let direct = DcPeer::from_ah(&handles[0], 5, 7).map_err(e)?;
    match DcPeer::from_ah(&handles[1], 5, 7) {
        Err(Error::InvalidHandle { .. }) => Ok(()),
        other => Err(format!(
            "a verbs-path address handle gave {other:?} (the direct path's: {direct:?})"
        )),
    }
}

/// rdma-core reads MLX5_QP_SIGNATURE at each QP creation (`verbs.c`
/// `create_qp` -> `qp_sig_enabled`); the crate chose the device's data path (and so its CQs')
/// at open. An RC QP created once the variable is set, on CQs of the direct path: its two
/// signaled writes must complete once each, with their cookies (or the QP be refused,
/// typed).
fn qp_signature_after_open(dev: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let pd = dev.alloc_pd().map_err(e)?;
    let mut cq = dev.create_cq(64).map_err(e)?;
    std::env::set_var("MLX5_QP_SIGNATURE", "1");
    let made = pd.create_qp(&cq, &cq, QpCaps::default());
    std::env::remove_var("MLX5_QP_SIGNATURE");
    let mut qp = match made {
        // A typed refusal is an answer too.
        Err(Error::Unsupported(_)) => return Ok(()),
        other => other.map_err(e)?,
    };
    let me = qp.endpoint().map_err(e)?;
    qp.connect(&me).map_err(e)?;
    let mr = pd
        .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .map_err(e)?;
    qp.write_inline(
        &[7u8; 100],
        mr.remote(0).map_err(e)?,
        1,
        PostFlags::SIGNALED,
    )
    .map_err(e)?;
    qp.write(
        &[mr.sge(2048, 8).map_err(e)?],
        mr.remote(1024).map_err(e)?,
        2,
        PostFlags::SIGNALED,
    )
    .map_err(e)?;
    let mut got = Vec::new();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut out = [Completion::default(); 8];
    while std::time::Instant::now() < until {
        let n = cq.poll(&mut out);
        got.extend(out[..n].iter().map(|c| (c.cookie, c.status)));
    }
    let want = vec![(1, WcStatus::Success), (2, WcStatus::Success)];
    if got == want {
        Ok(())
    } else {
        Err(format!("{dev}: completions {got:?}, wanted {want:?}"))
    }
}

/// rdma-core reads `MLX5_SHUT_UP_BF` and `MLX5_POST_SEND_PREFER_BF` once, when it opens the
/// context (`mlx5_set_context`), and maps and rings every QP's register by them. Set after
/// the device was opened, they change nothing: a QP made then rings its register as the
/// others do (before, the crate read them at each QP and rang a BlueFlame register, which
/// others copy into under its lock, as doorbell-only, without the lock).
fn blueflame_switches_after_open(dev: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let pd = dev.alloc_pd().map_err(e)?;
    let cq = dev.create_cq(64).map_err(e)?;
    let before = pd.create_qp(&cq, &cq, QpCaps::default()).map_err(e)?;
    std::env::set_var("MLX5_SHUT_UP_BF", "1");
    let made = pd.create_qp(&cq, &cq, QpCaps::default());
    std::env::remove_var("MLX5_SHUT_UP_BF");
    let after = made.map_err(e)?;
    if before.doorbell_mode() == after.doorbell_mode() {
        Ok(())
    } else {
        Err(format!(
            "{dev}: a QP made with MLX5_SHUT_UP_BF set after open rings {:?}, the others {:?}",
            after.doorbell_mode(),
            before.doorbell_mode()
        ))
    }
}

/// A QP on an SRQ receives `K` sends and is dropped before its receive CQ is polled: the
/// SRQ's receives it consumed come back to the SRQ (its slots, and the pins of the region
/// they named), on the direct path (the CQ's tombstone gives them back), on the verbs path
/// over libmlx5 (`mlx5_destroy_qp` -> `__mlx5_cq_clean` removes the QP's entries from the
/// CQ and hands their WQEs back to libmlx5's SRQ with `mlx5_free_srq_wqe`, so the crate's
/// poller never sees them) and on the software NIC's own creation path. After the drop and
/// a poll of the receive CQ, the SRQ takes `K` receives again, and a region that only those
/// receives named is deregistered once dropped.
fn srq_slots_of_a_dropped_qp(dev: &Device) -> Result<(), String> {
    const K: u32 = 3;
    let e = |e: Error| e.to_string();
    let sim = Device::sim();
    let mut failures = Vec::new();
    for (label, d) in [
        ("direct", dev),
        ("verbs", crate::verbs_device()?),
        ("sim", &sim),
    ] {
        let pd = d.alloc_pd().map_err(e)?;
        let mut scq = d.create_cq(64).map_err(e)?;
        let mut rcq = d.create_cq(64).map_err(e)?;
        let src = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        let dst = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        // `pinned`: named by the K receives the QP consumes, and by no other.
        let pinned = pd.alloc_mr(4096, Access::LOCAL_WRITE).map_err(e)?;
        let caps = SrqCaps {
            entries: 7,
            max_sge: 1,
        };
        let mut srq = pd.create_srq(&rcq, caps).map_err(e)?;
        let cap = srq.capacity();
        for i in 0..K {
            srq.post_recv(&[pinned.sge(64 * i as usize, 64).map_err(e)?], i as u64)
                .map_err(e)?;
        }
        for i in K..cap {
            srq.post_recv(&[dst.sge(64 * (i % 60) as usize, 64).map_err(e)?], i as u64)
                .map_err(e)?;
        }
        let (s, mut c) = srq_pair(&pd, &scq, &srq)?;
        for i in 0..K as u64 {
            c.send(
                Payload::Sgl(&[src.sge(0, 8).map_err(e)?]),
                i,
                PostFlags::SIGNALED,
            )
            .map_err(e)?;
        }
        let sent = scenarios::wait_on(d, &mut scq, K as usize);
        if let Some(bad) = sent.iter().find(|c| !c.is_ok()) {
            return Err(format!("{label}: a send: {bad:?}"));
        }
        // The receives' completions are in the receive CQ, not polled: the QP goes.
        drop(s);
        drop(c);
        let mut out = [Completion::default(); 8];
        let start = std::time::Instant::now();
        while srq.free() < K && start.elapsed() < std::time::Duration::from_secs(2) {
            d.process();
            rcq.poll(&mut out);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mrs = |d: &Device| {
            if std::ptr::eq(d, &sim) {
                None
            } else {
                model::live_objects().map(|l| l[1])
            }
        };
        let before = mrs(d);
        drop(pinned);
        let after = mrs(d);
        let free = srq.free();
        let mut refused = None;
        for i in 0..K {
            if let Err(x) = srq.post_recv(&[dst.sge(64 * i as usize, 64).map_err(e)?], 100) {
                refused = Some(format!("receive {i} of {K} refused: {x}"));
                break;
            }
        }
        if free != K || refused.is_some() {
            failures.push(format!(
                "{label} ({:?}): after the QP that consumed {K} of the SRQ's {cap} receives \
                 was dropped unpolled, Srq::free() is {free}, not {K}; {}",
                d.data_path(),
                refused.unwrap_or_else(|| "the posts went through".into())
            ));
        }
        if let (Some(b), Some(a)) = (before, after) {
            if a != b - 1 {
                failures.push(format!(
                    "{label}: a region only the dropped QP's consumed receives named is still \
                     registered once dropped (live MRs {b} before its drop, {a} after)"
                ));
            }
        }
        drop((srq, src, dst, pd));
        let _ = (&mut scq, &mut rcq);
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Ten QPs on an SRQ whose sends complete on `scq` (their receives on the SRQ's `rcq`)
/// write once each, the completion polled from `scq`, and are dropped; the SRQ's CQ is
/// not polled (it has nothing to poll: the QPs never receive). Then a new QP on `scq`
/// posts 16 writes: `scq` is empty and every QP that used it is gone, so nothing may hold
/// its entries (review "defer": a dropped verbs-path QP's send-CQ charge stayed with its
/// remains in the receive CQ's registry until a poll of that other CQ saw it empty).
fn send_cq_entries_of_dropped_srq_qps(dev: &Device) -> Result<(), String> {
    let e = |e: Error| e.to_string();
    let mut failures = Vec::new();
    for (label, d) in [("direct", dev), ("verbs", crate::verbs_device()?)] {
        let pd = d.alloc_pd().map_err(e)?;
        let mut scq = d.create_cq(16).map_err(e)?;
        let mut pcq = d.create_cq(64).map_err(e)?;
        let rcq = d.create_cq(64).map_err(e)?;
        let mr = pd
            .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(e)?;
        let srq = pd
            .create_srq(
                &rcq,
                SrqCaps {
                    entries: 7,
                    max_sge: 1,
                },
            )
            .map_err(e)?;
        for round in 0..11u64 {
            // Ten QPs write once each, then one writes 16 times.
            let n = if round < 10 { 1 } else { 16 };
            let mut s = pd
                .create_qp_with_srq(&scq, &srq, scenarios::caps())
                .map_err(e)?;
            // A fresh peer each round (a QP connects once).
            let mut c = pd.create_qp(&pcq, &pcq, scenarios::caps()).map_err(e)?;
            let (es, ec) = (s.endpoint().map_err(e)?, c.endpoint().map_err(e)?);
            s.connect(&ec).map_err(e)?;
            c.connect(&es).map_err(e)?;
            // On a CQ of 16 entries (31 on libmlx5) that nothing else uses.
            let mut posted = 0;
            for i in 0..n {
                if let Err(x) = s.write(
                    &[mr.sge(0, 8).map_err(e)?],
                    mr.remote(64).map_err(e)?,
                    round * 16 + i,
                    PostFlags::SIGNALED,
                ) {
                    failures.push(format!(
                        "{label} ({:?}): round {round}: write {i} of {n} on a new QP refused, \
                         its send CQ holding {i} completions: {x}",
                        d.data_path()
                    ));
                    break;
                }
                posted += 1;
            }
            let done = scenarios::wait_on(d, &mut scq, posted as usize);
            if let Some(bad) = done.iter().find(|c| !c.is_ok()) {
                return Err(format!("{label}: round {round}: {bad:?}"));
            }
            if posted < n {
                break;
            }
            drop(s);
            drop(c);
        }
        let _ = (&mut pcq, &mut scq);
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
