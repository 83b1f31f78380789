//! The control segment: the first 16 bytes of every send WQE.

use crate::be::{Be16, Be32};
use crate::opcode::Opcode;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `struct mlx5_wqe_ctrl_seg` (16 bytes).
#[repr(C)]
#[derive(
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
    Copy,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
)]
pub struct CtrlSeg {
    /// `opmod << 24 | (pi & 0xffff) << 8 | opcode`.
    pub opmod_idx_opcode: Be32,
    /// `qpn << 8 | ds`: the QP number and the WQE size in 16-byte units (DS).
    pub qpn_ds: Be32,
    /// WQE signature; 0 unless signatures are enabled on the QP.
    pub signature: u8,
    /// DCI stream channel; 0 for RC.
    pub dci_stream_channel_id: Be16,
    /// Fence mode, completion mode and solicited event ([`FmCeSe`]).
    pub fm_ce_se: u8,
    /// Immediate data (as it goes on the wire), the rkey to invalidate, or the new UMR mkey.
    pub imm: Be32,
}

/// The largest DS count the 6-bit field holds.
pub const MAX_DS: u32 = 0x3f;

impl CtrlSeg {
    /// A control segment with every field set, as `mlx5dv_set_ctrl_seg` writes it.
    #[inline(always)]
    pub fn new(opcode: u8, opmod: u8, pi: u16, qpn: u32, ds: u8, fm_ce_se: u8, imm: Be32) -> Self {
        CtrlSeg {
            opmod_idx_opcode: Be32::new(
                ((opmod as u32) << 24) | ((pi as u32) << 8) | opcode as u32,
            ),
            qpn_ds: Be32::new((qpn << 8) | ds as u32),
            signature: 0,
            dci_stream_channel_id: Be16::ZERO,
            fm_ce_se,
            imm,
        }
    }
    /// The raw opcode byte.
    #[inline]
    pub fn opcode_raw(&self) -> u8 {
        self.opmod_idx_opcode.get() as u8
    }
    /// The opcode, if known.
    #[inline]
    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode_raw())
    }
    /// The opcode modifier.
    #[inline]
    pub fn opmod(&self) -> u8 {
        (self.opmod_idx_opcode.get() >> 24) as u8
    }
    /// The producer index (WQEBB count, wrapping at 0xffff) of this WQE's first block.
    #[inline]
    pub fn pi(&self) -> u16 {
        (self.opmod_idx_opcode.get() >> 8) as u16
    }
    /// The QP number.
    #[inline]
    pub fn qpn(&self) -> u32 {
        self.qpn_ds.get() >> 8
    }
    /// The WQE size in 16-byte units.
    #[inline]
    pub fn ds(&self) -> u8 {
        self.qpn_ds.get() as u8 & 0x3f
    }
}

/// Fence mode: bits 7:5 of `fm_ce_se`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Fence {
    /// No fence.
    #[default]
    None = 0,
    /// Initiator small fence: wait until earlier memory-key operations of this QP (UMR:
    /// memory-window bind, local invalidate) have taken effect (rdma-core and the kernel arm
    /// it on the WQE after one: `next_fence`).
    InitiatorSmall = 1,
    /// Fence: wait until earlier RDMA reads and atomics of this QP have completed (the
    /// InfiniBand fence indicator; the kernel's `IB_SEND_FENCE` when no small fence is armed).
    Fence = 2,
    /// Strong ordering: wait for every earlier WQE of this QP.
    StrongOrdering = 3,
    /// Small-and-fence: both of the above; what rdma-core calls `MLX5_WQE_CTRL_FENCE` and sets
    /// for `IBV_SEND_FENCE`.
    SmallAndFence = 4,
}

impl Fence {
    /// Every fence mode.
    pub const ALL: [Fence; 5] = [
        Fence::None,
        Fence::InitiatorSmall,
        Fence::Fence,
        Fence::StrongOrdering,
        Fence::SmallAndFence,
    ];
    /// The fence mode with this 3-bit value.
    pub const fn from_bits(v: u8) -> Option<Fence> {
        Some(match v {
            0 => Fence::None,
            1 => Fence::InitiatorSmall,
            2 => Fence::Fence,
            3 => Fence::StrongOrdering,
            4 => Fence::SmallAndFence,
            _ => return None,
        })
    }

    /// The fence a WQE asked with `self` carries when the WQE before it armed `armed` (an
    /// initiator small fence after a memory-key operation, or none), as the kernel's
    /// `get_fence` (`drivers/infiniband/hw/mlx5/wr.c`) makes it: a fence asked for keeps the
    /// armed small fence (small-and-fence); none asked for takes the armed one. Replaced
    /// by the asked fence, the small fence was lost: a send carrying a window's new rkey
    /// could leave before the bind took effect.
    pub const fn after(self, armed: Fence) -> Fence {
        match (self, armed) {
            (Fence::None, armed) => armed,
            (Fence::Fence, Fence::InitiatorSmall) => Fence::SmallAndFence,
            (asked, _) => asked,
        }
    }
}

