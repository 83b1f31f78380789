//! Why the software NIC refused a control operation ([`SimError`]).

use super::qp_attr::QpState;
use crate::request::Access;

/// Why the software NIC refused a control operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimError {
    /// No protection domain with this number.
    NoPd(u32),
    /// No CQ with this number.
    NoCq(u32),
    /// No QP with this number.
    NoQp(u32),
    /// No SRQ with this number.
    NoSrq(u32),
    /// No region with this key.
    NoMr(u32),
    /// No memory window with this key.
    NoMw(u32),
    /// A CQ size that is not a power of two of 64- or 128-byte entries.
    CqSize {
        /// Entries asked for.
        cqe_cnt: u32,
        /// Entry size asked for.
        cqe_size: u32,
    },
    /// QP limits out of range (BlueFlame size not a multiple of 64, more than 16 blocks of
    /// WQE, ...).
    Caps(&'static str),
    /// One value past what the NIC takes: which one, with its range, and the value given.
    Limit {
        /// The field and what it may be (`"sq_blocks (16 ..= 32768)"`).
        what: &'static str,
        /// The value given.
        value: u64,
    },
    /// A zero-length region or a null address.
    BadRegion,
    /// The object is still in use (a QP on a CQ, windows bound to a region).
    Busy,
    /// Every number of this kind is in use (24-bit key indices, QP or CQ numbers, or the
    /// smaller limits of [`Nic::with_limits`](super::Nic::with_limits)).
    Exhausted(&'static str),
    /// The NIC could not allocate memory of this many bytes.
    NoMemory(u64),
    /// Region rights the hardware refuses ([`Access::region_error`] says why).
    Rights(Access),
    /// No thread domain with this number.
    NoTd(u32),
    /// A compressing CQ the NIC cannot create (rdma-core's `mlx5dv_create_cq` fails with
    /// `EINVAL`): the format is not among the supported ones, `max_num` is 0, or the entries
    /// are 128 bytes and the NIC compresses only 64-byte ones.
    CqeCompression {
        /// The mini-CQE format asked for.
        format: crate::cqe::MiniCqeFormat,
        /// The entry size asked for.
        cqe_size: u32,
        /// What the NIC supports.
        caps: crate::cqe::CqeCompCaps,
    },
    /// Every register for thread domains is taken (`ibv_alloc_td` fails: `ENOMEM`).
    NoRegister,
    /// The NIC's [`MemoryCaps`](super::MemoryCaps) lack what the registration asks for
    /// (on-demand paging).
    NoCapability(&'static str),
    /// A prefetch (`ibv_advise_mr`) of a range the kernel refuses (`ENOENT`, as
    /// `get_prefetchable_mr`): no region with this key in the domain, a region that is not
    /// on-demand, a write prefetch of a region without local write, or a range outside it.
    Prefetch(u32),
    /// A QP in a state that does not allow the transition (connecting a QP that is
    /// connected to another one or in error: verbs requires RESET first).
    QpState {
        /// The QP.
        qpn: u32,
        /// Its state.
        state: QpState,
    },
    /// An operation that does not apply to this QP's DC role (connecting a DCI or DCT to a
    /// peer, a DCI operation on another QP, ...).
    Dc {
        /// The QP.
        qpn: u32,
        /// What was wrong.
        why: &'static str,
    },
    /// A multicast attach or detach the device refuses (`EINVAL`): why.
    Mcast(&'static str),
    /// A dma-buf export or registration the exporter or the kernel refuses (`EINVAL`).
    DmaBuf {
        /// The export's handle.
        handle: u64,
        /// What was wrong.
        why: &'static str,
    },
}

impl core::fmt::Display for SimError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SimError::NoPd(v) => write!(f, "no protection domain {v}"),
            SimError::NoCq(v) => write!(f, "no CQ {v:#x}"),
            SimError::NoQp(v) => write!(f, "no QP {v:#x}"),
            SimError::NoSrq(v) => write!(f, "no SRQ {v:#x}"),
            SimError::NoMr(v) => write!(f, "no memory region with key {v:#x}"),
            SimError::NoMw(v) => write!(f, "no memory window with rkey {v:#x}"),
            SimError::CqSize { cqe_cnt, cqe_size } => {
                write!(
                    f,
                    "CQ of {cqe_cnt} entries of {cqe_size} bytes: need a power of two of 64 or 128"
                )
            }
            SimError::Caps(why) => write!(f, "QP capabilities: {why}"),
            SimError::Limit { what, value } => write!(f, "{what}: {value} is out of range"),
            SimError::BadRegion => f.write_str("memory region of zero length or at a null address"),
            SimError::Busy => f.write_str("object still in use"),
            SimError::Exhausted(what) => write!(f, "every {what} is in use"),
            SimError::NoMemory(len) => write!(f, "cannot allocate {len} bytes"),
            SimError::NoCapability(what) => write!(f, "the NIC does not do {what}"),
            SimError::Prefetch(lkey) => write!(
                f,
                "prefetch refused for region {lkey:#x} (not on-demand, not writable, or out of range)"
            ),
            SimError::QpState { qpn, state } => {
                write!(f, "QP {qpn:#x} is {state:?}: it connects only from INIT")
            }
            SimError::Rights(a) => write!(
                f,
                "region rights {a}: {}",
                a.region_error().unwrap_or("refused")
            ),
            SimError::NoTd(v) => write!(f, "no thread domain {v}"),
            SimError::Dc { qpn, why } => write!(f, "QP {qpn:#x}: {why}"),
            SimError::CqeCompression {
                format,
                cqe_size,
                caps,
            } => write!(
                f,
                "CQE compression with {format} on {cqe_size}-byte CQEs: the NIC supports \
                 formats {:#x}, sessions of up to {}, 128-byte CQEs {}",
                caps.supported_format,
                caps.max_num,
                if caps.cqe_128 { "yes" } else { "no" }
            ),
            SimError::NoRegister => f.write_str("no BlueFlame register left for a thread domain"),
            SimError::Mcast(why) => write!(f, "multicast: {why}"),
            SimError::DmaBuf { handle, why } => write!(f, "dma-buf {handle:#x}: {why}"),
        }
    }
}

impl std::error::Error for SimError {}
