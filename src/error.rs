//! Errors: one variant per failure, each with the offending value.

use core::fmt;

/// Why a call failed. Nothing was posted: the queue is as it was before the call.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Insufficient resources: the send or receive queue has no room for the request until
    /// earlier work completes (poll the CQ).
    QueueFull {
        /// What the request needs, in `unit`s.
        needed: u32,
        /// What is free now, in `unit`s.
        free: u32,
        /// What the two numbers count.
        unit: QueueUnit,
    },
    /// The CQ the queue completes on could overflow: every outstanding request (signaled or
    /// not: after an error each one completes with its own flush entry) and every posted
    /// receive holds one CQ entry (a direct-path send one per 64-byte block) until its
    /// completion is polled. Nothing was posted: poll the CQ, or make it larger (see the
    /// guide, "Sizing queues and CQs").
    CqFull {
        /// The CQ number ([`Cq::cqn`](crate::Cq::cqn): on the verbs path the crate's own).
        cqn: u32,
        /// Entries the request needs (1; a direct-path send one per block).
        needed: u32,
        /// Entries the queue could get: none of the CQ's are free, the rest are held by
        /// outstanding requests (this queue's and others') and other queues' allowances
        /// (an idle queue keeps its last one: see the guide, "Sizing queues and CQs").
        available: u32,
        /// Entries of the CQ, shared by every queue that completes on it.
        capacity: u32,
    },
    /// The device reported an asynchronous event about this QP, its CQ, its port or the
    /// device (`ibv_get_async_event`): a CQ in error writes no more completions, a QP in
    /// error flushes its work, a port down or a failed device runs nothing. Recreate the CQ
    /// and its QPs (or the device).
    AsyncEvent(crate::async_event::AsyncEvent),
    /// More scatter/gather entries than the QP was created for.
    TooManySge {
        /// Entries given.
        n: usize,
        /// The QP's limit.
        max: usize,
    },
    /// More inline bytes than the QP was created for.
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// The QP's limit.
        max: usize,
    },
    /// The WQE would exceed the hardware's 16-block / 63-DS limit.
    WqeTooLarge {
        /// DS units needed.
        ds: usize,
    },
    /// An atomic's remote address is not aligned to its operand size.
    Misaligned {
        /// The address.
        addr: u64,
        /// The required alignment.
        align: u32,
    },
    /// An atomic's local entry is not exactly the operand's size (8 bytes; 4 for a 32-bit
    /// masked atomic): the device writes the whole old value there.
    AtomicLength {
        /// The local entry's length.
        len: u32,
        /// The operand size.
        size: u32,
    },
    /// Invalid handle: an object that does not belong with the others (another protection
    /// domain or device).
    InvalidHandle {
        /// Which object.
        what: &'static str,
        /// Its key or number.
        value: u64,
    },
    /// The CQ was created without a completion channel ([`CqOptions::channel`]): it cannot
    /// be armed or waited on.
    ///
    /// [`CqOptions::channel`]: crate::CqOptions::channel
    NoChannel {
        /// The CQ.
        cqn: u32,
    },
    /// The completion channel is taken by the `AsyncCq` (feature `tokio`) of CQ `cqn`, which
    /// reads every event of the channel: no other CQ may be created on it while that lives
    /// (the stream would take that CQ's events, and its waiter would never wake).
    ChannelTaken {
        /// The CQ whose `AsyncCq` holds the channel.
        cqn: u32,
    },
    /// Invalid state: the QP is not connected yet.
    InvalidState {
        /// What state it is in.
        state: &'static str,
    },
    /// Length error: the remote buffer is shorter than the data.
    LengthError {
        /// Bytes to move.
        needed: u64,
        /// Bytes the remote buffer has from the given offset.
        available: u64,
    },
    /// A UD send longer than the path MTU: a datagram is one packet (refused before
    /// posting; perftest's `-c UD` caps its size at the MTU the same way).
    MessageTooLong {
        /// Bytes of the message.
        len: u64,
        /// The path MTU in bytes.
        mtu: u32,
    },
    /// Protection violation: a local segment whose region is in another protection domain.
    Protection {
        /// The region's lkey.
        lkey: u32,
    },
    /// No rdma-core device has this name ([`crate::Device::open`], `BLUEFLAME_DEVICE`).
    NoDevice {
        /// The name asked for.
        name: Box<str>,
        /// The devices rdma-core sees (none: no RDMA device, or no kernel RDMA support).
        present: Box<[String]>,
    },
    /// An environment variable of the crate's (`BLUEFLAME_PATH`, `BLUEFLAME_GID_INDEX`,
    /// `BLUEFLAME_VERBS_API`)
    /// holds a value it does not take; the message says what it takes.
    Environment {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: Box<str>,
    },
    /// An invalid parameter (named) with its value.
    InvalidParameter {
        /// Which parameter.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// Privileges violation: the rights asked for are not a subset of what is allowed (a
    /// window's rights against its region's, or a region without the bind right).
    Privileges {
        /// Rights asked for.
        requested: mlx5::request::Access,
        /// Rights the region allows (and whether it has the bind right).
        allowed: mlx5::request::Access,
    },
    /// A memory-window bind larger than one KLM describes (2 GiB).
    BindTooLong {
        /// Requested length.
        len: u64,
    },
    /// A memory-window bind or unbind the window's state does not allow (refused before
    /// posting, where the NIC would fail it and move the QP to error): a type-2 window that
    /// is bound (unbind it first), not bound, bound through another QP, or whose previous
    /// bind is still in flight on another QP.
    WindowState {
        /// The window's current rkey.
        rkey: u32,
        /// What stands in the way.
        state: &'static str,
    },
    /// Region rights that verbs refuses (`ibv_reg_mr` fails with `EINVAL`).
    RegionRights {
        /// The rights asked for.
        access: mlx5::request::Access,
        /// What is wrong with them.
        why: &'static str,
    },
    /// A CQ size the device does not take (as asked, before rounding).
    CqSize {
        /// Entries asked for.
        entries: u32,
        /// The most entries this device's CQs have (the least is 1).
        max: u32,
    },
    /// A BlueFlame register claimed as a queue's own is rung by another queue, a queue
    /// asks for its own a register another queue rings, or a queue's register overlaps one
    /// another queue rings with halves of another size (rdma-core never hands out registers
    /// so: see [`crate::DoorbellMode`]).
    RegisterInUse {
        /// The register's address.
        addr: u64,
    },
    /// A CQ that compresses its entries with this mini-CQE format cannot be created here:
    /// `caps` is what the device reports (`mlx5dv_query_device`'s `cqe_comp_caps`; rdma-core
    /// refuses unless `max_num` is not 0 and the format bit is supported, and 128-byte CQEs
    /// need `MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP`), or None where nothing can decode
    /// compressed entries (a device that is not mlx5, or the verbs path: rdma-core's
    /// `ibv_poll_cq` does not).
    CqeCompression {
        /// The format asked for.
        format: mlx5::MiniCqeFormat,
        /// The entry size asked for.
        cqe_size: u32,
        /// What the device supports (None: no compression on this device or path).
        caps: Option<mlx5::CqeCompCaps>,
    },
    /// A UD QP's receives on a CQ that compresses its entries. A ConnectX's mini-CQE carries
    /// only the byte count and a hash or checksum (`mlx5_mini_cqe8`); the source QP, the GRH
    /// flag and the immediate of every receive of a session are read from its title entry
    /// (rdma-core `cq.c`, UCX `uct_ib_mlx5_iface_cqe_unzip`), so the datagrams of several
    /// senders would all report the first one's. The kernel turns compression off for its
    /// own UD user (IPoIB). Create the receive CQ without
    /// [`CqOptions::compression`](crate::CqOptions::compression) (its send CQ may compress).
    CompressedUdReceives {
        /// The compressing CQ.
        cqn: u32,
    },
    /// Completion timestamps ([`CqOptions::timestamps`](crate::CqOptions::timestamps),
    /// [`Cq::poll_timed`](crate::Cq::poll_timed), [`Device::clock`](crate::Device::clock))
    /// where they cannot be had: `why` says which rule refused them (a device without a
    /// completion clock, such as rxe; CQE compression, whose mini-CQEs carry no timestamp;
    /// `ibv_poll_cq`, which reads none; a CQ created without them).
    Timestamps {
        /// What refused them.
        why: &'static str,
    },
    /// The QP takes its receives from a shared receive queue: post them to the
    /// [`Srq`](crate::Srq) (`Qp::post_recv` on such a QP).
    SrqQp {
        /// The QP.
        qpn: u32,
        /// Its SRQ.
        srqn: u32,
    },
    /// A receiver of an SRQ (a QP or DCT) must complete its receives on the CQ the SRQ was
    /// created with ([`Pd::create_srq`](crate::Pd::create_srq)): its receives are charged
    /// to that CQ.
    SrqCq {
        /// The SRQ.
        srqn: u32,
        /// The SRQ's CQ.
        srq_cq: u32,
        /// The CQ given.
        cq: u32,
    },
    /// The operation is not supported on this device or path.
    Unsupported(&'static str),
    /// The device has no dynamically connected transport (DC: DCIs and DCTs are an mlx5
    /// capability; rxe, siw and the other verbs devices have none).
    NoDc {
        /// The device (`Device::describe`).
        device: String,
        /// What is missing, or what the device answered.
        why: &'static str,
    },
    /// The device lacks a memory capability (on-demand paging, implicit on-demand paging,
    /// dma-buf), as its attributes say (`ibv_query_device_ex` `odp_caps`; the software NIC's
    /// `mlx5::sim::MemoryCaps`) or as rdma-core answered (`EOPNOTSUPP`).
    Capability(crate::error::Capability),
    /// Read-only memory (`&'static [u8]`, a read-only file mapping, a read-only
    /// [`RawBuffer`](crate::RawBuffer)) with rights that let the device write it, or a CPU
    /// write into it ([`MemoryRegion::write`](crate::MemoryRegion::write)).
    ReadOnlyBuffer {
        /// The rights asked for (or the region's, for a CPU write).
        access: mlx5::request::Access,
    },
    /// The region does not hold a buffer of the type asked for
    /// ([`MemoryRegion::into_buffer`](crate::MemoryRegion::into_buffer)).
    BufferType {
        /// The type asked for.
        wanted: &'static str,
        /// What the region holds (`"memory of Pd::alloc_mr"` when it allocated its own).
        holds: &'static str,
    },
    /// The region's bytes have no CPU mapping (a dma-buf region): `read`/`write` cannot
    /// reach them.
    NoCpuMapping,
    /// No huge pages of this size are free: the system has none reserved (or too few).
    NoHugePages {
        /// Page size asked for, in bytes.
        page_size: u64,
        /// Bytes asked for (rounded up to the page size).
        len: u64,
        /// Where to reserve them (as root), e.g. `vm.nr_hugepages` for 2 MiB pages.
        sysctl: &'static str,
    },
    /// An error of the operating system: a socket of the out-of-band exchange
    /// ([`crate::connect`]), a memory mapping ([`crate::mapping`]), a completion channel's
    /// or an async CQ's file descriptor.
    Io(std::io::Error),
    /// An rdma-core call failed.
    Verbs(VerbsError),
    /// The software NIC refused a control operation.
    #[cfg(feature = "sim")]
    Sim(mlx5::sim::SimError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::QueueFull { needed, free, unit } => {
                let hint = match unit {
                    QueueUnit::VerbsBatch => "ring the batch, then push the rest in another",
                    _ => "poll the CQ",
                };
                write!(
                    f,
                    "queue full: the request needs {needed} {unit}, {free} free ({hint})"
                )
            }
            Error::CqFull {
                cqn,
                needed,
                available,
                capacity,
            } => write!(
                f,
                "CQ {cqn:#x} could overflow: the request needs {needed} entries, {available} of its \
                 {capacity} are available (the others are held by outstanding requests; poll the \
                 CQ, or make it larger)"
            ),
            Error::TooManySge { n, max } => {
                write!(f, "{n} scatter/gather entries, the QP takes at most {max}")
            }
            Error::InlineTooLong { len, max } => {
                write!(f, "{len} inline bytes, the QP takes at most {max}")
            }
            Error::WqeTooLarge { ds } => {
                write!(f, "WQE of {ds} DS exceeds the 63-DS / 16-block limit")
            }
            Error::Misaligned { addr, align } => {
                write!(
                    f,
                    "remote address {addr:#x} is not aligned to {align} bytes"
                )
            }
            Error::AtomicLength { len, size } => write!(
                f,
                "atomic local entry of {len} bytes: the old value takes exactly {size}"
            ),
            Error::NoDevice { name, present } if present.is_empty() => {
                write!(
                    f,
                    "no RDMA device named {name:?}: rdma-core sees no device (no RDMA \
                     hardware, or its kernel driver and ib_uverbs not loaded)"
                )?;
                if cfg!(feature = "sim") {
                    f.write_str("; Device::open_default() without BLUEFLAME_DEVICE runs the software NIC")?;
                }
                Ok(())
            }
            Error::NoDevice { name, present } => write!(
                f,
                "no RDMA device named {name:?}: rdma-core sees {}",
                present.join(", ")
            ),
            Error::Environment { var, value } => {
                let expected = match *var {
                    "BLUEFLAME_PATH" => "direct, verbs or auto",
                    "BLUEFLAME_GID_INDEX" => "a GID table index (0 to 65535)",
                    "BLUEFLAME_VERBS_API" => "auto, extended or legacy",
                    _ => "another value (see the crate's guide)",
                };
                write!(f, "{var}={value:?}: expected {expected}")
            }
            Error::InvalidParameter { what, value } => write!(f, "invalid {what}: {value:#x}"),
            Error::InvalidHandle { what, value } => write!(f, "invalid handle: {what} {value:#x}"),
            Error::SrqQp { qpn, srqn } => write!(
                f,
                "QP {qpn:#x} takes its receives from SRQ {srqn:#x}: post them to the SRQ"
            ),
            Error::SrqCq { srqn, srq_cq, cq } => write!(
                f,
                "SRQ {srqn:#x} completes its receives on CQ {srq_cq:#x}, not CQ {cq:#x}"
            ),
            Error::NoChannel { cqn } => write!(
                f,
                "CQ {cqn:#x} has no completion channel: create it with CqOptions::channel to arm or wait"
            ),
            Error::ChannelTaken { cqn } => write!(
                f,
                "the completion channel is taken by the AsyncCq of CQ {cqn:#x}: no other CQ may complete on it"
            ),
            Error::InvalidState { state } => write!(f, "invalid state: the QP is {state}"),
            Error::LengthError { needed, available } => {
                write!(
                    f,
                    "length error: {needed} bytes to move, the remote buffer has {available}"
                )
            }
            Error::MessageTooLong { len, mtu } => write!(
                f,
                "message too long: {len} bytes in one UD datagram, the path MTU is {mtu}"
            ),
            Error::Protection { lkey } => write!(
                f,
                "protection violation: region {lkey:#x} is in another protection domain"
            ),
            Error::BindTooLong { len } => {
                write!(f, "memory-window bind of {len} bytes exceeds 2 GiB")
            }
            Error::Privileges { requested, allowed } => write!(
                f,
                "privileges violation: rights {requested} requested, the region allows {allowed}"
            ),
            Error::WindowState { rkey, state } => {
                write!(f, "memory window {rkey:#x}: {state}")
            }
            Error::RegionRights { access, why } => {
                write!(f, "region rights {access}: {why}")
            }
            Error::CqSize { entries, max } => {
                write!(f, "a CQ of {entries} entries: this device takes 1 to {max}")
            }
            Error::RegisterInUse { addr } => write!(
                f,
                "BlueFlame register {addr:#x} is already rung by a queue that owns it, or shared, \
                 or with halves of another size"
            ),
            Error::AsyncEvent(e) => write!(f, "the device reported {e:?}"),
            Error::CqeCompression {
                format,
                cqe_size,
                caps: Some(c),
            } => write!(
                f,
                "CQE compression with {format} on {cqe_size}-byte CQEs: the device supports \
                 formats {:#x} (HASH 0x1, CSUM 0x2, CSUM_STRIDX 0x4), sessions of up to {}, \
                 128-byte CQEs {}",
                c.supported_format,
                c.max_num,
                if c.cqe_128 { "yes" } else { "no" }
            ),
            Error::CqeCompression {
                format,
                cqe_size,
                caps: None,
            } => write!(
                f,
                "CQE compression with {format} on {cqe_size}-byte CQEs: only the direct path \
                 of an mlx5 device (or the software NIC) decodes compressed CQEs"
            ),
            Error::Timestamps { why } => write!(f, "completion timestamps: {why}"),
            Error::CompressedUdReceives { cqn } => write!(
                f,
                "UD receives on CQ {cqn}, which compresses its entries: a ConnectX's mini-CQEs \
                 carry no source QP, GRH flag or immediate (create the receive CQ without \
                 compression)"
            ),
            Error::Unsupported(what) => write!(f, "not supported: {what}"),
            Error::NoDc { device, why } => {
                write!(f, "no dynamically connected transport (DC) on {device}: {why}")
            }
            Error::Capability(c) => write!(f, "the device lacks {c}"),
            Error::ReadOnlyBuffer { access } => write!(
                f,
                "read-only memory: rights {access} (or a CPU write) would write it"
            ),
            Error::BufferType { wanted, holds } => {
                write!(f, "the region holds {holds}, not {wanted}")
            }
            Error::NoCpuMapping => f.write_str("the region has no CPU mapping (dma-buf)"),
            Error::NoHugePages {
                page_size,
                len,
                sysctl,
            } => write!(
                f,
                "no free huge pages of {} KiB for {len} bytes: reserve them with {sysctl}",
                page_size / 1024
            ),
            Error::Verbs(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "operating system: {e}"),
            #[cfg(feature = "sim")]
            Error::Sim(e) => write!(f, "software NIC: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The refusal of a memory-window request ([`crate::Request::BindMw`],
    /// [`crate::Request::LocalInvalidate`]) through a generic post of one of the crate's
    /// QPs, on either data path: the typed calls check what the device would fail on (the
    /// range, the rights, the window's type and state) and keep the window's key in step
    /// with the NIC's.
    #[cold]
    #[inline(never)]
    pub(crate) fn window_request() -> Error {
        Error::Unsupported(
            "a memory-window request (Request::BindMw, Request::LocalInvalidate) through a \
             generic post (Qp::post, Batch::push, SendQueue::post / push): bind with \
             Qp::bind_mw and unbind with Qp::unbind_mw, which check the range, the rights \
             and the window's state and keep its key in step with the NIC",
        )
    }
}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Self {
        Error::Verbs(e)
    }
}

#[cfg(feature = "sim")]
impl From<mlx5::sim::SimError> for Error {
    fn from(e: mlx5::sim::SimError) -> Self {
        match e {
            mlx5::sim::SimError::CqeCompression {
                format,
                cqe_size,
                caps,
            } => Error::CqeCompression {
                format,
                cqe_size,
                caps: Some(caps),
            },
            // A value past the software NIC's range: the caller's parameter, named with it.
            mlx5::sim::SimError::Limit { what, value } => Error::InvalidParameter { what, value },
            e => Error::Sim(e),
        }
    }
}

impl From<mlx5::wqe::EncodeError> for Error {
    fn from(e: mlx5::wqe::EncodeError) -> Self {
        use mlx5::wqe::EncodeError as E;
        match e {
            E::TooManySge { n, max } => Error::TooManySge { n, max },
            E::InlineTooLong { len, max } => Error::InlineTooLong { len, max },
            E::TooLarge { ds } => Error::WqeTooLarge { ds },
            E::BindTooLong { len } => Error::BindTooLong { len },
            E::SgeTooLong { len } => Error::InvalidParameter {
                what: "scatter/gather entry length",
                value: len as u64,
            },
            E::BindKeyIndex { new_rkey, .. } => Error::InvalidParameter {
                what: "new rkey",
                value: new_rkey as u64,
            },
            _ => Error::Unsupported("request"),
        }
    }
}

/// A capability a device may lack ([`Error::Capability`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capability {
    /// On-demand paging (`IBV_ODP_SUPPORT`) for RC sends, receives, writes, reads and
    /// atomics (`rc_odp_caps`).
    OnDemandPaging,
    /// Implicit on-demand paging of the whole address space (`IBV_ODP_SUPPORT_IMPLICIT`).
    ImplicitOnDemandPaging,
    /// Prefetch of on-demand pages (`ibv_advise_mr`).
    Prefetch,
    /// Registration of a dma-buf (`ibv_reg_dmabuf_mr`).
    DmaBuf,
    /// Remote atomic rights on a DC target: a device without atomics (mlx5_ib's
    /// `mlx5_ib_modify_dct` at INIT: `get_atomic_mode` fails, EOPNOTSUPP).
    RemoteAtomics,
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Capability::OnDemandPaging => "on-demand paging for RC (IBV_ODP_SUPPORT, rc_odp_caps)",
            Capability::ImplicitOnDemandPaging => {
                "implicit on-demand paging (IBV_ODP_SUPPORT_IMPLICIT)"
            }
            Capability::Prefetch => "prefetch of on-demand pages (ibv_advise_mr)",
            Capability::DmaBuf => "dma-buf registration (ibv_reg_dmabuf_mr)",
            Capability::RemoteAtomics => {
                "atomics, for a DC target's REMOTE_ATOMIC right (get_atomic_mode)"
            }
        })
    }
}

