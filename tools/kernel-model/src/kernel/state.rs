//! The model's state: one NIC and the open files, behind one lock; the thread that takes
//! the NIC's asynchronous events to the files' event descriptors.

use super::objects::{File, Obj};
use crate::abi;
use crate::events::{self, Subject};
use libc::c_int;
use mlx5::sim::Nic;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The model: one NIC, the open files.
pub(super) struct Kernel {
    pub(super) nic: Nic,
    pub(super) files: HashMap<c_int, File>,
}

/// The model, locked (made on first use: its NIC started, the event thread running).
pub(super) fn kernel() -> MutexGuard<'static, Kernel> {
    static K: OnceLock<Mutex<Kernel>> = OnceLock::new();
    K.get_or_init(|| {
        let nic = Nic::new();
        // The GID the shared sysfs tree gives (the LID, from QUERY_PORT, is the NIC's own).
        nic.set_port_gid(crate::sysfs::PORT_GID);
        nic.start();
        let events = nic.clone();
        std::thread::Builder::new()
            .name("kernel-model events".into())
            .spawn(move || forward_events(&events))
            .expect("the event thread");
        Mutex::new(Kernel {
            nic,
            files: HashMap::new(),
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

/// The device's event queue read as `mlx5_ib_event` / `mlx5_ib_qp_event` do: each event
/// goes to the asynchronous event file of the context owning its object, naming the user's
/// handle (`ib_uverbs_async_handler`).
fn forward_events(nic: &Nic) {
    use mlx5::sim::AsyncEvent as E;
    loop {
        std::thread::sleep(std::time::Duration::from_micros(500));
        while let Some(e) = nic.take_async_event() {
            if crate::cmd::trace() {
                eprintln!("kernel-model: async event {e:?}");
            }
            // enum ib_event_type
            let (subject, kind) = match e {
                E::CqError { cqn } => (Subject::Cq(cqn), 0),
                E::QpFatal { qpn } => (Subject::Qp(qpn), 1),
                E::QpAccessError { qpn } => (Subject::Qp(qpn), 3),
                E::DeviceFatal => (Subject::Device, 8),
                E::PortActive { .. } => (Subject::Device, 9),
                E::PortError { .. } => (Subject::Device, 10),
                E::SrqError { srqn } => (Subject::Srq(srqn), 14),
                E::SrqLimitReached { srqn } => (Subject::Srq(srqn), 15),
                E::QpLastWqeReached { qpn } => (Subject::Qp(qpn), 16),
                _ => continue,
            };
            let k = kernel();
            for f in k.files.values() {
                let Some(fd) = f.async_fd else { continue };
                let element = match subject {
                    Subject::Device => Some(1),
                    Subject::Cq(n) => f.objs.values().find_map(|o| match o {
                        Obj::Cq(q) if q.cqn == n => Some(q.user),
                        _ => None,
                    }),
                    Subject::Qp(n) => f.objs.values().find_map(|o| match o {
                        Obj::Qp(q) if q.qpn == n => Some(q.user),
                        _ => None,
                    }),
                    Subject::Srq(n) => f.objs.values().find_map(|o| match o {
                        Obj::Srq(q) if q.srqn == n => Some(q.user),
                        _ => None,
                    }),
                };
                if let Some(element) = element {
                    let desc = abi::ib_uverbs_async_event_desc {
                        element,
                        event_type: kind,
                        reserved: 0,
                    };
                    // SAFETY: a plain ABI struct.
                    events::push(fd, subject, unsafe { crate::cmd::bytes(&desc) });
                }
            }
        }
    }
}
