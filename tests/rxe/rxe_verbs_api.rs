//! Both rdma-core APIs of the verbs path on a real device (rxe in the VM of `cargo xtask
//! test`): the extended one (`ibv_wr_*` posting, `ibv_start_poll` polling), which rxe has and
//! `auto` picks, and the classic one (`ibv_post_send` / `ibv_poll_cq`), forced with
//! `BLUEFLAME_VERBS_API=legacy`. Every scenario (data, cookies, statuses, flushes, windows,
//! atomics, batches) must give what the software NIC gives through the direct path, and
//! requests the API can know will fail are refused before posting on both.

use crate::scenarios;

use blueflame::*;
use scenarios::*;
use std::time::{Duration, Instant};

/// Runs `f` with `BLUEFLAME_VERBS_API=value` (the rxe stage runs tests one at a time).
fn with_api<T>(value: &str, f: impl FnOnce() -> T) -> T {
    std::env::set_var("BLUEFLAME_VERBS_API", value);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::env::remove_var("BLUEFLAME_VERBS_API");
    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The API a QP and a CQ created now get.
fn api_now(dev: &Device) -> (Option<VerbsApi>, Option<VerbsApi>) {
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(16).expect("cq");
    let qp = pd.create_qp(&cq, &cq, caps()).expect("qp");
    (qp.verbs_api(), cq.verbs_api())
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn both_apis_agree_with_the_software_nic() {
    let Some(dev) = device::under_test() else {
        return device::skipped("both_apis_agree_with_the_software_nic");
    };
    let sim = run_all(&Device::sim());
    // rxe (rdma-core 44) has both extended APIs: `auto` takes them.
    let auto = Some(VerbsApi::Extended);
    assert_eq!(api_now(&dev), (auto, auto), "{}", dev);
    for (value, api) in [
        ("legacy", VerbsApi::Legacy),
        ("extended", VerbsApi::Extended),
    ] {
        with_api(value, || {
            assert_eq!(api_now(&dev), (Some(api), Some(api)), "{value}");
            let mut hw = run_all(&dev);
            normalize_rxe(&dev, &mut hw);
            let d = diff("software NIC (direct)", &sim, value, &hw);
            assert!(d.is_empty(), "BLUEFLAME_VERBS_API={value}: differs:\n{d}");
            check(&hw);
            println!("{} scenarios identical with the {api} API", hw.len());
        });
    }
    // A value that names no API is refused when the QP or CQ is created.
    with_api("fast", || {
        assert!(matches!(
            dev.create_cq(16),
            Err(Error::Environment { var: "BLUEFLAME_VERBS_API", ref value }) if &**value == "fast"
        ));
    });
}

/// Requests refused before posting (nothing reaches rdma-core, the QP stays usable) and a
/// full queue of unsignaled writes with moderation, then a batch, on one API.
fn refusals_and_moderation(dev: &Device, api: VerbsApi) {
    let p = Pair::new(dev, RIGHTS, caps(), &Timing::default());
    let Pair {
        mut a,
        mut cq_a,
        mr_a,
        mr_b,
        ..
    } = p;
    assert_eq!(a.verbs_api(), Some(api));
    let remote = mr_b.remote(0).expect("remote");
    // Sizes above what any device gives for these caps (rxe may round its limits up).
    let long = [7u8; 4096];
    assert!(matches!(
        a.write_inline(&long, remote, 1, PostFlags::SIGNALED),
        Err(Error::InlineTooLong { len: 4096, max }) if max >= 64
    ));
    let sges = vec![mr_a.sge(0, 8).expect("sge"); 64];
    assert!(matches!(
        a.write(&sges, remote, 2, PostFlags::SIGNALED),
        Err(Error::TooManySge { n: 64, max }) if max >= 4
    ));
    // A batch dropped unrung posts nothing (the extended API's wr_start is never called).
    {
        let mut b = a.batch();
        b.push(
            &Request::Write {
                remote,
                data: Payload::Inline(b"dropped"),
            },
            3,
            PostFlags::SIGNALED,
        )
        .expect("push");
    }
    // Many unsignaled writes (moderation signals one in half a queue, hidden), then one
    // signaled batch of three: exactly one completion per signaled request, in order.
    let depth = a.send_depth() as usize;
    let mut out = vec![Completion::default(); 64];
    let start = Instant::now();
    let mut seen = Vec::new();
    // Twice: half a queue of unsignaled writes, then a batch whose first request is the one
    // moderation signals, dropped after its second push is refused. The rewind gives the
    // moderation back, so a hidden signaled request still comes and retires the unsignaled
    // ones. Before, the counter stayed reset by the rewound request: after two rounds a full
    // queue of unsignaled writes with none signaled, QueueFull for good (the waits below
    // report it as stuck; an even or odd depth fails in the first or second wait).
    for round in 0..2 {
        for i in 0..depth / 2 {
            loop {
                match a.write_inline(&[i as u8], remote, 90, PostFlags::UNSIGNALED) {
                    Ok(()) => break,
                    Err(Error::QueueFull { .. }) | Err(Error::CqFull { .. }) => {
                        assert!(start.elapsed() < Duration::from_secs(20), "stuck ({round})");
                        let n = cq_a.poll(&mut out);
                        seen.extend_from_slice(&out[..n]);
                    }
                    Err(e) => panic!("{api}: write {i}: {e}"),
                }
            }
        }
        while a.free_send() == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{api}: round {round}: a full queue and no signaled request"
            );
            let n = cq_a.poll(&mut out);
            seen.extend_from_slice(&out[..n]);
        }
        let mut b = a.batch();
        b.push(
            &Request::Write {
                remote,
                data: Payload::Inline(b"forced"),
            },
            91,
            PostFlags::UNSIGNALED,
        )
        .expect("push");
        // Refused (too long, or no room left behind the first): nothing of it is queued.
        let refused = b.push(
            &Request::Write {
                remote,
                data: Payload::Inline(&long),
            },
            92,
            PostFlags::UNSIGNALED,
        );
        assert!(
            matches!(
                refused,
                Err(Error::InlineTooLong { .. }) | Err(Error::QueueFull { .. })
            ),
            "{refused:?}"
        );
    }
    for i in 0..4 * depth {
        loop {
            match a.write_inline(&[i as u8], remote, 100, PostFlags::UNSIGNALED) {
                Ok(()) => break,
                Err(Error::QueueFull { .. }) | Err(Error::CqFull { .. }) => {
                    assert!(start.elapsed() < Duration::from_secs(20), "stuck at {i}");
                    let n = cq_a.poll(&mut out);
                    seen.extend_from_slice(&out[..n]);
                }
                Err(e) => panic!("{api}: write {i}: {e}"),
            }
        }
    }
    let mut b = a.batch();
    for k in 0..3u64 {
        b.push(
            &Request::Write {
                remote: mr_b.remote(8 + k as usize).expect("remote"),
                data: Payload::Inline(&[0xa0 + k as u8]),
            },
            200 + k,
            PostFlags::SIGNALED,
        )
        .expect("push");
    }
    b.ring().expect("ring");
    while seen.len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(20), "{api}: {seen:?}");
        let n = cq_a.poll(&mut out);
        seen.extend_from_slice(&out[..n]);
    }
    let cookies: Vec<u64> = seen.iter().map(|c| c.cookie).collect();
    assert_eq!(cookies, [200, 201, 202], "{api}: {seen:?}");
    assert!(seen
        .iter()
        .all(|c| c.is_ok() && c.opcode == WcOpcode::RdmaWrite && c.qpn == a.qpn()));
    assert_eq!(Pair::bytes(&mr_b, 8, 3), [0xa0, 0xa1, 0xa2]);
}

#[test]
#[ignore = "needs an RDMA device: run by the rxe stage of `cargo xtask test`"]
fn refusals_and_moderation_on_both_apis() {
    let Some(dev) = device::under_test() else {
        return device::skipped("refusals_and_moderation_on_both_apis");
    };
    with_api("legacy", || refusals_and_moderation(&dev, VerbsApi::Legacy));
    with_api("extended", || {
        refusals_and_moderation(&dev, VerbsApi::Extended)
    });
}

/// On the software NIC (direct path) neither API applies.
#[test]
fn the_direct_path_has_no_verbs_api() {
    assert_eq!(api_now(&Device::sim()), (None, None));
}
