//! Who rings a BlueFlame register, and how: one register of its own (a thread domain's),
//! one shared with other queues (a lock and the alternating offset kept per register), or
//! none (8-byte doorbells only).
//!
//! rdma-core (`providers/mlx5/verbs.c` `mlx5_get_qp_uar`) gives the first QPs of a context a
//! register each, the next ones shared registers, and a thread domain a register no QP outside
//! the domain gets (`mlx5_alloc_td` -> `mlx5_attach_dedicated_uar`). On a shared register
//! (`qp.c` `post_send_db`) every ring takes `bf->lock`, and the BlueFlame half alternates per
//! register (`bf->offset` lives in the shared `mlx5_bf`). UCX (`ib_mlx5.c`
//! `uct_ib_mlx5_txwq_init`) keeps one state per register address for the queues of a worker
//! and picks its MMIO mode by whether the QP has a thread domain
//! (`uct_ib_mlx5_get_mmio_mode`). The state here is the same: one [`SharedReg`] per register
//! address, found in a process-wide table when a queue is created, never on the data path.

use crate::queue::spin::Spin;
use std::sync::{Arc, Mutex, Weak};

/// How a send queue rings its doorbell; chosen when the queue is created.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DoorbellMode {
    /// A BlueFlame register of its own (the QP's thread domain): BlueFlame copies, no lock,
    /// the alternating offset in the queue (UCX `BF_POST`).
    Dedicated,
    /// A BlueFlame register other queues may ring too: every ring takes the register's lock,
    /// and the alternating offset is the register's (rdma-core `post_send_db` with
    /// `bf->need_lock`).
    SharedLocked,
    /// No BlueFlame on this register (`bf.size == 0`: no write-combining mapping, or
    /// `MLX5_SHUT_UP_BF`): 8-byte doorbells, single-copy atomic stores at one fixed offset,
    /// which need no lock even when queues share the register (rdma-core's `nc_uar`, UCX `DB`).
    DoorbellOnly,
}

/// A short name (bfperf's header).
impl core::fmt::Display for DoorbellMode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DoorbellMode::Dedicated => "dedicated BlueFlame register",
            DoorbellMode::SharedLocked => "shared BlueFlame register, locked",
            DoorbellMode::DoorbellOnly => "8-byte doorbell only",
        })
    }
}

/// The state of one BlueFlame register shared by queues: the offset of the half the next
/// ring uses, under the register's spin lock (rdma-core's `bf->lock`, `bf->offset`).
pub(crate) type SharedReg = Spin<usize>;

/// A queue's claim on a register: while it lives, the table knows the register is in use and
/// whether it is exclusive.
pub(crate) struct Claim {
    pub(crate) mode: DoorbellMode,
    /// The register's shared state (present for every BlueFlame register; used for rings only
    /// in [`DoorbellMode::SharedLocked`]).
    pub(crate) reg: Option<Arc<SharedReg>>,
}

struct Entry {
    key: usize,
    /// The size of each half: the register is the `2 * bf_size` bytes from `key`.
    bf_size: usize,
    exclusive: bool,
    state: Weak<SharedReg>,
}

/// Every register in use by a queue of this process, by address. Weak entries: the state
/// lives as long as a queue rings the register.
static TABLE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Why a register cannot be claimed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct InUse {
    pub(crate) addr: usize,
}

