//! The descriptors a completion channel is made of: an eventfd that says "events wait", a
//! `poll` on two descriptors with a timeout, and an epoll set that joins two descriptors
//! into one (what [`CompletionChannel`](crate::CompletionChannel) hands to epoll, mio and
//! tokio users).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes an eventfd readable (adds 1 to its counter).
pub(crate) fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd; a full counter (EAGAIN) still
    // leaves it readable, which is all that is wanted.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Makes an eventfd unreadable (reads its counter back to 0; never blocks).
pub(crate) fn clear(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// Waits until `a` or `b` is readable or `timeout` passes (None: no limit). Returns
/// whether one is readable; an interrupted wait counts as "look again" (true).
pub(crate) fn poll2(a: RawFd, b: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = match timeout {
        None => -1,
        // Rounded up: a wait never ends before its deadline.
        Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
    };
    let mut fds = [a, b].map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: two live pollfd entries.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(true),
            _ => Err(e),
        };
    }
    Ok(rc > 0)
}

/// An epoll set watching `fds` for reading: readable while one of them is.
pub(crate) fn epoll_of(fds: &[RawFd]) -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the result is checked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    for &fd in fds {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: live epoll set and descriptor; `ev` is read by the call.
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(ep)
}

/// An anonymous memory file (`memfd_create`, close-on-exec): the file of a dma-buf
/// exported beside the software NIC.
#[cfg(feature = "sim")]
pub(crate) fn memfd(name: &core::ffi::CStr) -> io::Result<OwnedFd> {
    // SAFETY: plain system call on a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The identity of the file `fd` is open on (its device and inode numbers in one word):
/// the same for every descriptor of that file.
#[cfg(feature = "sim")]
pub(crate) fn identity(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: `stat` is plain data, filled by the call before it is read.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: a live descriptor and a live buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev as u64).rotate_left(40) ^ st.st_ino as u64)
}
