//! The device clock's two pages, as `mlx5_ib` offers them to a process (`mlx5_ib_mmap`):
//! `MLX5_IB_MMAP_CORE_CLOCK`, the HCA's internal timer (two big-endian 32-bit halves,
//! which rdma-core's `mlx5_read_clock` reads for `ibv_query_rt_values_ex`), and
//! `MLX5_IB_MMAP_CLOCK_INFO`, `struct mlx5_ib_clock_info` (`ib_uverbs_clock_info`), which
//! the kernel's `mlx5_update_clock_info_page` moves on under its sequence count and
//! rdma-core's `mlx5dv_get_clock_info` copies out. The NIC's clock hook writes both (the
//! kernel's overflow work, at the NIC's time); each process maps its own view of them.

use super::limits::PAGE;
use crate::next::next;
use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use libc::c_int;
use mlx5::clock::ClockInfo;
use mlx5::sim::Nic;
use std::sync::{Mutex, OnceLock};

/// `MLX5_IB_CLOCK_INFO_KERNEL_UPDATING`: the sequence count's bit while the page is written.
const KERNEL_UPDATING: u32 = 1;

/// The pages' memory: a memfd of two pages (the counter, then the clock info), mapped
/// once here for writing; a process's `mmap` of the device file maps a view of one.
struct Pages {
    fd: c_int,
}

/// The pages, made (and the NIC's clock hook installed) on first use; None when the NIC
/// has no clock or the memory cannot be had.
fn pages(nic: &Nic) -> Option<&'static Pages> {
    static PAGES: OnceLock<Option<Pages>> = OnceLock::new();
    PAGES
        .get_or_init(|| {
            if nic.hw_clock().khz == 0 {
                return None;
            }
            // SAFETY: memfd_create, ftruncate and mmap with valid arguments; the mapping
            // is never unmapped (the model lives as long as the process).
            let (fd, own) = unsafe {
                let fd = libc::memfd_create(c"blueflame-clock".as_ptr(), libc::MFD_CLOEXEC);
                if fd < 0 || libc::ftruncate(fd, 2 * PAGE as libc::off_t) != 0 {
                    return None;
                }
                let own = (next().mmap)(
                    core::ptr::null_mut(),
                    2 * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                if own == libc::MAP_FAILED {
                    return None;
                }
                (fd, own as usize)
            };
            let last = Mutex::new(None);
            nic.set_clock_hook(Some(Box::new(move |cycles, info| {
                // SAFETY: `own` is the two pages mapped above, never unmapped.
                unsafe { write(own as *mut u8, cycles, info, &last) }
            })));
            Some(Pages { fd })
        })
        .as_ref()
}

/// Writes the counter page, and the clock-info page when it moved (as the kernel writes
/// it only from its overflow work and clock adjustments: a reader meets the updating bit
/// rarely).
///
/// # Safety
/// `own` is the two pages of [`Pages`].
unsafe fn write(
    own: *mut u8,
    cycles: u64,
    info: Option<ClockInfo>,
    last: &Mutex<Option<ClockInfo>>,
) {
    // SAFETY: the first page's first 8 bytes, aligned; one store, so the halves agree.
    unsafe { (*(own as *const AtomicU64)).store(cycles.to_be(), Ordering::Release) };
    let Some(i) = info else { return };
    let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
    if *last == Some(i) {
        return;
    }
    *last = Some(i);
    // SAFETY: the second page: `struct mlx5_ib_clock_info` at its start (sign 0, resv 4,
    // nsec 8, cycles 16, frac 24, mult 32, shift 36, mask 40, overflow_period 48), aligned
    // fields written with atomic stores (the reader copies them between two loads of
    // `sign`).
    unsafe {
        let p = own.add(PAGE);
        let sign = &*(p as *const AtomicU32);
        let u64_at = |off: usize| &*(p.add(off) as *const AtomicU64);
        let u32_at = |off: usize| &*(p.add(off) as *const AtomicU32);
        // `mlx5_update_clock_info_page`: smp_store_mb(sign | KERNEL_UPDATING), the fields,
        // smp_store_release(sign + 2).
        let s = sign.load(Ordering::Acquire) & !KERNEL_UPDATING;
        sign.store(s | KERNEL_UPDATING, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        u64_at(8).store(i.nsec, Ordering::Relaxed);
        u64_at(16).store(i.last_cycles, Ordering::Relaxed);
        u64_at(24).store(i.frac, Ordering::Relaxed);
        u32_at(32).store(i.mult, Ordering::Relaxed);
        u32_at(36).store(i.shift, Ordering::Relaxed);
        u64_at(40).store(i.mask, Ordering::Relaxed);
        // rdma-core reports it as `max_clock_info_update_nsec`: in nanoseconds here.
        let period = ((i.overflow_cycles() as u128 * i.mult as u128) >> i.shift) as u64;
        u64_at(48).store(period, Ordering::Relaxed);
        sign.store(s.wrapping_add(2), Ordering::Release);
    }
}

/// Whether the NIC has a clock whose pages a process may map (the context says so).
pub(super) fn offered(nic: &Nic) -> bool {
    pages(nic).is_some()
}

/// A process's read-only view of the counter page (`which` 0) or the clock-info page (1).
pub(super) fn map(nic: &Nic, which: usize) -> *mut libc::c_void {
    let Some(p) = pages(nic) else {
        crate::next::set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    };
    // SAFETY: a shared read-only mapping of one page of the memfd.
    unsafe {
        (next().mmap)(
            core::ptr::null_mut(),
            PAGE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            p.fd,
            (which * PAGE) as libc::off_t,
        )
    }
}