/// Claims the register at `addr` (two halves of `bf_size` bytes) for a new queue.
/// `dedicated`: the creator of the QP says no other QP gets this register (a thread domain's).
///
/// The answer never lets two queues ring one register without the lock: a dedicated claim
/// on a register already in use, or any claim on a register claimed as dedicated, is refused
/// (rdma-core never does that; the check costs nothing here). Nor does it let two queues
/// ring overlapping registers with halves of different sizes: a claim whose `2 * bf_size`
/// bytes overlap a register in use with halves of another size is refused (on the same
/// register, the halves' offset, shared under the lock, would be flipped by two sizes and
/// reach past either queue's register; a device's registers all have one size).
pub(crate) fn claim(addr: *mut u8, bf_size: usize, dedicated: bool) -> Result<Claim, InUse> {
    if bf_size == 0 {
        return Ok(Claim {
            mode: DoorbellMode::DoorbellOnly,
            reg: None,
        });
    }
    // Both halves name the same register (UCX `uct_ib_mlx5_mmio_cmp` masks the half bit).
    let key = addr as usize & !bf_size;
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    // A queue drops its claim without the table's lock (`Doorbell::release`, or the queue
    // dropped), so an entry may die at any point below: one whose state is gone is a
    // register no queue rings, whenever it went (an entry kept by this sweep and found dead
    // at the lookup was refused as in use: a creation failed while another thread's QP
    // left the register).
    table.retain(|e| e.state.strong_count() > 0);
    let end = key.saturating_add(2 * bf_size);
    let other_layout = |e: &&Entry| {
        e.bf_size != bf_size
            && e.key < end
            && key < e.key.saturating_add(2 * e.bf_size)
            && e.state.strong_count() > 0
    };
    if let Some(e) = table.iter().find(other_layout) {
        return Err(InUse { addr: e.key });
    }
    if let Some(i) = table.iter().position(|e| e.key == key) {
        let e = &table[i];
        if let Some(state) = e.state.upgrade() {
            if e.exclusive || dedicated {
                return Err(InUse { addr: key });
            }
            return Ok(Claim {
                mode: DoorbellMode::SharedLocked,
                reg: Some(state),
            });
        }
        // Its last queue left since the sweep: the register is free.
        table.swap_remove(i);
    }
    let state = Arc::new(SharedReg::new(0));
    table.push(Entry {
        key,
        bf_size,
        exclusive: dedicated,
        state: Arc::downgrade(&state),
    });
    Ok(Claim {
        mode: if dedicated {
            DoorbellMode::Dedicated
        } else {
            DoorbellMode::SharedLocked
        },
        reg: Some(state),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_per_register() {
        let mut mem = vec![0u8; 4096];
        let a = mem
            .as_mut_ptr()
            .wrapping_add(512 - (mem.as_ptr() as usize % 512));
        let b = a.wrapping_add(512);
        // Shared claims on one register share one state, whichever half they name.
        let s1 = claim(a, 256, false).unwrap();
        let s2 = claim(a.wrapping_add(256), 256, false).unwrap();
        assert_eq!(s1.mode, DoorbellMode::SharedLocked);
        assert!(Arc::ptr_eq(
            s1.reg.as_ref().unwrap(),
            s2.reg.as_ref().unwrap()
        ));
        // A dedicated claim on a register in use is refused.
        assert!(claim(a, 256, true).is_err());
        // A dedicated register refuses any second claim.
        let d = claim(b, 256, true).unwrap();
        assert_eq!(d.mode, DoorbellMode::Dedicated);
        assert!(claim(b, 256, false).is_err());
        drop(d);
        // Once released, the register can be claimed again.
        assert_eq!(
            claim(b, 256, false).unwrap().mode,
            DoorbellMode::SharedLocked
        );
        assert_eq!(claim(b, 0, true).unwrap().mode, DoorbellMode::DoorbellOnly);
    }

    /// A claim of a register in use with halves of another size, or of one overlapping it
    /// with halves of another size, is refused: the shared offset would be flipped by two
    /// sizes.
    #[test]
    fn overlapping_registers_of_other_layouts_are_refused() {
        let mut mem = vec![0u8; 8192];
        let a = mem
            .as_mut_ptr()
            .wrapping_add(2048 - (mem.as_ptr() as usize % 2048));
        let held = claim(a, 256, false).unwrap();
        let key = a as usize;
        // The same register with 64-byte or 512-byte halves.
        assert_eq!(claim(a, 64, false).err(), Some(InUse { addr: key }));
        assert_eq!(claim(a, 512, false).err(), Some(InUse { addr: key }));
        // Its second half named as the first of 128-byte halves (key a + 256).
        let inside = a.wrapping_add(256);
        assert_eq!(claim(inside, 128, false).err(), Some(InUse { addr: key }));
        // The same layout is shared; the register after it is free.
        assert!(claim(a.wrapping_add(256), 256, false).is_ok());
        assert!(claim(a.wrapping_add(512), 256, false).is_ok());
        drop(held);
    }

    #[test]
    fn lock_and_offset() {
        let r = Arc::new(SharedReg::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let mut g = r.lock();
                        *g += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*r.lock(), 40_000);
    }
}
