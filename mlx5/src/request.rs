//! One work request, as the encoder takes it and the decoder gives it back.

/// One gather or scatter entry: a buffer inside a registered region. Laid out as the
/// verbs `struct ibv_sge` (address, length, key), so a list of them can be handed to
/// rdma-core as it is.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The lkey of the region that holds the buffer.
    pub lkey: u32,
}

/// A remote buffer: address and key.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Remote {
    /// Remote virtual address (or offset, for a zero-based window).
    pub addr: u64,
    /// Remote key of a region or memory window.
    pub rkey: u32,
}

/// Where the data of a write or send comes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Payload<'a> {
    /// A gather list of registered buffers (zero-length entries are skipped, as rdma-core does).
    Sgl(&'a [Sge]),
    /// Bytes copied into the WQE itself: no registration needed.
    Inline(&'a [u8]),
}

impl Payload<'_> {
    /// Total bytes.
    #[inline]
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sgl(s) => s.iter().map(|e| e.len as u64).sum(),
            Payload::Inline(b) => b.len() as u64,
        }
    }
    /// Whether there are no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Access rights of a region or window, with the values of verbs' `IBV_ACCESS_*`.
///
/// Printed by name: `LOCAL_WRITE | REMOTE_READ`, unknown bits in hex.
/// ```
/// use mlx5::request::Access;
/// assert_eq!(format!("{}", Access::LOCAL_WRITE | Access::REMOTE_READ), "LOCAL_WRITE | REMOTE_READ");
/// assert_eq!(format!("{:?}", Access(0x81)), "Access(LOCAL_WRITE | 0x80)");
/// assert_eq!(format!("{}", Access::NONE), "NONE");
/// ```
#[derive(Copy, Clone, Default, PartialEq, Eq, Hash)]
pub struct Access(pub u32);

impl Access {
    /// Every bit this type names (the bits verbs defines up to `IBV_ACCESS_ON_DEMAND`).
    pub const ALL: Access = Access(0x7f);

    /// Why a region may not be registered with these rights, as the kernel's
    /// `ib_check_mr_access` refuses them (`EINVAL`): remote write or atomic without local
    /// write, or a bit this type does not name. `ZERO_BASED` is a window right here: regions
    /// are registered at their address (rdma-core's `ibv_reg_mr`, iova = address), so a
    /// zero-based region would give the two backends different addresses.
    pub const fn region_error(self) -> Option<&'static str> {
        if self.0 & !Access::ALL.0 != 0 {
            return Some("unknown access bits");
        }
        if self.0 & Access::ZERO_BASED.0 != 0 {
            return Some("ZERO_BASED is for windows; regions are registered at their address");
        }
        let remote = Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0;
        if self.0 & remote != 0 && self.0 & Access::LOCAL_WRITE.0 == 0 {
            return Some("remote write or atomic needs LOCAL_WRITE");
        }
        None
    }

    const NAMES: [(&'static str, u32); 7] = [
        ("LOCAL_WRITE", Access::LOCAL_WRITE.0),
        ("REMOTE_WRITE", Access::REMOTE_WRITE.0),
        ("REMOTE_READ", Access::REMOTE_READ.0),
        ("REMOTE_ATOMIC", Access::REMOTE_ATOMIC.0),
        ("MW_BIND", Access::MW_BIND.0),
        ("ZERO_BASED", Access::ZERO_BASED.0),
        ("ON_DEMAND", Access::ON_DEMAND.0),
    ];
}

impl core::fmt::Display for Access {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.0 == 0 {
            return f.write_str("NONE");
        }
        let mut sep = "";
        for (name, bit) in Access::NAMES {
            if self.0 & bit != 0 {
                write!(f, "{sep}{name}")?;
                sep = " | ";
            }
        }
        let unknown = self.0 & !Access::ALL.0;
        if unknown != 0 {
            write!(f, "{sep}{unknown:#x}")?;
        }
        Ok(())
    }
}

impl core::fmt::Debug for Access {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Access({self})")
    }
}

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// The NIC may write the memory locally (receives, read responses, atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may write.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// Remote peers may read.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// Remote peers may run atomics.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Memory windows may be bound to the region.
    pub const MW_BIND: Access = Access(1 << 4);
    /// Addresses are offsets from the start (zero-based).
    pub const ZERO_BASED: Access = Access(1 << 5);
    /// On-demand paging (`IBV_ACCESS_ON_DEMAND`): the region is not pinned; the device
    /// faults its pages in when it touches them (a registration flag, not a right).
    pub const ON_DEMAND: Access = Access(1 << 6);
    /// The rights that let the device write the memory (a read-only buffer may have none).
    pub const WRITES: Access = Access(1 | (1 << 1) | (1 << 3));

    /// Whether every right of `other` is in `self`.
    #[inline]
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// Both sets of rights.
    #[inline]
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

/// The kind of a memory window.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound through `ibv_bind_mw`, not tied to a QP.
    One,
    /// Type 2: bound by a WQE, tied to the QP that bound it.
    Two,
}

