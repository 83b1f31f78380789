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
use crate::next::{next, set_errno};
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

/// Interposes the path-taking functions `$name` (each with its C library twin in
/// [`crate::next`]): the device node gets `$device`, every other path the C function.
macro_rules! by_path {
    ($( $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, device: $path:ident => $device:expr; )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// As the C function.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller passes the C function's arguments; the path is null or a
            // NUL-terminated string.
            unsafe {
                if is_device($path) {
                    return $device;
                }
                (next().$name)($($arg),*)
            }
        }
    )*};
}

by_path! {
    /// `open(2)`.
    fn open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int,
        device: path => open_device();
    /// `open64(2)`.
    fn open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int,
        device: path => open_device();
    /// `openat(2)`.
    fn openat(dir: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int,
        device: path => open_device();
    /// `openat64(2)`.
    fn openat64(dir: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int,
        device: path => open_device();
    /// `stat(2)`.
    fn stat(path: *const c_char, st: *mut libc::stat) -> c_int,
        device: path => device_stat(st);
    /// `stat64(2)` (`stat` on 64-bit Linux).
    fn stat64(path: *const c_char, st: *mut libc::stat) -> c_int,
        device: path => device_stat(st);
}

/// Interposes the descriptor-taking `fstat` functions: a device descriptor is the
/// character device.
macro_rules! fstat_like {
    ($( $(#[$doc:meta])* fn $name:ident; )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// As the C function.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, st: *mut libc::stat) -> c_int {
            // SAFETY: the caller passes fstat(2)'s arguments.
            unsafe {
                if fds::DEVICES.has(fd) {
                    return device_stat(st);
                }
                (next().$name)(fd, st)
            }
        }
    )*};
}

fstat_like! {
    /// `fstat(2)`.
    fn fstat;
    /// `fstat64(2)`.
    fn fstat64;
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
        // SAFETY: write(2)'s contract: `buf` holds `len` readable bytes for the call.
        let r = unsafe { crate::cmd::decode(buf.cast(), len) }.and_then(|call| {
            let what = (call.ex, call.op);
            let r = crate::kernel::command(fd, call);
            if crate::cmd::trace() {
                let ex = if what.0 { "extended " } else { "" };
                eprintln!("kernel-model: {ex}command {}: {r:?}", what.1);
            }
            r
        });
        return match r {
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

/// Interposes `mmap` and `mmap64`: on a device descriptor, a UAR page.
macro_rules! mmap_like {
    ($( $(#[$doc:meta])* fn $name:ident; )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// As the C function.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
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
            unsafe { (next().$name)(addr, len, prot, flags, fd, off) }
        }
    )*};
}

mmap_like! {
    /// `mmap(2)`: on the device, a UAR page.
    fn mmap;
    /// `mmap64(2)`.
    fn mmap64;
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
        crate::kernel::close_channel(fd);
    }
    // SAFETY: the caller passes close(2)'s arguments.
    unsafe { (next().close)(fd) }
}
