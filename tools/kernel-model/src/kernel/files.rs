//! Opening, mapping and closing the device file.

use super::limits::{BFREGS_PER_PAGE, DYN_BFREGS, PAGE};
use super::objects::{File, Obj};
use super::state::kernel;
use crate::fds;
use crate::next::next;
use libc::c_int;

/// Opens a uverbs file: a descriptor the user polls and closes like the kernel's.
pub(crate) fn open_file() -> c_int {
    // SAFETY: eventfd(2) with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return fd;
    }
    if !fds::DEVICES.add(fd) {
        // SAFETY: closing the descriptor just made.
        unsafe { (next().close)(fd) };
        crate::next::set_errno(libc::EMFILE);
        return -1;
    }
    kernel().files.insert(fd, File::default());
    fd
}

/// Closes a uverbs file: its objects are destroyed, QPs first, then CQs, regions and
/// domains (`uverbs_destroy_ufile_hw` destroys by dependency).
pub(crate) fn close_file(fd: c_int) {
    fds::DEVICES.remove(fd);
    let mut k = kernel();
    let Some(mut f) = k.files.remove(&fd) else {
        return;
    };
    let nic = k.nic.clone();
    drop(k);
    let mut objs: Vec<(u32, Obj)> = f.objs.drain().collect();
    objs.sort_by_key(|(_, o)| match o {
        Obj::Qp(_) => 0,
        Obj::Mw(_) => 1,
        Obj::Srq(_) => 2,
        Obj::Cq(_) => 3,
        Obj::Mr(_) => 4,
        Obj::Pd(_) => 5,
        Obj::Channel(_) => 6,
    });
    for (_, o) in objs {
        match o {
            Obj::Qp(q) => drop(nic.destroy_qp(q.qpn)),
            Obj::Mw(r) => drop(nic.dealloc_mw(r)),
            Obj::Srq(s) => drop(nic.destroy_srq(s.srqn)),
            Obj::Cq(c) => drop(nic.destroy_cq(c.cqn)),
            Obj::Mr(l) => drop(nic.dereg_mr(l)),
            Obj::Pd(p) => drop(nic.dealloc_pd(p)),
            Obj::Channel(_) => {}
        }
    }
}

/// Closes a completion channel's descriptor: its object goes from the file that made it
/// (the kernel's `uverbs_uobject_fd_release`), so that a later CQ naming that descriptor
/// number is refused unless it is a channel again.
pub(crate) fn close_channel(fd: c_int) {
    for f in kernel().files.values_mut() {
        f.objs
            .retain(|_, o| !matches!(o, Obj::Channel(c) if *c == fd));
    }
}

/// `mmap` of the device file: a UAR page (`mlx5_ib_mmap` -> `uar_mmap`). The page is plain
/// memory the NIC reads doorbells from.
pub(crate) fn mmap(fd: c_int, len: usize, off: libc::off_t) -> *mut libc::c_void {
    let fail = |e| {
        crate::next::set_errno(e);
        libc::MAP_FAILED
    };
    if len != PAGE || off < 0 || off as usize % PAGE != 0 {
        return fail(libc::EINVAL);
    }
    let pgoff = off as u64 / PAGE as u64;
    let cmd = (pgoff >> 8) & 0xff;
    let mut k = kernel();
    // MLX5_IB_MMAP_CORE_CLOCK and MLX5_IB_MMAP_CLOCK_INFO (index MLX5_IB_CLOCK_INFO_V1):
    // the device clock's pages, read-only.
    match (cmd, pgoff & 0xff) {
        (5, 0) => return super::clock::map(&k.nic, 0),
        (7, 0) => return super::clock::map(&k.nic, 1),
        _ => {}
    }
    // MLX5_IB_MMAP_REGULAR_PAGE, _WC_PAGE, _NC_PAGE, _ALLOC_WC: UAR pages.
    if !matches!(cmd, 0 | 2 | 3 | 6) {
        return fail(libc::EINVAL);
    }
    let Some(f) = k.files.get_mut(&fd) else {
        return fail(libc::EBADF);
    };
    if !f.has_context() {
        return fail(libc::EINVAL);
    }
    // `get_index` / `get_extended_index` of the kernel's `uar_mmap`.
    let dynamic = cmd == 6;
    let idx = if dynamic {
        (pgoff & 0xff | (pgoff >> 16) << 8) as u32
    } else {
        (pgoff & 0xff) as u32
    };
    let pages = if dynamic { DYN_BFREGS } else { f.tot_bfregs } / BFREGS_PER_PAGE;
    if idx >= pages {
        return fail(libc::EINVAL);
    }
    // SAFETY: an anonymous shared mapping of one page.
    let p = unsafe {
        (next().mmap)(
            core::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p != libc::MAP_FAILED {
        f.pages.insert((dynamic, idx), p as usize);
    }
    p
}