/// The key after `rkey`: the same index (upper 24 bits), the next variant byte (rdma-core's
/// `ibv_inc_rkey`).
pub fn next_key_variant(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Bind (or, with `len == 0`, unbind) a memory window to a range of a region.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BindMw {
    /// The window's current rkey (which window).
    pub mw_rkey: u32,
    /// The rkey after the bind: the same index (upper 24 bits) with a new variant byte.
    pub new_rkey: u32,
    /// Window type.
    pub mw_type: MwType,
    /// lkey of the region the window is bound to (ignored when unbinding).
    pub mr_lkey: u32,
    /// Start of the range (virtual address in the region).
    pub addr: u64,
    /// Length of the range; 0 unbinds.
    pub len: u64,
    /// Remote rights of the window (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`,
    /// `LOCAL_WRITE`), plus `ZERO_BASED`.
    pub access: Access,
}

/// A masked (extended) atomic.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MaskedAtomic {
    /// 32-bit masked compare-swap.
    Cs32 {
        /// New value (under `swap_mask`).
        swap: u32,
        /// Expected value (under `compare_mask`).
        compare: u32,
        /// Bits written.
        swap_mask: u32,
        /// Bits compared.
        compare_mask: u32,
    },
    /// 32-bit masked fetch-add.
    Fa32 {
        /// Addend.
        add: u32,
        /// Set bits stop the carry: independent fields.
        field_boundary: u32,
    },
    /// 64-bit masked compare-swap.
    Cs64 {
        /// New value (under `swap_mask`).
        swap: u64,
        /// Expected value (under `compare_mask`).
        compare: u64,
        /// Bits written.
        swap_mask: u64,
        /// Bits compared.
        compare_mask: u64,
    },
    /// 64-bit masked fetch-add.
    Fa64 {
        /// Addend.
        add: u64,
        /// Set bits stop the carry: independent fields.
        field_boundary: u64,
    },
}

impl MaskedAtomic {
    /// Operand size in bytes.
    pub const fn size(&self) -> u32 {
        match self {
            MaskedAtomic::Cs32 { .. } | MaskedAtomic::Fa32 { .. } => 4,
            _ => 8,
        }
    }
    /// Whether this is a compare-swap.
    pub const fn is_cs(&self) -> bool {
        matches!(self, MaskedAtomic::Cs32 { .. } | MaskedAtomic::Cs64 { .. })
    }
}

/// One send work request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request<'a> {
    /// No operation.
    Nop,
    /// RDMA write.
    Write {
        /// Destination.
        remote: Remote,
        /// Source.
        data: Payload<'a>,
    },
    /// RDMA write with immediate (zero bytes is legal).
    WriteImm {
        /// Destination.
        remote: Remote,
        /// Source.
        data: Payload<'a>,
        /// Immediate, host order (it travels big-endian).
        imm: u32,
    },
    /// RDMA read into a scatter list.
    Read {
        /// Source.
        remote: Remote,
        /// Destination buffers.
        sgl: &'a [Sge],
    },
    /// Send into the peer's next receive WQE.
    Send {
        /// Source.
        data: Payload<'a>,
    },
    /// Send with immediate.
    SendImm {
        /// Source.
        data: Payload<'a>,
        /// Immediate, host order.
        imm: u32,
    },
    /// Send that invalidates a remote rkey at the responder.
    SendInv {
        /// Source.
        data: Payload<'a>,
        /// The rkey to invalidate.
        rkey: u32,
    },
    /// 64-bit compare-and-swap; the old value lands in `local` (8 bytes).
    CompareSwap {
        /// Target (8-byte aligned).
        remote: Remote,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
        /// Where the old value goes.
        local: Sge,
    },
    /// 64-bit fetch-and-add; the old value lands in `local` (8 bytes).
    FetchAdd {
        /// Target (8-byte aligned).
        remote: Remote,
        /// Addend.
        add: u64,
        /// Where the old value goes.
        local: Sge,
    },
    /// Masked atomic; the old value lands in `local`.
    Masked {
        /// Target (aligned to the operand size).
        remote: Remote,
        /// Operation and operands.
        op: MaskedAtomic,
        /// Where the old value goes.
        local: Sge,
    },
    /// Invalidate a type-2 window's rkey locally (a UMR WQE, as rdma-core posts it).
    LocalInvalidate {
        /// The rkey to invalidate.
        rkey: u32,
    },
    /// Bind or unbind a memory window (a UMR WQE).
    BindMw(BindMw),
}

impl Request<'_> {
    /// The opcode this request is posted with.
    pub const fn opcode(&self) -> crate::opcode::Opcode {
        use crate::opcode::Opcode as O;
        match self {
            Request::Nop => O::Nop,
            Request::Write { .. } => O::RdmaWrite,
            Request::WriteImm { .. } => O::RdmaWriteImm,
            Request::Read { .. } => O::RdmaRead,
            Request::Send { .. } => O::Send,
            Request::SendImm { .. } => O::SendImm,
            Request::SendInv { .. } => O::SendInval,
            Request::CompareSwap { .. } => O::AtomicCs,
            Request::FetchAdd { .. } => O::AtomicFa,
            Request::Masked { op, .. } => {
                if op.is_cs() {
                    O::AtomicMaskedCs
                } else {
                    O::AtomicMaskedFa
                }
            }
            Request::LocalInvalidate { .. } | Request::BindMw(_) => O::Umr,
        }
    }
}

/// Fence, completion and solicited flags of one WQE (the `fm_ce_se` byte).
pub type WqeFlags = crate::ctrl::FmCeSe;