/// A call that refused a value it took by value gives it back: `value` is what was passed
/// (a buffer to register, a region to turn back into its buffer), `error` says why.
pub struct Refused<T> {
    /// What was passed, untouched.
    pub value: T,
    /// Why it was refused.
    pub error: Error,
}

impl<T> fmt::Display for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<T> fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refused")
            .field("value", &core::any::type_name::<T>())
            .field("error", &self.error)
            .finish()
    }
}

impl<T> std::error::Error for Refused<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T> From<Refused<T>> for Error {
    fn from(r: Refused<T>) -> Error {
        r.error
    }
}

/// What [`Error::QueueFull`] counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueueUnit {
    /// 64-byte blocks of a direct-path send ring (a request takes 1 to 16).
    SendBlocks,
    /// Work requests of a verbs-path send queue.
    SendRequests,
    /// Requests of one verbs-path batch, which holds at most 64 (one `ibv_post_send` list):
    /// ring it and push the rest into another (polling frees none of them).
    VerbsBatch,
    /// Receive work requests.
    Receives,
}

impl fmt::Display for QueueUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QueueUnit::SendBlocks => "send-ring blocks",
            QueueUnit::SendRequests => "send work requests",
            QueueUnit::VerbsBatch => "requests of the verbs batch (at most 64)",
            QueueUnit::Receives => "receive work requests",
        })
    }
}

/// Results of this crate.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// An rdma-core call failed: which call, and the OS error it returned.
#[derive(Debug)]
pub struct VerbsError {
    /// The verbs function.
    pub call: &'static str,
    /// The error (`errno`).
    pub source: std::io::Error,
}

impl std::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.call, self.source)
    }
}

impl std::error::Error for VerbsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
