//! The provider stage: the direct data path over rdma-core's own provider. Run in a process
//! that preloads the kernel model (`LD_PRELOAD=libkernel_model.so`, `cargo xtask provider`):
//! unmodified libibverbs and libmlx5 see a ConnectX-6 named `mlx5_0`, create every object
//! through the kernel's write ABI, and the crate takes them over with `mlx5dv_init_obj`, as
//! on a ConnectX.
//!
//! The cases: every scenario (`tests/scenarios`), run there and on the software NIC's own
//! creation path, must agree completion for completion and byte for byte, and so must the
//! same scenarios between a crate QP and a QP driven by rdma-core's own post and poll
//! (`ibv_post_send`, `ibv_poll_cq`) over the same device, both ways round; the
//! specifications' promises (`tests/spec`), completion events (`tests/events_cases`: arms
//! through the provider's UAR page, events from its completion channel) and user memory
//! (`tests/memory_cases`) as on any device; and what only this mode can see (`checks.rs`):
//! the kernel's decisions from the flags the crate gives rdma-core. The specifications'
//! promises run a second time on the verbs path (`BLUEFLAME_PATH=verbs`), whose posts and
//! polls go through libmlx5's own.
//!
//! A plain `cargo test` (no preload) finds no `mlx5_0`: the binary says so and passes.

#[path = "../events_cases/mod.rs"]
mod events_cases;
#[path = "../memory_cases/mod.rs"]
mod memory_cases;
#[path = "../scenarios/mod.rs"]
mod scenarios;
#[path = "../spec/mod.rs"]
mod spec;

mod checks;
mod cqe;
mod dc;
mod model;

use blueflame::{DataPath, Device};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// One case: its name and what it runs (a failure panics or says why).
type Case = (String, Box<dyn Fn(&Device) -> Result<(), String>>);

/// A comparison's verdict: its diff, empty when the two runs agree.
fn agree(diff: String) -> Result<(), String> {
    if diff.is_empty() {
        Ok(())
    } else {
        Err(diff)
    }
}

/// A case that fails by panicking.
fn case(name: &str, f: impl Fn(&Device) + 'static) -> Case {
    (
        name.to_string(),
        Box::new(move |d| {
            f(d);
            Ok(())
        }),
    )
}

