//! The C functions this library interposes (`LD_PRELOAD`): for the device node and the
//! descriptors it hands out they are the kernel's uverbs interface; for everything else they
//! call the C library's own ([`crate::next`]).
//!
//! What libibverbs and libmlx5 (rdma-core 44-55) call on the device: `stat` of the node
//! (`init.c` `try_access_device`), `open` + `fstat` (`util/open_cdev.c`), `ioctl` (answered
//! `ENOTTY`: no ioctl framework, so libibverbs uses the write ABI for good,
//! `cmd_fallback.c` `_execute_ioctl_fallback`), `write` of each command, `mmap` of UAR pages
//! (`mlx5.c` `mlx5_mmap`), `close`. Completion channels and the asynchronous event
//! descriptor are pipes the model writes event records to: `read` and `poll` on them need no
//! interposing.

use crate::fds;
use crate::next::next;
use crate::sysfs;
use libc::{c_char, c_int, c_ulong, c_void, off_t, size_t, ssize_t};
use std::ffi::CStr;

/// Whether `path` names the device node.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn is_device(path: *const c_char) -> bool {
    // SAFETY: the caller's contract.
    !path.is_null() && unsafe { CStr::from_ptr(path) }.to_bytes() == sysfs::DEV_PATH.as_bytes()
}

/// Fills `st` as the kernel describes the character device.
///
/// # Safety
/// `st` is valid for writing a `struct stat`.
unsafe fn device_stat(st: *mut libc::stat) -> c_int {
    // SAFETY: the caller's contract; all-zero is a valid `struct stat`.
    unsafe {
        st.write(core::mem::zeroed());
        (*st).st_mode = libc::S_IFCHR | 0o666;
        (*st).st_rdev = libc::makedev(sysfs::CDEV.0, sysfs::CDEV.1);
    }
    0
}

/// Opens the device: a new uverbs file.
fn open_device() -> c_int {
    crate::kernel::open_file()
}

/// `open(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: the caller passes open(2)'s arguments.
    if unsafe { is_device(path) } {
        return open_device();
    }
    // SAFETY: as above.
    unsafe { (next().open)(path, flags, mode) }
}

/// `open64(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: the caller passes open(2)'s arguments.
    if unsafe { is_device(path) } {
        return open_device();
    }
    // SAFETY: as above.
    unsafe { (next().open64)(path, flags, mode) }
}

/// `openat(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn openat(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    // SAFETY: the caller passes openat(2)'s arguments.
    if unsafe { is_device(path) } {
        return open_device();
    }
    // SAFETY: as above.
    unsafe { (next().openat)(dir, path, flags, mode) }
}

/// `openat64(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    // SAFETY: the caller passes openat(2)'s arguments.
    if unsafe { is_device(path) } {
        return open_device();
    }
    // SAFETY: as above.
    unsafe { (next().openat64)(dir, path, flags, mode) }
}

/// `stat(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller passes stat(2)'s arguments.
    unsafe {
        if is_device(path) {
            return device_stat(st);
        }
        (next().stat)(path, st)
    }
}

/// `stat64(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller passes stat(2)'s arguments (stat64 is stat on 64-bit Linux).
    unsafe {
        if is_device(path) {
            return device_stat(st);
        }
        (next().stat64)(path, st)
    }
}

/// `fstat(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller passes fstat(2)'s arguments.
    unsafe {
        if fds::DEVICES.has(fd) {
            return device_stat(st);
        }
        (next().fstat)(fd, st)
    }
}

/// `fstat64(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller passes fstat(2)'s arguments.
    unsafe {
        if fds::DEVICES.has(fd) {
            return device_stat(st);
        }
        (next().fstat64)(fd, st)
    }
}

/// `ioctl(2)`: the device has no ioctl framework (`ENOTTY`), as a kernel before 4.18.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if fds::DEVICES.has(fd) {
        set_errno(libc::ENOTTY);
        return -1;
    }
    // SAFETY: the caller passes ioctl(2)'s arguments.
    unsafe { (next().ioctl)(fd, request, arg) }
}

/// `write(2)`: on the device, one uverbs command.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    if fds::DEVICES.has(fd) {
        // SAFETY: write(2)'s contract: `buf` holds `len` readable bytes.
        return match unsafe { crate::cmd::execute(fd, buf.cast(), len) } {
            Ok(()) => len as ssize_t,
            Err(errno) => {
                set_errno(errno);
                -1
            }
        };
    }
    // SAFETY: the caller passes write(2)'s arguments.
    unsafe { (next().write)(fd, buf, len) }
}

/// `read(2)`: on an event file, the next event record.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    if fds::EVENTS.has(fd) {
        // SAFETY: read(2)'s contract: `buf` holds `len` writable bytes.
        return unsafe { crate::events::read(fd, buf.cast(), len) };
    }
    // SAFETY: the caller passes read(2)'s arguments.
    unsafe { (next().read)(fd, buf, len) }
}

/// `mmap(2)`: on the device, a UAR page.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if fds::DEVICES.has(fd) {
        return crate::kernel::mmap(fd, len, off);
    }
    // SAFETY: the caller passes mmap(2)'s arguments.
    unsafe { (next().mmap)(addr, len, prot, flags, fd, off) }
}

/// `mmap64(2)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if fds::DEVICES.has(fd) {
        return crate::kernel::mmap(fd, len, off);
    }
    // SAFETY: the caller passes mmap(2)'s arguments.
    unsafe { (next().mmap64)(addr, len, prot, flags, fd, off) }
}

/// `close(2)`: on the device, the file's objects are destroyed as the kernel's
/// `ib_uverbs_close` -> `uverbs_destroy_ufile_hw` does.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fds::DEVICES.has(fd) {
        crate::kernel::close_file(fd);
    }
    if fds::EVENTS.has(fd) {
        crate::events::close(fd);
    }
    // SAFETY: the caller passes close(2)'s arguments.
    unsafe { (next().close)(fd) }
}

/// Sets `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}
