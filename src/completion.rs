//! What a poll returns.

pub use mlx5::WcStatus;

/// The kind of work a completion reports (verbs' `ibv_wc_opcode`, plus the kinds verbs has
/// no name for).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
#[repr(u8)]
pub enum WcOpcode {
    /// A send (with or without immediate or invalidate) completed.
    Send,
    /// An RDMA write (with or without immediate) completed.
    RdmaWrite,
    /// An RDMA read completed.
    RdmaRead,
    /// A compare-and-swap completed.
    CompSwap,
    /// A fetch-and-add completed.
    FetchAdd,
    /// A masked compare-and-swap completed.
    MaskedCompSwap,
    /// A masked fetch-and-add completed.
    MaskedFetchAdd,
    /// A memory-window bind completed.
    BindMw,
    /// A local invalidate completed.
    LocalInv,
    /// A NOP completed.
    Nop,
    /// A receive completed (a send arrived).
    Recv,
    /// A receive was consumed by an RDMA write with immediate.
    RecvRdmaWithImm,
    /// A receive was consumed by a send with invalidate: the peer invalidated the key in
    /// [`Completion::imm`] (verbs' `IBV_WC_RECV` with `IBV_WC_WITH_INV`). The memory window
    /// with that key (bound through this QP; on rxe, through any QP of the domain) is
    /// unbound; tell it with [`MemoryWindow::invalidated`](crate::MemoryWindow::invalidated).
    RecvWithInv,
    /// The CQE could not be attributed (an unknown CQE opcode or format).
    #[default]
    Unknown,
}

impl WcOpcode {
    /// Whether a receive completed (whatever consumed it: a send, a send with immediate or
    /// invalidate, an RDMA write with immediate).
    #[inline]
    pub fn is_receive(self) -> bool {
        matches!(
            self,
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm | WcOpcode::RecvWithInv
        )
    }
}

/// One work completion.
///
/// Laid out (`repr(C)`) for the poller: `cookie`, `byte_len` and `opcode` first, as a send
/// queue's bookkeeping holds them (copied in one 16-byte move), then the fields a poll of a
/// plain completion leaves at zero side by side (`src_qp`, `status` and `imm`'s tag; `grh` and
/// `syndrome`'s tag), written with three stores beside the QP number's.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Completion {
    /// The cookie given when the work was posted (verbs' `wr_id`).
    pub cookie: u64,
    /// Bytes: received (receives), read (reads), 8 or 4 (atomics); 0 for writes and sends.
    pub byte_len: u32,
    /// What completed.
    pub opcode: WcOpcode,
    /// The local QP number.
    pub qpn: u32,
    /// A receive on a UD QP or a DC target: the QP number of the sender (verbs' `src_qp`;
    /// a DCT's: the initiating DCI's). Other completions: 0, except an RC receive on the
    /// direct path, which reports what the CQE's `flags_rqpn` holds, as libmlx5 does (0 on
    /// the software NIC; 0 too where a message of up to 32 bytes came inside the CQE,
    /// whose bytes those are then).
    pub src_qp: u32,
    /// Success, or why not (a flushed request: [`WcStatus::WrFlushErr`]).
    pub status: WcStatus,
    /// The immediate (host order) of a send or write with immediate, or the invalidated rkey
    /// of a send with invalidate ([`WcOpcode::RecvWithInv`]).
    pub imm: Option<u32>,
    /// A receive on a UD QP: whether the datagram carried a Global Route Header, now in the
    /// first 40 bytes of the receive buffer (verbs' `IBV_WC_GRH`; see [`crate::Grh`]). The
    /// 40 bytes are reserved and counted in `byte_len` either way.
    pub grh: bool,
    /// The hardware syndrome and vendor syndrome of an error completion: on the direct
    /// path the CQE's two bytes; on the verbs path `(0, vendor_err)` with the low byte of the
    /// provider's `vendor_err` (mlx5's vendor syndrome whole; irdma packs a major and a minor
    /// error code there, of which only the minor's low byte remains).
    pub syndrome: Option<(u8, u8)>,
}

impl Default for Completion {
    fn default() -> Self {
        Completion {
            cookie: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Unknown,
            byte_len: 0,
            imm: None,
            qpn: 0,
            syndrome: None,
            src_qp: 0,
            grh: false,
        }
    }
}

impl Completion {
    /// Whether the work succeeded.
    #[inline]
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}