fn cases() -> Vec<Case> {
    let mut all: Vec<Case> = vec![(
        "production_route".into(),
        Box::new(|dev| {
            if dev.data_path() == DataPath::Direct {
                Ok(())
            } else {
                Err(format!(
                    "{dev} runs {:?}, not the direct path",
                    dev.data_path()
                ))
            }
        }),
    )];
    for &(name, scenario) in scenarios::ALL {
        all.push((
            format!("scenario::{name}"),
            Box::new(move |dev| {
                let here = scenario(dev);
                let sim = scenario(&Device::sim());
                agree(scenarios::diff("mlx5_0", &[here], "sim", &[sim]))
            }),
        ));
    }
    // The same scenarios between the two data paths over one device: side A on the direct
    // path and side B on rdma-core's own `ibv_post_send` / `ibv_post_recv` /
    // `ibv_poll_cq` (libmlx5 writing its WQEs and parsing the CQEs the software NIC wrote),
    // then the other way round; each must agree with the software NIC's own run.
    for &(name, scenario) in scenarios::ALL {
        for (label, direct_first) in [("direct_to_verbs", true), ("verbs_to_direct", false)] {
            all.push((
                format!("{label}::{name}"),
                Box::new(move |dev| {
                    let verbs = verbs_device()?;
                    let here = if direct_first {
                        scenarios::with_peer(verbs, || scenario(dev))
                    } else {
                        scenarios::with_peer(dev, || scenario(verbs))
                    };
                    let sim = scenario(&Device::sim());
                    agree(scenarios::diff(label, &[here], "sim", &[sim]))
                }),
            ));
        }
    }
    // UD and multicast: the same scenarios, against the software NIC's own run.
    for &(name, scenario) in scenarios::ud::ALL {
        all.push((
            format!("ud::{name}"),
            Box::new(move |dev| {
                let here = scenario(dev);
                let sim = scenario(&Device::sim());
                agree(scenarios::ud::diff("mlx5_0", &[here], "sim", &[sim]))
            }),
        ));
    }
    // The UD scenarios on the verbs path over libmlx5 (`VerbsUdSendQueue`, `ibv_wr_set_ud_addr`
    // / `wr.ud`, UD receives), against the software NIC's own run.
    for &(name, scenario) in scenarios::ud::ALL {
        all.push((
            format!("verbs_ud::{name}"),
            Box::new(move |_dev| {
                let here = scenario(verbs_device()?);
                let sim = scenario(&Device::sim());
                agree(scenarios::ud::diff("verbs", &[here], "sim", &[sim]))
            }),
        ));
    }
    for &(name, check) in spec::ALL {
        all.push(case(&format!("spec::{name}"), check));
    }
    // The same promises on the verbs path over libmlx5 (a type-1 unbind there once handed
    // `mlx5_bind_mw` a bare `ibv_mr`, whose `verbs_mr` fields it read from past its end).
    for &(name, check) in spec::ALL {
        all.push((
            format!("verbs_spec::{name}"),
            Box::new(move |_dev| {
                check(verbs_device()?);
                Ok(())
            }),
        ));
    }
    use events_cases as e;
    all.extend([
        case("events::solicited_filtering", e::solicited_filtering),
        case("events::timeouts", e::timeouts),
        case(
            "events::many_cqs_on_one_channel",
            e::many_cqs_on_one_channel,
        ),
        case("events::flush_wakes_the_waiter", e::flush_wakes_the_waiter),
        case("events::completions_race_the_arm", |d| {
            e::completions_race_the_arm(d, 300)
        }),
        case("events::drop_after_events", e::drop_after_events),
    ]);
    use memory_cases as m;
    all.extend([
        case("memory::owned_forms", m::owned_forms_serve_every_operation),
        case(
            "memory::writes_in_place",
            m::the_device_writes_the_users_buffer_in_place,
        ),
        case(
            "memory::buffers_outlive_requests",
            m::buffers_outlive_requests_in_flight,
        ),
        case(
            "memory::read_only_refuses_write_rights",
            m::read_only_memory_refuses_write_rights,
        ),
        case(
            "memory::into_buffer_checks_the_type",
            m::into_buffer_checks_the_type,
        ),
        case(
            "memory::vec_registers_its_length",
            m::a_vec_registers_its_length_only,
        ),
        case("memory::raw_registration", m::raw_registration),
        case("memory::mapped_files", |d| {
            let (_fd, path) = m::memfd_file();
            m::mapped_files(d, &path)
        }),
        case("memory::huge_pages", m::huge_pages_or_the_sysctl),
        case("memory::on_demand_paging", m::on_demand_paging),
        case("memory::dma_buf_refused", m::dma_buf),
    ]);
    all.extend(checks::all());
    all.extend(cqe::all());
    all
}

/// The GID index the devices are opened with: the software NIC's endpoints always carry
/// the port's GID (its address handles are global), as an InfiniBand device opened with
/// GID index 0; with none, rdma-core's would be LID-only and UD receives would come
/// without a GRH.
const GID_INDEX: Option<i32> = Some(0);

/// `mlx5_0` again, on the verbs path (`BLUEFLAME_PATH=verbs` while it opens): its QPs post
/// and poll through rdma-core's own libmlx5.
pub(crate) fn verbs_device() -> Result<&'static Device, String> {
    static VERBS: OnceLock<Result<Device, String>> = OnceLock::new();
    VERBS
        .get_or_init(|| {
            std::env::set_var("BLUEFLAME_PATH", "verbs");
            let d = Device::open("mlx5_0", GID_INDEX).map_err(|e| e.to_string());
            std::env::remove_var("BLUEFLAME_PATH");
            let d = d?;
            if d.data_path() != DataPath::Verbs {
                return Err(format!(
                    "{d} runs {:?} with BLUEFLAME_PATH=verbs",
                    d.data_path()
                ));
            }
            Ok(d)
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn main() {
    let dev = match Device::open("mlx5_0", GID_INDEX) {
        Ok(d) => d,
        Err(e) => {
            println!("provider stage: skipped: no mlx5_0 ({e}); run `cargo xtask provider`");
            return;
        }
    };
    println!("device: {dev}");
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, f) in cases() {
        if !filter.is_empty() && !filter.iter().any(|p| name.contains(p.as_str())) {
            continue;
        }
        match catch_unwind(AssertUnwindSafe(|| f(&dev))) {
            Ok(Ok(())) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Ok(Err(why)) => {
                println!("test {name} ... FAILED\n{why}");
                failed.push(name);
            }
            Err(_) => {
                println!("test {name} ... FAILED (panicked)");
                failed.push(name);
            }
        }
    }
    println!(
        "provider stage: {passed} passed, {} failed{}",
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        }
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
