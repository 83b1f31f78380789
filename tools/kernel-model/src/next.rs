//! The C library's own functions behind the ones this library interposes, looked up once
//! with `dlsym(RTLD_NEXT)`: every call this model does not answer goes to them.

use libc::{c_char, c_int, c_ulong, c_void, off_t, size_t, ssize_t};
use std::sync::OnceLock;

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, libc::mode_t) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, libc::mode_t) -> c_int;
type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type FstatFn = unsafe extern "C" fn(c_int, *mut libc::stat) -> c_int;
type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
type MmapFn = unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;

/// The C library's functions.
pub(crate) struct Next {
    pub(crate) open: OpenFn,
    pub(crate) open64: OpenFn,
    pub(crate) openat: OpenatFn,
    pub(crate) openat64: OpenatFn,
    pub(crate) stat: StatFn,
    pub(crate) stat64: StatFn,
    pub(crate) fstat: FstatFn,
    pub(crate) fstat64: FstatFn,
    pub(crate) ioctl: IoctlFn,
    pub(crate) read: ReadFn,
    pub(crate) write: WriteFn,
    pub(crate) mmap: MmapFn,
    pub(crate) mmap64: MmapFn,
    pub(crate) close: CloseFn,
}

/// `dlsym(RTLD_NEXT, name)` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be a function pointer type matching the C function `name`.
unsafe fn sym<F: Copy>(name: &core::ffi::CStr) -> F {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the definition after this
    // library's, the C library's.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        // Without the C library's function nothing can go on; say which.
        let msg = b"kernel-model: a C library function is missing\n";
        // SAFETY: a raw write(2) of a static buffer to stderr.
        unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
        std::process::abort();
    }
    // SAFETY: the caller's contract: F is the function's pointer type, of pointer size.
    unsafe { core::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// The functions, looked up on first use.
pub(crate) fn next() -> &'static Next {
    static NEXT: OnceLock<Next> = OnceLock::new();
    // SAFETY: each type matches the glibc prototype of the name it is looked up by.
    NEXT.get_or_init(|| unsafe {
        Next {
            open: sym(c"open"),
            open64: sym(c"open64"),
            openat: sym(c"openat"),
            openat64: sym(c"openat64"),
            stat: sym(c"stat"),
            stat64: sym(c"stat64"),
            fstat: sym(c"fstat"),
            fstat64: sym(c"fstat64"),
            ioctl: sym(c"ioctl"),
            read: sym(c"read"),
            write: sym(c"write"),
            mmap: sym(c"mmap"),
            mmap64: sym(c"mmap64"),
            close: sym(c"close"),
        }
    })
}

/// Sets `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}
