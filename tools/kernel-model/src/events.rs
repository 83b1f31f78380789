//! Event files: completion channels and the asynchronous event descriptor
//! (`ib_uverbs_event_file`). Each is an eventfd in semaphore mode counting the queued
//! events, so `poll`, `epoll` and blocking or non-blocking reads behave as on the kernel's
//! file; `read` is interposed to hand out the queued record
//! (`struct ib_uverbs_comp_event_desc` / `ib_uverbs_async_event_desc`).
//!
//! The kernel counts the events of an object as the user *reads* them
//! (`ib_uverbs_event_read` increments `events_reported`), drops the unread ones when the
//! object is destroyed (`ib_uverbs_release_ucq` / `_uevent`) and returns the count in the
//! destroy response, which libibverbs waits for its acknowledgements to reach
//! (`ibv_destroy_cq` / `_qp` / `_srq`). The model does the same.

use crate::fds::EVENTS;
use crate::next::next;
use libc::c_int;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The object an event is about: its kind and number.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Subject {
    Cq(u32),
    Qp(u32),
    Srq(u32),
    /// Port and device events.
    Device,
}

struct File {
    queue: VecDeque<(Subject, [u8; 16])>,
    /// Events read, per object.
    read: HashMap<Subject, u32>,
    /// The record size of this file (8 for a completion channel, 16 for async events).
    size: usize,
}

fn files() -> MutexGuard<'static, HashMap<c_int, File>> {
    static F: OnceLock<Mutex<HashMap<c_int, File>>> = OnceLock::new();
    F.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A new event file whose records are `size` bytes: its descriptor, for the user.
pub(crate) fn create(size: usize) -> Result<c_int, c_int> {
    // SAFETY: eventfd(2) with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return Err(libc::EMFILE);
    }
    files().insert(
        fd,
        File {
            queue: VecDeque::new(),
            read: HashMap::new(),
            size,
        },
    );
    if !EVENTS.add(fd) {
        files().remove(&fd);
        // SAFETY: the descriptor just made.
        unsafe { (next().close)(fd) };
        return Err(libc::EMFILE);
    }
    Ok(fd)
}

/// Queues an event record about `subject` on file `fd` (nothing when the file is gone).
pub(crate) fn push(fd: c_int, subject: Subject, record: &[u8]) {
    let mut f = files();
    let Some(file) = f.get_mut(&fd) else {
        return;
    };
    let mut r = [0u8; 16];
    r[..record.len().min(16)].copy_from_slice(&record[..record.len().min(16)]);
    file.queue.push_back((subject, r));
    let one: u64 = 1;
    // SAFETY: an 8-byte write of a local to the eventfd (never blocks short of 2^64 - 1).
    unsafe { (next().write)(fd, (&one as *const u64).cast(), 8) };
}

/// The events of `subject` read from file `fd` so far; its unread ones are dropped
/// (the object is being destroyed).
pub(crate) fn reported(fd: c_int, subject: Subject) -> u32 {
    let mut f = files();
    let Some(file) = f.get_mut(&fd) else {
        return 0;
    };
    file.queue.retain(|(s, _)| *s != subject);
    file.read.remove(&subject).unwrap_or(0)
}

/// `read` of an event file: waits as the descriptor's mode says (the eventfd's counter is
/// the number of queued events), then copies the next record.
///
/// # Safety
/// `buf` is valid for `len` bytes of writing.
pub(crate) unsafe fn read(fd: c_int, buf: *mut u8, len: usize) -> isize {
    loop {
        let size = match files().get(&fd) {
            Some(f) => f.size,
            None => {
                crate::next::set_errno(libc::EBADF);
                return -1;
            }
        };
        if len < size {
            crate::next::set_errno(libc::EINVAL);
            return -1;
        }
        let mut n = 0u64;
        // SAFETY: an 8-byte read into a local: blocks (or not) as the user set the file.
        let r = unsafe { libc::syscall(libc::SYS_read, fd, &mut n as *mut u64, 8) };
        if r < 0 {
            return -1;
        }
        let mut f = files();
        let Some(file) = f.get_mut(&fd) else {
            crate::next::set_errno(libc::EBADF);
            return -1;
        };
        // An event of a destroyed object was dropped from the queue: wait for the next.
        let Some((subject, record)) = file.queue.pop_front() else {
            continue;
        };
        *file.read.entry(subject).or_insert(0) += 1;
        // SAFETY: the caller's contract; size <= len.
        unsafe { core::ptr::copy_nonoverlapping(record.as_ptr(), buf, size) };
        return size as isize;
    }
}

/// Forgets an event file (its descriptor is being closed).
pub(crate) fn close(fd: c_int) {
    EVENTS.remove(fd);
    files().remove(&fd);
}
