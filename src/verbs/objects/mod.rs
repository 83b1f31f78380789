//! The rdma-core objects of the verbs backend, one file each: protection domain (`pd`),
//! memory region (`mr`), CQ (`cq`), thread domain (`td`), QP (`qp`, RC and UD, with what it
//! is created and connected with: `attrs`), SRQ (`srq`), address handle (`ah`). Each is
//! freed on drop after everything that depends on it (reference counts).

mod ah;
mod attrs;
mod cq;
mod mr;
mod pd;
mod qp;
mod srq;
mod td;

pub use ah::{attr_of, Ah};
pub use attrs::{Caps, ConnLimits, Endpoint, Timing};
pub use cq::Cq;
pub use mr::Mr;
#[cfg(feature = "internals")]
pub use mr::IBV_ADVISE_MR_FLAG_FLUSH;
pub use pd::Pd;
pub(crate) use qp::Creator;
pub use qp::Qp;
pub use srq::Srq;
pub(crate) use td::{qp_pd, thread_domain, ThreadDomain};
