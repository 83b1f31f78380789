//! What the kernel model decided for the objects rdma-core created (its exported
//! `blueflame_kernel_model_*` functions, looked up at run time: the test binary does not
//! link against the preloaded library).

use std::ffi::CStr;

/// `dlsym(RTLD_DEFAULT, name)`.
fn sym(name: &CStr) -> Option<*mut libc::c_void> {
    // SAFETY: dlsym with a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// A QP as the model's kernel made it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpView {
    /// The bfreg index it rings, and whether it is a dynamic one (a thread domain's).
    pub bfreg: u32,
    pub dynamic: bool,
    /// Responder scatter-to-CQE on.
    pub scatter_to_cqe: bool,
}

/// The model's view of QP `qpn`.
pub fn qp(qpn: u32) -> Option<QpView> {
    type F = unsafe extern "C" fn(u32, *mut u32, *mut u32) -> libc::c_int;
    let f = sym(c"blueflame_kernel_model_qp")?;
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    let (mut b, mut s) = (0u32, 0u32);
    // SAFETY: two locals to write.
    (unsafe { f(qpn, &mut b, &mut s) } == 0).then_some(QpView {
        bfreg: b & !(1 << 31),
        dynamic: b >> 31 == 1,
        scatter_to_cqe: s == 1,
    })
}

/// The mini-CQE format bit CQ `cqn` compresses with (0: none).
pub fn cq_compression(cqn: u32) -> Option<u32> {
    type F = extern "C" fn(u32) -> i64;
    let f = sym(c"blueflame_kernel_model_cq_compression")?;
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    u32::try_from(f(cqn)).ok()
}

/// Compressed sessions the NIC wrote to CQ `cqn`.
pub fn cq_sessions(cqn: u32) -> Option<u64> {
    type F = extern "C" fn(u32) -> i64;
    let f = sym(c"blueflame_kernel_model_cq_sessions")?;
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    u64::try_from(f(cqn)).ok()
}

/// Unmaps the on-demand region of `lkey` (the kernel's MMU-notifier invalidation); false
/// when the model has no such region (or is not loaded).
pub fn invalidate_odp(lkey: u32) -> bool {
    type F = extern "C" fn(u32) -> libc::c_int;
    let Some(f) = sym(c"blueflame_kernel_model_invalidate_odp") else {
        return false;
    };
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    f(lkey) == 0
}

/// The model's NIC's atomics for contexts opened from then on: [`Atomics`]; false when the
/// model is not loaded.
pub fn set_atomics(mode: Atomics) -> bool {
    type F = extern "C" fn(libc::c_int);
    let Some(f) = sym(c"blueflame_kernel_model_set_atomics") else {
        return false;
    };
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    f(mode as libc::c_int);
    true
}

/// What [`set_atomics`] gives the NIC.
#[derive(Copy, Clone, Debug)]
pub enum Atomics {
    /// 8-byte replies big-endian: the device reports `IBV_ATOMIC_NONE`, its QPs still take
    /// remote atomic rights.
    BigEndian = 0,
    /// Its own (a current ConnectX).
    Own = 1,
    /// None at all: remote atomic rights are refused (`get_atomic_mode`).
    None = 2,
}

/// Makes the model's NIC stamp completions in real time (`on`) or with its free-running
/// counter, for contexts opened from then on; false when the model is not loaded.
pub fn set_real_time(on: bool) -> bool {
    type F = extern "C" fn(libc::c_int);
    let Some(f) = sym(c"blueflame_kernel_model_set_real_time") else {
        return false;
    };
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    f(on.into());
    true
}

/// Raises an asynchronous event on the model's NIC (`kind` the `ib_event_type`: 0 CQ
/// error, 1 QP fatal, 14 SRQ error, ...; `num` the object's number); false when the model
/// is not loaded or does not raise that kind.
pub fn raise_event(kind: i32, num: u32) -> bool {
    type F = extern "C" fn(libc::c_int, u32) -> libc::c_int;
    let Some(f) = sym(c"blueflame_kernel_model_raise_event") else {
        return false;
    };
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    f(kind, num) == 0
}

/// The verbs state of QP `qpn` in the model (0 RESET, 1 INIT, 2 RTR, 3 RTS, 6 ERR); None
/// when the model is not loaded or has no such QP.
pub fn qp_state(qpn: u32) -> Option<i32> {
    type F = extern "C" fn(u32) -> libc::c_int;
    let f = sym(c"blueflame_kernel_model_qp_state")?;
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    Some(f(qpn)).filter(|s| *s >= 0)
}

/// The requester and responder depths (`max_rd_atomic`, `max_dest_rd_atomic`) QP `qpn`
/// was programmed with in the model; None when the model is not loaded or has no such QP.
pub fn qp_depths(qpn: u32) -> Option<(u8, u8)> {
    type F = extern "C" fn(u32) -> libc::c_int;
    let f = sym(c"blueflame_kernel_model_qp_depths")?;
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    let d = f(qpn);
    (d >= 0).then_some((d as u8, (d >> 8) as u8))
}

/// Makes the model's next modify of a QP to `state` (3: RTS) fail with `errno`; false when
/// the model is not loaded.
pub fn fail_next_modify(state: i32, errno: i32) -> bool {
    type F = extern "C" fn(libc::c_int, libc::c_int);
    let Some(f) = sym(c"blueflame_kernel_model_fail_next_modify") else {
        return false;
    };
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    f(state, errno);
    true
}

/// Runs its function when dropped: puts a setting of the model back however a case ends.
pub struct Restore(pub fn());

impl Drop for Restore {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// Live kernel objects per kind (PD, MR, MW, completion channel, CQ, QP, SRQ) over every
/// open device file; None when the model is not loaded.
pub fn live_objects() -> Option<[i64; 7]> {
    type F = extern "C" fn(u32) -> i64;
    let f = sym(c"blueflame_kernel_model_live_objects")?;
    // SAFETY: the model exports the function with this prototype.
    let f: F = unsafe { std::mem::transmute(f) };
    Some(core::array::from_fn(|k| f(k as u32)))
}