/// Completion (CE) mode: bits 3:2 of `fm_ce_se`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum CompletionMode {
    /// A CQE only if the WQE fails (an "unsignaled" WQE).
    #[default]
    OnError = 0,
    /// A CQE on the first error.
    FirstError = 1,
    /// A CQE always (`MLX5_WQE_CTRL_CQ_UPDATE`).
    Always = 2,
    /// A CQE and an event-queue entry.
    CqeAndEqe = 3,
}

impl CompletionMode {
    /// Every completion mode.
    pub const ALL: [CompletionMode; 4] = [
        CompletionMode::OnError,
        CompletionMode::FirstError,
        CompletionMode::Always,
        CompletionMode::CqeAndEqe,
    ];
    /// The mode with this 2-bit value.
    pub const fn from_bits(v: u8) -> CompletionMode {
        match v & 3 {
            0 => CompletionMode::OnError,
            1 => CompletionMode::FirstError,
            2 => CompletionMode::Always,
            _ => CompletionMode::CqeAndEqe,
        }
    }
    /// Whether a successful WQE with this mode produces a CQE.
    pub const fn signals_success(self) -> bool {
        matches!(self, CompletionMode::Always | CompletionMode::CqeAndEqe)
    }
}

/// The `fm_ce_se` byte, as typed fields.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct FmCeSe {
    /// Fence mode.
    pub fence: Fence,
    /// Completion mode.
    pub completion: CompletionMode,
    /// Solicited event (bit 1).
    pub solicited: bool,
}

/// `fm_ce_se` bit of the solicited event (`MLX5_WQE_CTRL_SOLICITED`).
pub const SOLICITED: u8 = 1 << 1;
/// `fm_ce_se` value of completion mode "always" (`MLX5_WQE_CTRL_CQ_UPDATE`).
pub const CQ_UPDATE: u8 = 2 << 2;
/// `fm_ce_se` value of the small-and-fence mode (`MLX5_WQE_CTRL_FENCE`).
pub const FENCE: u8 = 4 << 5;
/// `fm_ce_se` value of the initiator small fence (`MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE`).
pub const INITIATOR_SMALL_FENCE: u8 = 1 << 5;

impl FmCeSe {
    /// The byte as the hardware reads it.
    #[inline(always)]
    pub const fn to_u8(self) -> u8 {
        ((self.fence as u8) << 5) | ((self.completion as u8) << 2) | ((self.solicited as u8) << 1)
    }
    /// The fields of a byte; `None` for a reserved fence mode (5 to 7).
    pub const fn from_u8(v: u8) -> Option<FmCeSe> {
        let fence = match Fence::from_bits(v >> 5) {
            Some(f) => f,
            None => return None,
        };
        Some(FmCeSe {
            fence,
            completion: CompletionMode::from_bits(v >> 2),
            solicited: v & SOLICITED != 0,
        })
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_asked_fence_keeps_the_armed_small_fence() {
        use super::Fence::*;
        for asked in super::Fence::ALL {
            assert_eq!(asked.after(None), asked, "nothing armed");
        }
        assert_eq!(None.after(InitiatorSmall), InitiatorSmall);
        assert_eq!(InitiatorSmall.after(InitiatorSmall), InitiatorSmall);
        assert_eq!(Fence.after(InitiatorSmall), SmallAndFence);
        assert_eq!(SmallAndFence.after(InitiatorSmall), SmallAndFence);
        assert_eq!(StrongOrdering.after(InitiatorSmall), StrongOrdering);
    }

    use super::*;

    #[test]
    fn fm_ce_se_round_trips_every_combination() {
        for fence in Fence::ALL {
            for completion in CompletionMode::ALL {
                for solicited in [false, true] {
                    let f = FmCeSe {
                        fence,
                        completion,
                        solicited,
                    };
                    assert_eq!(FmCeSe::from_u8(f.to_u8()), Some(f));
                }
            }
        }
        assert_eq!(FmCeSe::from_u8(5 << 5), None);
    }

    #[test]
    fn named_bits() {
        let always = FmCeSe {
            completion: CompletionMode::Always,
            ..Default::default()
        };
        assert_eq!(always.to_u8(), CQ_UPDATE);
        let fenced = FmCeSe {
            fence: Fence::SmallAndFence,
            ..Default::default()
        };
        assert_eq!(fenced.to_u8(), FENCE);
        let small = FmCeSe {
            fence: Fence::InitiatorSmall,
            ..Default::default()
        };
        assert_eq!(small.to_u8(), INITIATOR_SMALL_FENCE);
    }

    #[test]
    fn fields_read_back() {
        let c = CtrlSeg::new(0x25, 0x09, 0xfffe, 0xab_cdef, 63, 0x8a, Be32::new(7));
        assert_eq!(c.opcode(), Some(Opcode::Umr));
        assert_eq!(
            (c.opmod(), c.pi(), c.qpn(), c.ds()),
            (9, 0xfffe, 0xab_cdef, 63)
        );
        assert_eq!(core::mem::size_of::<CtrlSeg>(), 16);
    }
}
