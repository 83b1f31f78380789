//! The crate's tests that need rdma-core's libmlx5 over the kernel model's `mlx5_0`
//! (`tools/kernel-model`): each patches one operation of the context libibverbs opened, to
//! behave as another provider does (siw's post, an iWARP device) or to record what the crate
//! hands it, then runs the public API over it. Ignored in a plain `cargo test`; the provider
//! stage (`cargo xtask provider`, its `LIB_CASES`) runs each with the model preloaded.

use crate::caps::QpCaps;
use crate::cm::device_on;
use crate::error::Error;
use crate::resources::Device;
use crate::verbs::device::Context;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A context's `post_send` (`ibv_context_ops`), which the tests below wrap.
type PostSendFn = unsafe extern "C" fn(
    *mut rdma_sys::ibv_qp,
    *mut rdma_sys::ibv_send_wr,
    *mut *mut rdma_sys::ibv_send_wr,
) -> std::os::raw::c_int;

/// The kernel model's mlx5_0, opened (as librdmacm opens a context for its ids).
fn model() -> Arc<Context> {
    Arc::new(Context::open("mlx5_0").expect("mlx5_0 (kernel model)"))
}

/// [`model`], for the verbs path with the classic API (`ibv_post_send`, whose context
/// operation the tests wrap).
fn verbs_legacy() -> Arc<Context> {
    std::env::set_var("BLUEFLAME_PATH", "verbs");
    std::env::set_var("BLUEFLAME_VERBS_API", "legacy");
    model()
}

/// A device over `owner`'s context, port 1, made as `cm` makes one for an rdma_cm id (two
/// such devices share the context's asynchronous events).
fn device(owner: &Arc<Context>) -> Device {
    // SAFETY: the device holds `owner`, which keeps its context open.
    unsafe { device_on(owner.ctx, owner.clone(), 1) }.unwrap()
}

/// Puts `hook` in place of the context's `post_send`, the provider's own kept in `real`.
fn hook_post_send(owner: &Context, real: &OnceLock<PostSendFn>, hook: PostSendFn) {
    // SAFETY: the context is open and nothing posts on it yet.
    unsafe {
        let _ = real.set((*owner.ctx).ops.post_send.unwrap());
        (*owner.ctx).ops.post_send = Some(hook);
    }
}

/// A context's `bind_mw` (`ibv_context_ops`), which the tests below wrap.
type BindFn = unsafe extern "C" fn(
    *mut rdma_sys::ibv_qp,
    *mut rdma_sys::ibv_mw,
    *mut rdma_sys::ibv_mw_bind,
) -> std::os::raw::c_int;

/// Puts `hook` in place of the context's `bind_mw`, the provider's own kept in `real`.
fn hook_bind_mw(owner: &Context, real: &OnceLock<BindFn>, hook: BindFn) {
    // SAFETY: the context is open and nothing binds on it yet.
    unsafe {
        let _ = real.set((*owner.ctx).ops.bind_mw.unwrap());
        (*owner.ctx).ops.bind_mw = Some(hook);
    }
}

/// [`verbs_legacy`] with `hook` in place of the context's `post_send` ([`hook_post_send`]);
/// a device over it.
fn verbs_legacy_with_post_send_hook(
    real: &OnceLock<PostSendFn>,
    hook: PostSendFn,
) -> (Arc<Context>, Device) {
    let owner = verbs_legacy();
    hook_post_send(&owner, real, hook);
    let dev = device(&owner);
    (owner, dev)
}

/// A context's `poll_cq` (`ibv_context_ops`), which the tests below wrap.
type PollCqFn = unsafe extern "C" fn(
    *mut rdma_sys::ibv_cq,
    std::os::raw::c_int,
    *mut rdma_sys::ibv_wc,
) -> std::os::raw::c_int;

/// [`verbs_legacy`] with `hook` in place of the context's `poll_cq` (the provider's own
/// kept in `real`), put there before any CQ is made (a CQ's poller reads the operation
/// once, when it is made: `PollCq::of`); a device over it. `BLUEFLAME_VERBS_API` stays
/// set: the caller unsets it once its CQs and QPs are made (each reads it then).
fn verbs_legacy_with_poll_hook(
    real: &OnceLock<PollCqFn>,
    hook: PollCqFn,
) -> (Arc<Context>, Device) {
    let owner = verbs_legacy();
    // SAFETY: the context is open and has no CQ yet.
    unsafe {
        let _ = real.set((*owner.ctx).ops.poll_cq.unwrap());
        (*owner.ctx).ops.poll_cq = Some(hook);
    }
    let dev = device(&owner);
    (owner, dev)
}

/// A context's `create_cq_ex` (`verbs_context`), which the tests below wrap.
type CreateCqExFn = unsafe extern "C" fn(
    *mut rdma_sys::ibv_context,
    *mut rdma_sys::ibv_cq_init_attr_ex,
) -> *mut rdma_sys::ibv_cq_ex;

/// The model's `mlx5_0` on the verbs path with rdma-core's extended API, its context's
/// `create_cq_ex` replaced by `hook` (the provider's own kept in `real`), so that the hook
/// sees each CQ before the crate reads its polling operations; a device over it.
fn verbs_extended_with_cq_hook(
    real: &OnceLock<CreateCqExFn>,
    hook: CreateCqExFn,
) -> (Arc<Context>, Device) {
    verbs_extended_with(|vc| {
        let _ = real.set(vc.create_cq_ex.unwrap());
        vc.create_cq_ex = Some(hook);
    })
}

/// The model's `mlx5_0` on the verbs path with rdma-core's extended API, its context's
/// extended operations (`verbs_context`) changed by `wrap` before anything is made on it;
/// a device over it.
fn verbs_extended_with(wrap: impl FnOnce(&mut rdma_sys::verbs_context)) -> (Arc<Context>, Device) {
    std::env::set_var("BLUEFLAME_PATH", "verbs");
    std::env::set_var("BLUEFLAME_VERBS_API", "extended");
    let owner = model();
    // SAFETY: the context is open and nothing was made on it yet; its extended context
    // (`container_of(ctx, struct verbs_context, context)`, libibverbs' own) has the
    // operations (the crate's `ctx_op!` finds it the same way).
    unsafe {
        let vc = owner
            .ctx
            .cast::<u8>()
            .sub(std::mem::offset_of!(rdma_sys::verbs_context, context))
            .cast::<rdma_sys::verbs_context>();
        wrap(&mut *vc);
    }
    let dev = device(&owner);
    std::env::remove_var("BLUEFLAME_PATH");
    std::env::remove_var("BLUEFLAME_VERBS_API");
    (owner, dev)
}

/// An `ibv_qp_ex`'s `wr_complete` (the tests below wrap libmlx5's).
type CompleteFn = unsafe extern "C" fn(*mut rdma_sys::ibv_qp_ex) -> std::os::raw::c_int;

/// libmlx5's `create_qp_ex`, `wr_start` and `wr_complete`, kept by
/// [`verbs_extended_with_complete_hook`]'s wrappers; the hook it puts in place.
static REAL_CREATE_QP: OnceLock<
    unsafe extern "C" fn(
        *mut rdma_sys::ibv_context,
        *mut rdma_sys::ibv_qp_init_attr_ex,
    ) -> *mut rdma_sys::ibv_qp,
> = OnceLock::new();
static REAL_WR_START: OnceLock<unsafe extern "C" fn(*mut rdma_sys::ibv_qp_ex)> = OnceLock::new();
static REAL_WR_COMPLETE: OnceLock<CompleteFn> = OnceLock::new();
/// The hook of the last [`verbs_extended_with_complete_hook`] (replaced at each call, so
/// that cases run in one process each get their own).
static COMPLETE_HOOK: std::sync::Mutex<Option<CompleteFn>> = std::sync::Mutex::new(None);

/// libmlx5's own `wr_complete`, for a hook to call (set at the first post).
fn real_complete() -> CompleteFn {
    *REAL_WR_COMPLETE.get().unwrap()
}

/// [`verbs_extended_with`], each QP's `wr_complete` replaced by `hook` from its first post
/// on: libmlx5 puts its real `wr_complete` (`mlx5_send_wr_complete`) in place of the one
/// that refuses everything only when the QP reaches RTS (`set_qp_operational_state`), and
/// the crate reads the field at each post, so the QP's `wr_start` puts the hook there
/// (the first post's real one kept: [`real_complete`]).
fn verbs_extended_with_complete_hook(hook: CompleteFn) -> (Arc<Context>, Device) {
    use rdma_sys as ffi;
    unsafe extern "C" fn start(q: *mut ffi::ibv_qp_ex) {
        // SAFETY: a live QP in RTS (the crate posts only then), between its own
        // `wr_start` and the crate's `wr_complete`.
        unsafe {
            (REAL_WR_START.get().unwrap())(q);
            let _ = REAL_WR_COMPLETE.set((*q).wr_complete.unwrap());
            (*q).wr_complete = *COMPLETE_HOOK.lock().unwrap();
        }
    }
    unsafe extern "C" fn create(
        ctx: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_qp_init_attr_ex,
    ) -> *mut ffi::ibv_qp {
        // SAFETY: the provider's own operation; a QP it returns is live, and the crate
        // reads its `wr_start` once this returns.
        unsafe {
            let qp = (REAL_CREATE_QP.get().unwrap())(ctx, attr);
            if !qp.is_null() {
                let q = ffi::ibv_qp_to_qp_ex(qp);
                let _ = REAL_WR_START.set((*q).wr_start.unwrap());
                (*q).wr_start = Some(start);
            }
            qp
        }
    }
    *COMPLETE_HOOK.lock().unwrap() = Some(hook);
    verbs_extended_with(|vc| {
        let _ = REAL_CREATE_QP.set(vc.create_qp_ex.unwrap());
        vc.create_qp_ex = Some(create);
    })
}

/// A CQ's `start_poll` (`ibv_cq_ex`), which the tests below wrap.
type StartPollFn = unsafe extern "C" fn(
    *mut rdma_sys::ibv_cq_ex,
    *mut rdma_sys::ibv_poll_cq_attr,
) -> std::os::raw::c_int;

/// A `create_cq_ex` hook's work ([`verbs_extended_with_cq_hook`]): the provider's own
/// (`real`) makes the CQ, whose operations `wrap` then changes (a CQ it returns is live,
/// its polling operations set, and nothing polls it yet).
///
/// # Safety
/// As the context's `create_cq_ex`, with `real` set to the provider's own.
unsafe fn create_cq_then(
    real: &OnceLock<CreateCqExFn>,
    ctx: *mut rdma_sys::ibv_context,
    attr: *mut rdma_sys::ibv_cq_init_attr_ex,
    wrap: impl FnOnce(&mut rdma_sys::ibv_cq_ex),
) -> *mut rdma_sys::ibv_cq_ex {
    // SAFETY: the provider's own operation, as the caller's contract says; a CQ it returns
    // is live and not shared yet.
    unsafe {
        let cq = (real.get().unwrap())(ctx, attr);
        if let Some(cq) = cq.as_mut() {
            wrap(cq);
        }
        cq
    }
}

/// [`create_cq_then`] replacing the CQ's `start_poll` by `start` (the provider's kept in
/// `real_start`: every CQ of a provider has the same).
///
/// # Safety
/// As [`create_cq_then`].
unsafe fn create_cq_wrapping_start(
    real: &OnceLock<CreateCqExFn>,
    real_start: &OnceLock<StartPollFn>,
    start: StartPollFn,
    ctx: *mut rdma_sys::ibv_context,
    attr: *mut rdma_sys::ibv_cq_init_attr_ex,
) -> *mut rdma_sys::ibv_cq_ex {
    // SAFETY: the caller's contract.
    unsafe {
        create_cq_then(real, ctx, attr, |cq| {
            let _ = real_start.set(cq.start_poll.unwrap());
            cq.start_poll = Some(start);
        })
    }
}

/// The model's `mlx5_0` on the verbs path with rdma-core's `api` ("extended" or
/// "legacy"), and a device over it.
fn verbs_model(api: &str) -> (Arc<Context>, Device) {
    match api {
        "extended" => verbs_extended_with(|_| {}),
        _ => {
            let owner = verbs_legacy();
            let dev = device(&owner);
            (owner, dev)
        }
    }
}

/// Polls `cq` into one slot of `out` (or all of it, `many`) until a poll reports
/// something or `deadline` passes: how many it reported.
fn poll_until_reported(
    cq: &mut crate::Cq,
    out: &mut [crate::Completion; 4],
    many: bool,
    deadline: std::time::Instant,
) -> usize {
    let mut got = 0;
    while got == 0 && std::time::Instant::now() < deadline {
        got = match many {
            false => cq.poll(&mut out[..1]),
            true => cq.poll(out),
        };
    }
    got
}

/// `(cookie, opcode, status, QP number)` of the one completion in `got`, if one; an error's
/// opcode (not defined for it, not reported) taken as `opcode`.
fn the_one_reported(
    got: &[crate::Completion],
    opcode: crate::WcOpcode,
) -> Option<(u64, crate::WcOpcode, crate::WcStatus, u32)> {
    match got {
        [c] => Some((
            c.cookie,
            if c.is_ok() { c.opcode } else { opcode },
            c.status,
            c.qpn,
        )),
        _ => None,
    }
}

/// What `make` makes with the verbs path and rdma-core's `api` asked for (both are read
/// when a CQ, SRQ or QP is made), the variables unset again after it.
fn on_verbs_api<T>(api: &str, make: impl FnOnce() -> T) -> T {
    std::env::set_var("BLUEFLAME_PATH", "verbs");
    std::env::set_var("BLUEFLAME_VERBS_API", api);
    let made = make();
    std::env::remove_var("BLUEFLAME_PATH");
    std::env::remove_var("BLUEFLAME_VERBS_API");
    made
}

/// `qp` connected to itself (its own endpoint: a loop, as the model's cases use one).
fn connected_to_itself(mut qp: crate::Qp) -> crate::Qp {
    let e = qp.endpoint().unwrap();
    qp.connect(&e).unwrap();
    qp
}

/// Waits until the 8 bytes at `offset` of `mr` are all `byte` (a write landed), at most
/// until `deadline`; `what` names the wait in the failure.
fn wait_landed(
    mr: &crate::MemoryRegion,
    offset: usize,
    byte: u8,
    deadline: std::time::Instant,
    what: &str,
) {
    while mr.read_u64(offset).unwrap() != u64::from_ne_bytes([byte; 8]) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the write did not land"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Two RC QPs of `dev` on one CQ, connected to each other.
fn pair(dev: &Device) -> (crate::Pd, crate::Cq, crate::Qp, crate::Qp) {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut q1 = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let mut q2 = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let (e1, e2) = (q1.endpoint().unwrap(), q2.endpoint().unwrap());
    q1.connect(&e2).unwrap();
    q2.connect(&e1).unwrap();
    (pd, cq, q1, q2)
}

/// [`pair`] on the verbs path, and a region of 64 bytes its requests write (the region
/// and its first byte's remote address).
fn verbs_pair_with_region(
    dev: &Device,
) -> (
    crate::Pd,
    crate::Cq,
    crate::Qp,
    crate::Qp,
    crate::MemoryRegion,
    crate::Remote,
) {
    use crate::{Access, QueuePair};
    let (pd, cq, q1, q2) = pair(dev);
    assert_eq!(q1.data_path(), crate::DataPath::Verbs);
    let mr = pd
        .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let remote = mr.remote(0).unwrap();
    (pd, cq, q1, q2, mr, remote)
}

/// rdma-core's siw provider (`providers/siw/siw.c`, `siw_post_send`) sets `*bad_wr` at
/// the first request it refuses (`push_send_wqe`: `IBV_WR_RDMA_WRITE_WITH_IMM`,
/// `IBV_WR_SEND_WITH_IMM`, `IBV_WR_LOCAL_INV`, ... map to an unsupported opcode and
/// return -EINVAL), then, when it pushed some before it and the SQ was idle, rings the
/// doorbell with `rv = siw_db(qp)`, which overwrites the refusal: it returns 0 with
/// `*bad_wr` set and the requests from it on not posted. With nothing pushed it returns
/// the negative errno. Emulated here over libmlx5's own `post_send` (the kernel model's
/// mlx5_0, verbs path, classic API): the batch must not be reported posted whole, and
/// every signaled request reported posted must complete.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_provider_that_refuses_midway_with_zero_loses_no_request() {
    use crate::{Completion, Payload, PostFlags, PostSend, Request};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    static REAL: OnceLock<PostSendFn> = OnceLock::new();
    unsafe extern "C" fn siw_like(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        let real = *REAL.get().unwrap();
        // SAFETY: the list libibverbs' caller built; `bad` is valid.
        unsafe {
            *bad = std::ptr::null_mut();
            let refused = |w: *mut ffi::ibv_send_wr| {
                matches!(
                    (*w).opcode,
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                        | ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
                )
            };
            let (mut prev, mut w) = (std::ptr::null_mut::<ffi::ibv_send_wr>(), wr);
            while !w.is_null() && !refused(w) {
                prev = w;
                w = (*w).next;
            }
            if w.is_null() {
                return real(qp, wr, bad);
            }
            if prev.is_null() {
                *bad = w;
                return -libc::EINVAL;
            }
            (*prev).next = std::ptr::null_mut();
            let rc = real(qp, wr, bad);
            (*prev).next = w;
            *bad = w;
            rc // siw: the doorbell's result
        }
    }
    let (_owner, dev) = verbs_legacy_with_post_send_hook(&REAL, siw_like);
    let (_pd, mut cq, mut q1, _q2, _mr, remote) = verbs_pair_with_region(&dev);
    // One request siw refuses alone: its error should be the errno, not its negation.
    let alone = Request::WriteImm {
        remote,
        data: Payload::Inline(&[2]),
        imm: 5,
    };
    let err = q1.post(&alone, 9, PostFlags::SIGNALED).unwrap_err();
    eprintln!("a refused request alone: {err} ({err:?})");
    // A batch: a write siw posts, then a write with immediate it refuses.
    let mut b = q1.batch();
    let write = Request::Write {
        remote,
        data: Payload::Inline(&[1]),
    };
    b.push(&write, 1, PostFlags::SIGNALED).unwrap();
    b.push(&alone, 2, PostFlags::SIGNALED).unwrap();
    let rung = b.ring();
    let mut out = [Completion::default(); 4];
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        let n = cq.poll(&mut out);
        got.extend(out[..n].iter().map(|c| (c.cookie, c.status)));
    }
    eprintln!("ring: {rung:?}; completions: {got:?}");
    assert!(
        matches!(err, Error::Verbs(ref v) if v.source.raw_os_error() == Some(libc::EINVAL)),
        "siw's negative errno reported as is: {err:?}"
    );
    assert!(
        rung.is_err() || got.iter().any(|&(c, _)| c == 2),
        "the batch was reported posted ({rung:?}) and request 2 never completed: {got:?}"
    );
}

/// The cookies and statuses of `cq`'s completions: polled until `n` came (or 5 s passed),
/// then once more a little later, so a request reported twice shows.
fn completions(cq: &mut crate::Cq, n: usize) -> Vec<(u64, crate::WcStatus)> {
    let mut out = [crate::Completion::default(); 8];
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    while got.len() < n && t.elapsed() < Duration::from_secs(5) {
        let k = cq.poll(&mut out);
        got.extend(out[..k].iter().map(|c| (c.cookie, c.status)));
    }
    std::thread::sleep(Duration::from_millis(50));
    let k = cq.poll(&mut out);
    got.extend(out[..k].iter().map(|c| (c.cookie, c.status)));
    got
}

/// The provider's own `post_send`, which [`doorbell_fails`] hands requests to.
static DOORBELL_REAL: OnceLock<PostSendFn> = OnceLock::new();
/// What [`doorbell_fails`] returns after the provider took the requests; 0: the
/// provider's result.
static DOORBELL_ERROR: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Makes [`doorbell_fails`] fail with `rc` (`on`) or pass requests through.
fn doorbell_fail(on: bool, rc: i32) {
    let rc = if on { rc } else { 0 };
    DOORBELL_ERROR.store(rc, std::sync::atomic::Ordering::Relaxed);
}

/// A `post_send` whose doorbell fails after the provider took every request (siw's
/// `siw_db`, rxe's `post_send_db`): the provider's own post ([`DOORBELL_REAL`]), then,
/// while [`doorbell_fail`] says so, that error with `bad_wr` NULL.
unsafe extern "C" fn doorbell_fails(
    qp: *mut rdma_sys::ibv_qp,
    wr: *mut rdma_sys::ibv_send_wr,
    bad: *mut *mut rdma_sys::ibv_send_wr,
) -> std::os::raw::c_int {
    // SAFETY: the caller's arguments, handed on.
    let rc = unsafe { (DOORBELL_REAL.get().unwrap())(qp, wr, bad) };
    let fail = DOORBELL_ERROR.load(std::sync::atomic::Ordering::Relaxed);
    if rc != 0 || fail == 0 {
        return rc;
    }
    // SAFETY: `bad` is valid; every request was taken.
    unsafe { *bad = std::ptr::null_mut() };
    fail
}

/// On a [`verbs_pair_with_region`] of `dev`, its first QP given to `prepare`: posts an
/// inline write straight (cookie 1) and in a batch of two (2, 3) with `fail(true)` (the
/// doorbell fails after the provider took them), then, after `fail(false)`, what `between`
/// posts and the write again (4). Each of 1-4 must be reported posted and complete once,
/// successfully: taken back, 1-3's positions went to the next requests, whose cookies their
/// completions were then reported under.
fn writes_through_a_failed_doorbell(
    dev: &Device,
    prepare: impl FnOnce(&mut crate::Qp),
    fail: impl Fn(bool),
    between: impl FnOnce(&mut crate::Qp, &crate::Request<'_>),
) {
    use crate::{Payload, PostFlags, PostSend, Request};
    let (_pd, mut cq, mut q, _q2, _mr, remote) = verbs_pair_with_region(dev);
    prepare(&mut q);
    let (q, cq) = (&mut q, &mut cq);
    let write = &Request::Write {
        remote,
        data: Payload::Inline(&[1]),
    };
    fail(true);
    let straight = q.post(write, 1, PostFlags::SIGNALED);
    let mut b = q.batch();
    b.push(write, 2, PostFlags::SIGNALED).unwrap();
    b.push(write, 3, PostFlags::SIGNALED).unwrap();
    let rung = b.ring();
    fail(false);
    between(q, write);
    let after = q.post(write, 4, PostFlags::SIGNALED);
    assert!(
        straight.is_ok() && rung.is_ok() && after.is_ok(),
        "requests the provider took are posted: {straight:?}, {rung:?}, {after:?}"
    );
    let got = completions(cq, 4);
    let cookies: Vec<u64> = got.iter().map(|&(c, _)| c).collect();
    assert_eq!(
        cookies,
        [1, 2, 3, 4],
        "each request completes once: {got:?}"
    );
    assert!(
        got.iter().all(|&(_, s)| s == crate::WcStatus::Success),
        "{got:?}"
    );
}

/// A doorbell that fails after the provider put the requests in its ring (siw's
/// `siw_post_send` returns `siw_db`'s -1 with `*bad_wr` NULL once every request is in its
/// ring; rxe's `post_send` returns `post_send_db`'s errno the same way) leaves them posted:
/// the kernel runs or flushes them, so each signaled one completes. Emulated over
/// libmlx5's `post_send` (the kernel model's mlx5_0, verbs path, classic API), which posts
/// them, then the hook reports the failure. Taken back, as before, the queue gave their
/// positions to the next requests, whose cookies their completions were then reported
/// under: a request posted straight (1) and a batch (2, 3) with the failure, then one
/// without (4), must complete as 1, 2, 3 and 4, each once.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_doorbell_that_fails_after_the_provider_took_the_requests_loses_none() {
    let (_owner, dev) = verbs_legacy_with_post_send_hook(&DOORBELL_REAL, doorbell_fails);
    // siw_db: write(2)'s result.
    writes_through_a_failed_doorbell(&dev, |_| {}, |on| doorbell_fail(on, -1), |_, _| {});
}

/// rxe's `wr_complete` (rdma-core `providers/rxe/rxe.c`) publishes the requests (the
/// producer index) before its doorbell (`post_send_db`), whose error it then returns: the
/// requests are posted, and each signaled one completes. Only a builder's refusal
/// (`ENOSPC`) comes with nothing posted. Emulated over libmlx5's extended API (the kernel
/// model's mlx5_0), the QP's send queue told it is rxe's (`VerbsSendQueue::set_rxe`): the
/// hook completes the requests, then reports `EINVAL`; or aborts them and reports
/// `ENOSPC`. A request posted straight (1) and a batch (2, 3) after a doorbell's failure,
/// one refused with `ENOSPC` (9, nothing posted), then one without either (4): they
/// complete as 1, 2, 3 and 4, each once (taken back, 1-3's positions went to the next
/// requests, whose cookies their completions were reported under).
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn on_rxe_a_doorbell_that_fails_in_wr_complete_loses_no_request() {
    use crate::{PostFlags, PostSend, QueuePair};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::atomic::{AtomicI32, Ordering};
    /// 0: complete; EINVAL: complete, then the doorbell's error; ENOSPC: abort.
    static FAIL: AtomicI32 = AtomicI32::new(0);
    unsafe extern "C" fn complete(q: *mut ffi::ibv_qp_ex) -> c_int {
        // SAFETY: a live QP between `ibv_wr_start` and `ibv_wr_complete`; the provider's
        // own operations.
        unsafe {
            match FAIL.load(Ordering::Relaxed) {
                libc::ENOSPC => {
                    ((*q).wr_abort.unwrap())(q);
                    libc::ENOSPC
                }
                rc => match real_complete()(q) {
                    0 => rc,
                    e => e,
                },
            }
        }
    }
    let (_owner, dev) = verbs_extended_with_complete_hook(complete);
    let rxe = |q: &mut crate::Qp| {
        assert_eq!(q.verbs_api(), Some(crate::VerbsApi::Extended));
        q.verbs_send_queue().unwrap().set_rxe(true);
    };
    let fail = |on| FAIL.store(if on { libc::EINVAL } else { 0 }, Ordering::Relaxed);
    writes_through_a_failed_doorbell(&dev, rxe, fail, |q, write| {
        FAIL.store(libc::ENOSPC, Ordering::Relaxed);
        let refused = q.post(write, 9, PostFlags::SIGNALED);
        FAIL.store(0, Ordering::Relaxed);
        assert!(
            matches!(refused, Err(Error::Verbs(ref v)) if v.source.raw_os_error() == Some(libc::ENOSPC)),
            "a builder's refusal posts nothing: {refused:?}"
        );
    });
}

/// A request posted straight (one request, nothing queued) that rdma-core refuses leaves
/// the verbs send queue as it was before it (`unpost`): its position (the next request is
/// posted with the refused one's sequence number in its `wr_id`, the room is as before, and no
/// work is left outstanding: a region dropped then is deregistered at once) and its
/// completion moderation (the request the queue signals in a run of unsignaled ones is the
/// same as in a run without the refusals). On the classic API the model's `post_send`
/// refuses the request; on the extended API its `ibv_wr_complete` aborts it
/// (`ibv_wr_abort`) and returns `EINVAL`, as libmlx5's `mlx5_send_wr_complete` does after
/// a builder failed; each records the requests it posts.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_refused_straight_post_leaves_the_send_queue_as_it_was() {
    use crate::{Access, Payload, PostFlags, PostSend, QueuePair, Request};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    /// The next request is refused.
    static REFUSE: AtomicBool = AtomicBool::new(false);
    /// `(qp_num, position, signaled)` of each request posted (the position: the low 16
    /// bits of its `wr_id`).
    static POSTED: Mutex<Vec<(u32, u64, bool)>> = Mutex::new(Vec::new());
    static REAL_POST: OnceLock<PostSendFn> = OnceLock::new();
    /// Records a request posted (or says it is to be refused).
    fn posting(qp_num: u32, wr_id: u64, flags: u32) -> bool {
        if REFUSE.swap(false, Ordering::Relaxed) {
            return false;
        }
        let signaled = flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        // The request's position (the queue's incarnation above it differs between runs).
        POSTED
            .lock()
            .unwrap()
            .push((qp_num, wr_id & 0xffff, signaled));
        true
    }
    unsafe extern "C" fn post_send(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        // SAFETY: the list libibverbs' caller built (one request: a straight post), of a
        // live QP; `bad` is valid.
        unsafe {
            if !posting((*qp).qp_num, (*wr).wr_id, (*wr).send_flags) {
                *bad = wr;
                return libc::EINVAL;
            }
            (REAL_POST.get().unwrap())(qp, wr, bad)
        }
    }
    unsafe extern "C" fn complete(q: *mut ffi::ibv_qp_ex) -> c_int {
        // SAFETY: a live QP between `ibv_wr_start` and `ibv_wr_complete`; the provider's
        // own operations.
        unsafe {
            if !posting((*q).qp_base.qp_num, (*q).wr_id, (*q).wr_flags) {
                ((*q).wr_abort.unwrap())(q);
                return libc::EINVAL;
            }
            real_complete()(q)
        }
    }
    for (api, want) in [
        ("legacy", crate::VerbsApi::Legacy),
        ("extended", crate::VerbsApi::Extended),
    ] {
        let (_owner, dev) = match want {
            crate::VerbsApi::Legacy => verbs_legacy_with_post_send_hook(&REAL_POST, post_send),
            _ => verbs_extended_with_complete_hook(complete),
        };
        let pd = dev.alloc_pd().unwrap();
        let mr = pd
            .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let remote = mr.remote(0).unwrap();
        // The same unsignaled writes on two queues, each on a CQ of its own: the first with
        // a refused request before each of its first two writes (a write with immediate,
        // then an inline write: `post_single` and `write_inline_straight`), the second
        // without.
        let mut runs = Vec::new();
        let mut keep = Vec::new();
        for refusals in [2u64, 0] {
            let cq = dev.create_cq(1024).unwrap();
            let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
            assert_eq!(qp.verbs_api(), Some(want), "{api}");
            let e = qp.endpoint().unwrap();
            qp.connect(&e).unwrap();
            let half = u64::from(qp.send_depth() / 2);
            for i in 0..half + 2 {
                if i < refusals {
                    let free = qp.free_send();
                    REFUSE.store(true, Ordering::Relaxed);
                    let err = match i {
                        0 => qp.post(
                            &Request::WriteImm {
                                remote,
                                data: Payload::Inline(&[1]),
                                imm: 1,
                            },
                            100,
                            PostFlags::UNSIGNALED,
                        ),
                        _ => qp.write_inline(&[1], remote, 101, PostFlags::UNSIGNALED),
                    }
                    .unwrap_err();
                    assert!(!REFUSE.load(Ordering::Relaxed), "{api}: not refused");
                    assert!(
                        matches!(err, Error::Verbs(ref v) if v.source.raw_os_error() == Some(libc::EINVAL)),
                        "{api}: {err:?}"
                    );
                    assert_eq!(
                        qp.free_send(),
                        free,
                        "{api}: a refused request kept its room"
                    );
                    if i == 0 {
                        // Nothing is posted on the device: a region dropped now waits for
                        // nothing.
                        drop(pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap());
                        assert_eq!(
                            pd.reclaim(),
                            0,
                            "{api}: a refused request left work outstanding"
                        );
                    }
                }
                qp.write_inline(&[7; 8], remote, i, PostFlags::UNSIGNALED)
                    .unwrap();
            }
            let qpn = qp.qpn();
            let posted: Vec<(u64, bool)> = POSTED
                .lock()
                .unwrap()
                .iter()
                .filter(|p| p.0 == qpn)
                .map(|p| (p.1, p.2))
                .collect();
            // Without refusals: positions 0, 1, ..., the request after half a queue of
            // unsignaled ones signaled (`post_single_now`), and no other.
            if refusals == 0 {
                let signaled: Vec<u64> = posted.iter().filter(|p| p.1).map(|p| p.0).collect();
                assert_eq!(signaled, [half], "{api}: {posted:?}");
                assert!(
                    posted.iter().map(|p| p.0).eq(0..half + 2),
                    "{api}: {posted:?}"
                );
            }
            runs.push(posted);
            keep.push((cq, qp));
        }
        std::env::remove_var("BLUEFLAME_PATH");
        std::env::remove_var("BLUEFLAME_VERBS_API");
        assert_eq!(
            runs[0], runs[1],
            "{api}: (wr_id, signaled) of each request posted with refusals among them, then \
             without"
        );
    }
}

/// On an iWARP device (siw, irdma in iWARP mode) a send or write posted after an RDMA
/// read completes before it (siw completes the read at its response, the others once
/// sent), while the verbs queue retires everything before a completed position: every
/// request there carries `IBV_SEND_FENCE` (siw's read fence), so completions come in
/// order. The kernel model's mlx5_0 is made to say iWARP, and its `post_send` records the
/// flags it is given (verbs path, classic API).
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn on_iwarp_a_request_after_a_read_is_fenced() {
    use crate::{Access, Completion, PostFlags, PostSend};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::Mutex;
    static REAL: OnceLock<PostSendFn> = OnceLock::new();
    static SEEN: Mutex<Vec<(u32, u32)>> = Mutex::new(Vec::new());
    unsafe extern "C" fn recording(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        // SAFETY: the list libibverbs' caller built.
        unsafe {
            let mut w = wr;
            while !w.is_null() {
                SEEN.lock().unwrap().push(((*w).opcode, (*w).send_flags));
                w = (*w).next;
            }
            (REAL.get().unwrap())(qp, wr, bad)
        }
    }
    let owner = verbs_legacy();
    hook_post_send(&owner, &REAL, recording);
    // SAFETY: the context is open and nothing uses it yet; the device struct is
    // libibverbs' own, read by the crate when a send queue is made.
    unsafe { (*(*owner.ctx).device).transport_type = ffi::ibv_transport_type::IBV_TRANSPORT_IWARP };
    let dev = device(&owner);
    let (pd, mut cq, mut q1, _q2) = pair(&dev);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.alloc_mr(4096, rights).unwrap();
    q1.read(
        &[mr.sge(0, 8).unwrap()],
        mr.remote(1024).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    q1.write_inline(&[7; 8], mr.remote(2048).unwrap(), 2, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll_n(&mut out, 2, 1 << 34), 2);
    let seen = SEEN.lock().unwrap().clone();
    let fence = ffi::ibv_send_flags::IBV_SEND_FENCE.0;
    let after_read = seen
        .iter()
        .skip_while(|(op, _)| *op != ffi::ibv_wr_opcode::IBV_WR_RDMA_READ)
        .nth(1)
        .copied();
    assert!(
        matches!(after_read, Some((_, f)) if f & fence != 0),
        "the request after the read was not fenced: {seen:?}"
    );
}

/// rxe's `ibv_bind_mw` (`rxe_bind_mw`, rdma-core `providers/rxe/rxe.c`) posts a type-1
/// bind through `rxe_post_send`, which puts it in the ring and then returns its doorbell's
/// error: the same result as a refusal's, though the bind is posted and completes. So on
/// rxe the crate posts the bind with `ibv_post_send` itself, whose `bad_wr` tells the two
/// apart. Emulated over libmlx5's classic API (the kernel model's mlx5_0), the QP told it
/// is rxe's: `bind_mw` hooked to bind and then fail as rxe's does after a failed doorbell
/// (the crate must not take that for a refusal, nor call it), `post_send` hooked to post
/// and then fail with `bad_wr` NULL. A bind (1) through the failed doorbell, then a write
/// through the window (2): the bind is `Ok` with the window's next key, and both complete,
/// each once.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn on_rxe_a_type1_bind_through_a_failed_doorbell_is_posted() {
    use crate::{Access, MwType, PostFlags, PostSend, Remote};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::atomic::{AtomicBool, Ordering};
    static REAL_BIND: OnceLock<BindFn> = OnceLock::new();
    static FAIL: AtomicBool = AtomicBool::new(false);
    unsafe extern "C" fn bind_then_fail(
        qp: *mut ffi::ibv_qp,
        mw: *mut ffi::ibv_mw,
        bind: *mut ffi::ibv_mw_bind,
    ) -> c_int {
        // SAFETY: the caller's arguments, handed on.
        let rc = unsafe { (REAL_BIND.get().unwrap())(qp, mw, bind) };
        if rc != 0 || !FAIL.load(Ordering::Relaxed) {
            return rc;
        }
        libc::EINVAL
    }
    let owner = verbs_legacy();
    hook_post_send(&owner, &DOORBELL_REAL, doorbell_fails);
    hook_bind_mw(&owner, &REAL_BIND, bind_then_fail);
    let dev = device(&owner);
    let (pd, mut cq, mut q, _q2) = pair(&dev);
    q.verbs_send_queue().unwrap().set_rxe(true);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let mr = pd.alloc_mr(4096, rights).unwrap();
    let mut mw = pd.alloc_mw(MwType::One).unwrap();
    let before = mw.rkey();
    FAIL.store(true, Ordering::Relaxed);
    let bound = q.bind_mw(
        &mut mw,
        &mr,
        0,
        64,
        Access::REMOTE_WRITE,
        1,
        PostFlags::SIGNALED,
    );
    FAIL.store(false, Ordering::Relaxed);
    let key = bound.expect("posted: the doorbell failed after the provider took the bind");
    assert_eq!(key, mlx5::request::next_key_variant(before));
    let at = Remote {
        addr: mr.addr(),
        rkey: key,
    };
    q.write_inline(b"through", at, 2, PostFlags::SIGNALED)
        .unwrap();
    let got = completions(&mut cq, 2);
    let ok = crate::WcStatus::Success;
    assert_eq!(got, [(1, ok), (2, ok)], "each request completes once");
    assert!(mw.is_bound());
    let mut landed = [0u8; 7];
    mr.read(0, &mut landed).unwrap();
    assert_eq!(&landed, b"through");
}

/// A type-1 bind on the verbs path carries the fence asked for and the one armed by the
/// bind before it, as every other request does (`ibv_bind_mw`'s `send_flags`; it had
/// only SIGNALED). The kernel model's `bind_mw` records the flags it is given.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_type1_bind_on_the_verbs_path_is_fenced_as_asked() {
    use crate::{Access, Completion, Fence, MwType, PostFlags};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::Mutex;
    static REAL: OnceLock<BindFn> = OnceLock::new();
    static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    unsafe extern "C" fn recording(
        qp: *mut ffi::ibv_qp,
        mw: *mut ffi::ibv_mw,
        bind: *mut ffi::ibv_mw_bind,
    ) -> c_int {
        // SAFETY: the bind libibverbs' caller gave.
        unsafe {
            SEEN.lock().unwrap().push((*bind).send_flags);
            (REAL.get().unwrap())(qp, mw, bind)
        }
    }
    std::env::set_var("BLUEFLAME_PATH", "verbs");
    let owner = model();
    hook_bind_mw(&owner, &REAL, recording);
    let dev = device(&owner);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let me = qp.endpoint().unwrap();
    qp.connect(&me).unwrap();
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let mr = pd.alloc_mr(4096, rights).unwrap();
    let mut mw = pd.alloc_mw(MwType::One).unwrap();
    let w = Access::REMOTE_WRITE;
    let fenced = PostFlags::SIGNALED.fence(Fence::SmallAndFence);
    qp.bind_mw(&mut mw, &mr, 0, 64, w, 1, fenced).unwrap();
    qp.bind_mw(&mut mw, &mr, 0, 128, w, 2, PostFlags::SIGNALED)
        .unwrap();
    let mut out = [Completion::default(); 4];
    assert_eq!(cq.poll_n(&mut out, 2, 1 << 34), 2);
    let fence = ffi::ibv_send_flags::IBV_SEND_FENCE.0;
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(|f| f & fence != 0).collect::<Vec<_>>(),
        [true, true],
        "asked for, then armed by the bind before: {seen:?}"
    );
}

/// librdmacm opens one `ibv_context` per device and hands it to every id on it, so two
/// connections made without `_on` (`device_of` each time) are two `Device`s over one
/// context, one asynchronous event descriptor. What one of them reads must reach the
/// other (each had a record of its own, and an event one read was lost to the other).
/// This builds the two devices as `device_of` does, over the kernel model's mlx5_0 (no
/// rdma_cm here); the provider stage runs it with the model preloaded.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn connections_on_one_context_share_their_async_events() {
    use crate::{Access, Completion, PostFlags, PostSend, QueuePair, WcStatus};
    let owner = model();
    // As `device_of` makes them, one per rdma_cm request.
    let (a, b) = (device(&owner), device(&owner));
    // On connection b's device: a write to a region without remote write; the
    // responder has no completion to say so, only the QP access error event.
    let refused = |check_a_first: bool| {
        let (pd, mut cq, mut q1, q2) = pair(&b);
        let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        q1.write_inline(&[1], mr.remote(0).unwrap(), 7, PostFlags::SIGNALED)
            .unwrap();
        let mut out = [Completion::default(); 4];
        assert_eq!(cq.poll_n(&mut out, 1, 1 << 34), 1);
        assert_eq!(out[0].status, WcStatus::RemAccessErr);
        // The model forwards events every 0.5 ms.
        std::thread::sleep(Duration::from_millis(100));
        if check_a_first {
            // Connection a checks its own objects (a refused post of its, Qp::check).
            let _ = a.events.check(&a.backend, &[]);
        }
        q2.check()
    };
    let control = refused(false);
    assert!(
        matches!(control, Err(Error::AsyncEvent(_))),
        "control: {control:?}"
    );
    let lost = refused(true);
    assert!(
        matches!(lost, Err(Error::AsyncEvent(_))),
        "the responder's access error, read by the other connection's device: {lost:?}"
    );
}

/// A verbs batch holds at most 64 requests (one `ibv_post_send` list): the 65th is refused
/// naming the batch and what to do (ring it, push the rest into another), not as a queue
/// with "0 free (poll the CQ)", which an empty queue never frees; the direct path takes the
/// same batch whole.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_verbs_batch_past_64_requests_says_so() {
    use crate::{Access, Payload, PostFlags, QueueUnit, Request};
    for path in ["verbs", "direct"] {
        std::env::set_var("BLUEFLAME_PATH", path);
        let owner = model();
        let dev = device(&owner);
        std::env::remove_var("BLUEFLAME_PATH");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(2048).unwrap();
        let caps = QpCaps {
            sq_blocks: 1024,
            max_send_sge: 1,
            max_inline: 16,
            ..QpCaps::default()
        };
        let mut qp = pd.create_qp(&cq, &cq, caps).unwrap();
        let e = qp.endpoint().unwrap();
        qp.connect(&e).unwrap();
        let mr = pd
            .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let req = Request::Write {
            remote: mr.remote(0).unwrap(),
            data: Payload::Inline(&[1]),
        };
        let mut b = qp.batch();
        let refused =
            (0..100u64).find_map(|i| b.push(&req, i, PostFlags::UNSIGNALED).err().map(|e| (i, e)));
        match (path, refused) {
            ("direct", None) => {}
            ("verbs", Some((64, e))) => {
                assert!(
                    matches!(
                        e,
                        Error::QueueFull {
                            unit: QueueUnit::VerbsBatch,
                            ..
                        }
                    ) && e.to_string().contains("ring the batch"),
                    "{e}"
                );
            }
            other => panic!("{path}: {other:?}"),
        }
    }
}

/// A QP attached to a CQ (and its request completed) after a poll read the CQ's list of
/// queues: its completion is reported, on both rdma-core APIs. The window between the
/// poll's check of the list's generation and `ibv_start_poll` / `ibv_poll_cq` is stood in
/// for by `skip_refresh` (the poller takes its old list as current). Before the fix the
/// completion was taken for a dropped QP's and lost: the poll found nothing, ever.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_completion_of_a_qp_attached_after_the_polls_check_is_reported() {
    use crate::{Access, Completion, PostFlags, PostSend, QueuePair, WcOpcode};
    for api in ["extended", "legacy"] {
        std::env::set_var("BLUEFLAME_PATH", "verbs");
        std::env::set_var("BLUEFLAME_VERBS_API", api);
        let owner = model();
        let dev = device(&owner);
        let pd = dev.alloc_pd().unwrap();
        let mut cq = dev.create_cq(64).unwrap();
        std::env::remove_var("BLUEFLAME_PATH");
        std::env::remove_var("BLUEFLAME_VERBS_API");
        let mut out = [Completion::default(); 1];
        // The poller reads the (empty) list.
        assert_eq!(cq.poll(&mut out), 0, "{api}");
        let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        let e = qp.endpoint().unwrap();
        qp.connect(&e).unwrap();
        let mr = pd
            .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        qp.write_inline(&[7; 8], mr.remote(0).unwrap(), 41, PostFlags::SIGNALED)
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        wait_landed(&mr, 0, 7, deadline, api);
        cq.verbs_poller().expect("the verbs path").skip_refresh();
        let mut got = 0;
        while got == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{api}: the completion of a QP attached after the poll's check was lost"
            );
            got = cq.poll(&mut out);
        }
        assert_eq!(got, 1, "{api}");
        assert!(out[0].is_ok(), "{api}: {:?}", out[0]);
        assert_eq!(
            (out[0].cookie, out[0].opcode, out[0].qpn),
            (41, WcOpcode::RdmaWrite, qp.qpn()),
            "{api}"
        );
        // The request was retired: the queue's room is whole again.
        drop(qp);
    }
}

/// A QP dropped and its number given to a new QP between a poll's last look at the CQ's
/// list of queues and its reading of the new QP's completion: the completion is the new
/// QP's, reported with its cookie, on both rdma-core APIs, and the dropped QP's send queue
/// is left as it was. The kernel hands a dropped QP's number back only after 2^24 others
/// (the model's as libmlx5's and rxe's), so the poller's list is renamed instead
/// (`renumber`: the dropped QP `a` under the number `b` got), and taken as current
/// (`skip_refresh`: the list as a poll's check before `ibv_start_poll` / `ibv_poll_cq`
/// saw it); `a` is dropped inside the provider's `start_poll` / `poll_cq` (wrapped), before
/// it reads the CQ: the window. The poller reads the list's generation before the
/// provider's call only, and credits `b`'s completion to `a`'s send queue (a moderation
/// completion there, retiring `a`'s unsignaled request): `b`'s completion was never
/// reported before each request's `wr_id` carried its queue's incarnation
/// (`crate::verbs::incarnation`), by which the poller now sees that the queue its list
/// has under the number is not the completion's and looks the completion's up in the
/// registry. Polled one at a time, into a larger array (the general path's loop) and with
/// `poll_timed`. Reading the generation after the provider's call instead (fb3afa7) had
/// passed this case and failed its mirror,
/// [`a_completion_read_before_its_qp_was_dropped_and_its_number_reused_is_not_the_new_qps`]:
/// the QP number alone cannot decide both.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_completion_of_a_qp_that_took_a_dropped_qps_number_in_the_window_is_its_own() {
    use crate::{Access, Completion, CqOptions, PostFlags, PostSend, QueuePair, WcOpcode};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::Mutex;
    type Cx = *mut ffi::ibv_cq_ex;
    /// What runs in the window, once: the drop of the old QP.
    static WINDOW: Mutex<Option<Box<dyn FnOnce() + Send>>> = Mutex::new(None);
    static REAL_CREATE: OnceLock<CreateCqExFn> = OnceLock::new();
    static REAL_START: OnceLock<StartPollFn> = OnceLock::new();
    static REAL_POLL_CQ: OnceLock<PollCqFn> = OnceLock::new();
    fn window() {
        let w = WINDOW.lock().unwrap().take();
        if let Some(w) = w {
            w();
        }
    }
    unsafe extern "C" fn start(cq: Cx, attr: *mut ffi::ibv_poll_cq_attr) -> c_int {
        window();
        // SAFETY: the provider's own operation, on a CQ of its own.
        unsafe { (REAL_START.get().unwrap())(cq, attr) }
    }
    unsafe extern "C" fn poll_cq(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
        window();
        // SAFETY: the provider's own operation, as the caller asked it.
        unsafe { (REAL_POLL_CQ.get().unwrap())(cq, n, wc) }
    }
    unsafe extern "C" fn create(
        ctx: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_cq_init_attr_ex,
    ) -> Cx {
        // SAFETY: called as the context's `create_cq_ex`, whose own `REAL_CREATE` holds.
        unsafe { create_cq_wrapping_start(&REAL_CREATE, &REAL_START, start, ctx, attr) }
    }
    #[derive(Copy, Clone, Debug, PartialEq)]
    enum Mode {
        /// `poll` into one slot (the latency loop's poll).
        One,
        /// `poll` into four (the general path's loop).
        Many,
        /// `poll_timed` (extended API only).
        Timed,
    }
    for api in ["extended", "legacy"] {
        let (_owner, dev) = match api {
            "extended" => verbs_extended_with_cq_hook(&REAL_CREATE, create),
            _ => verbs_legacy_with_poll_hook(&REAL_POLL_CQ, poll_cq),
        };
        let modes: &[Mode] = match api {
            "extended" => &[Mode::One, Mode::Many, Mode::Timed],
            _ => &[Mode::One, Mode::Many],
        };
        for &mode in modes {
            let pd = dev.alloc_pd().unwrap();
            let opts = match mode {
                Mode::Timed => CqOptions::new(64).timestamps(),
                _ => CqOptions::new(64),
            };
            let mut cq = on_verbs_api(api, || dev.create_cq_with(&opts).unwrap());
            let want = match api {
                "extended" => crate::VerbsApi::Extended,
                _ => crate::VerbsApi::Legacy,
            };
            assert_eq!(cq.verbs_api(), Some(want), "{api} {mode:?}");
            let mut out = [Completion::default(); 4];
            let mut times = [None; 4];
            let mut poll = |cq: &mut crate::Cq, out: &mut [Completion; 4]| match mode {
                Mode::One => cq.poll(&mut out[..1]),
                Mode::Many => cq.poll(out),
                Mode::Timed => cq.poll_timed(out, &mut times).unwrap(),
            };
            let mr = pd
                .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
            // The old QP, first in the poller's list (its sends the usual completion), with
            // a request outstanding (unsignaled: no completion of its own).
            let mut a = connected_to_itself(pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
            a.write_inline(&[5; 8], mr.remote(8).unwrap(), 1, PostFlags::UNSIGNALED)
                .unwrap();
            assert_eq!(poll(&mut cq, &mut out), 0, "{api} {mode:?}");
            let mut b = connected_to_itself(pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
            b.write_inline(&[7; 8], mr.remote(0).unwrap(), 41, PostFlags::SIGNALED)
                .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            wait_landed(&mr, 0, 7, deadline, &format!("{api} {mode:?}"));
            let poller = cq.verbs_poller().expect("the verbs path");
            let a_sq = {
                let list = poller.registry.lock();
                let q = list.iter().find(|q| q.qpn == a.qpn()).unwrap();
                q.sq.clone().expect("a send queue")
            };
            let retired = a_sq.retired();
            poller.skip_refresh();
            poller.renumber(a.qpn(), b.qpn());
            *WINDOW.lock().unwrap() = Some(Box::new(move || drop(a)));
            let mut got = 0;
            while got == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{api} {mode:?}: the new QP's completion was taken for the dropped QP's"
                );
                got = poll(&mut cq, &mut out);
            }
            assert!(
                WINDOW.lock().unwrap().is_none(),
                "{api} {mode:?}: no window"
            );
            assert_eq!(got, 1, "{api} {mode:?}");
            assert!(out[0].is_ok(), "{api} {mode:?}: {:?}", out[0]);
            assert_eq!(
                (out[0].cookie, out[0].opcode, out[0].qpn),
                (41, WcOpcode::RdmaWrite, b.qpn()),
                "{api} {mode:?}"
            );
            assert_eq!(
                a_sq.retired(),
                retired,
                "{api} {mode:?}: the dropped QP's queue moved"
            );
            assert_eq!(poll(&mut cq, &mut out), 0, "{api} {mode:?}");
            drop(b);
        }
    }
}

/// The mirror of [`a_completion_of_a_qp_that_took_a_dropped_qps_number_in_the_window_is_its_own`]:
/// a completion the provider handed over (`ibv_poll_cq` returned it; the extended API's
/// pair ended) while its QP `a` was still attached, then `a` dropped and its number given to
/// another QP `b` before the poller read the queues' list again. The completion is `a`'s:
/// `b`'s send queue must not be retired by it. The number's reuse is shown as the other
/// case shows it (the kernel model hands one back only after 2^24 others): `b`'s entry in
/// the CQ's registry is renamed to `a`'s number once `a` is dropped, in the window (after
/// the provider's `poll_cq`, or its `end_poll`). `b` has an unsignaled request outstanding:
/// credited with `a`'s completion, it was retired by a completion that was not its own.
/// Failed on the poller of fb3afa7 (the list read again after the provider's read, not
/// before: extended one-completion poll, classic one and four), which was reverted for it;
/// the incarnation in each `wr_id` now decides both windows (this one's other half, a list
/// that already has the new QP under the number when the old one's completion is read:
/// [`a_completion_of_the_old_qp_read_with_the_new_one_in_the_list_is_the_old_ones`]).
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_completion_read_before_its_qp_was_dropped_and_its_number_reused_is_not_the_new_qps() {
    use crate::{Access, Completion, CqOptions, PostFlags, PostSend, QueuePair};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::Mutex;
    type Cx = *mut ffi::ibv_cq_ex;
    type EndPollFn = unsafe extern "C" fn(Cx);
    /// What runs in the window, once: the drop of `a` and the renaming of `b`.
    static WINDOW: Mutex<Option<Box<dyn FnOnce() + Send>>> = Mutex::new(None);
    static REAL_CREATE: OnceLock<CreateCqExFn> = OnceLock::new();
    static REAL_END: OnceLock<EndPollFn> = OnceLock::new();
    static REAL_POLL_CQ: OnceLock<PollCqFn> = OnceLock::new();
    fn window() {
        let w = WINDOW.lock().unwrap().take();
        if let Some(w) = w {
            w();
        }
    }
    unsafe extern "C" fn end(cq: Cx) {
        // SAFETY: the provider's own operation, on a CQ of its own.
        unsafe { (REAL_END.get().unwrap())(cq) };
        window();
    }
    unsafe extern "C" fn poll_cq(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
        // SAFETY: the provider's own operation, as the caller asked it.
        let got = unsafe { (REAL_POLL_CQ.get().unwrap())(cq, n, wc) };
        if got > 0 {
            window();
        }
        got
    }
    unsafe extern "C" fn create(
        ctx: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_cq_init_attr_ex,
    ) -> Cx {
        // SAFETY: called as the context's `create_cq_ex`, whose own `REAL_CREATE` holds.
        unsafe {
            create_cq_then(&REAL_CREATE, ctx, attr, |cq| {
                let _ = REAL_END.set(cq.end_poll.unwrap());
                cq.end_poll = Some(end);
            })
        }
    }
    let mut wrong = Vec::new();
    for api in ["extended", "legacy"] {
        let (_owner, dev) = match api {
            "extended" => verbs_extended_with_cq_hook(&REAL_CREATE, create),
            _ => verbs_legacy_with_poll_hook(&REAL_POLL_CQ, poll_cq),
        };
        for many in [false, true] {
            let pd = dev.alloc_pd().unwrap();
            let mut cq = on_verbs_api(api, || dev.create_cq_with(&CqOptions::new(64)).unwrap());
            let mr = pd
                .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut a = connected_to_itself(pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
            a.write_inline(&[5; 8], mr.remote(8).unwrap(), 1, PostFlags::SIGNALED)
                .unwrap();
            wait_landed(&mr, 8, 5, deadline, api);
            let mut b = connected_to_itself(pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
            b.write_inline(&[7; 8], mr.remote(0).unwrap(), 41, PostFlags::UNSIGNALED)
                .unwrap();
            wait_landed(&mr, 0, 7, deadline, api);
            let poller = cq.verbs_poller().expect("the verbs path");
            let registry = poller.registry.clone();
            let (aq, bq) = (a.qpn(), b.qpn());
            let b_sq = {
                let list = registry.lock();
                let q = list.iter().find(|q| q.qpn == bq).unwrap();
                q.sq.clone().expect("a send queue")
            };
            let retired = b_sq.retired();
            *WINDOW.lock().unwrap() = Some(Box::new(move || {
                drop(a);
                let mut l = registry.lock();
                l.iter_mut().find(|x| x.qpn == bq).unwrap().qpn = aq;
                registry
                    .gen
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
            }));
            let mut out = [Completion::default(); 4];
            let got = match many {
                false => cq.poll(&mut out[..1]),
                true => cq.poll(&mut out),
            };
            assert!(
                WINDOW.lock().unwrap().is_none(),
                "{api} many={many}: no window"
            );
            if b_sq.retired() != retired {
                wrong.push(format!("{api} many={many} ({got}: {:?})", &out[..got]));
            }
            drop(b);
        }
    }
    assert!(
        wrong.is_empty(),
        "the dropped QP's completion retired the queue that took its number: {wrong:?}"
    );
}

/// The other half of
/// [`a_completion_read_before_its_qp_was_dropped_and_its_number_reused_is_not_the_new_qps`]:
/// the poller's list already has the new QP `b` under the number when a completion of the
/// old QP `a` is read (a list read again after the provider's call, as fb3afa7's poller did;
/// or a dropped QP's completion left in the CQ, as rxe leaves them, read after the number
/// came back). Shown without a window: the poller's list is renamed (`renumber`: `a` under
/// a number no QP has, `b` under `a`'s), while the registry keeps both as they are. Each
/// kind of completion, each checked where the side it names is read: `a`'s successful
/// write, its receive, its write in error. The completion is `a`'s, reported with its
/// cookie and status; neither of `b`'s queues is retired by it (`b` has an unsignaled write
/// outstanding and a receive posted). Before each `wr_id` carried its queue's incarnation
/// (`crate::verbs::incarnation`) the poller credited it to `b` (the write a moderation
/// completion of `b`'s, the receive `b`'s, the error `b`'s write's), on both APIs, one at a
/// time and into a larger array.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_completion_of_the_old_qp_read_with_the_new_one_in_the_list_is_the_old_ones() {
    use crate::{Access, Completion, CqOptions, Payload, PostFlags, PostSend, QueuePair};
    use crate::{WcOpcode, WcStatus};
    /// A number no QP has (above the kernel model's, below 2^24).
    const NOBODY: u32 = 0xff_fff0;
    #[derive(Copy, Clone, Debug)]
    enum Kind {
        Write,
        Recv,
        Error,
    }
    let mut wrong = Vec::new();
    for api in ["extended", "legacy"] {
        let (_owner, dev) = verbs_model(api);
        for (many, kind) in [false, true]
            .into_iter()
            .flat_map(|m| [Kind::Write, Kind::Recv, Kind::Error].map(|k| (m, k)))
        {
            let pd = dev.alloc_pd().unwrap();
            let mut cq = on_verbs_api(api, || dev.create_cq_with(&CqOptions::new(64)).unwrap());
            let mr = pd
                .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
            let ro = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            // `b` first in the list: the number's lookup finds it before `a`.
            let mut b = connected_to_itself(pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
            let mut a = connected_to_itself(pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
            let mut out = [Completion::default(); 4];
            // The poller's list read (both QPs in it).
            assert_eq!(cq.poll(&mut out), 0, "{api} many={many}");
            b.post_recv(&[mr.sge(32, 8).unwrap()], 42).unwrap();
            b.write_inline(&[7; 8], mr.remote(0).unwrap(), 41, PostFlags::UNSIGNALED)
                .unwrap();
            wait_landed(&mr, 0, 7, deadline, api);
            let want = match kind {
                Kind::Write => {
                    a.write_inline(&[5; 8], mr.remote(8).unwrap(), 1, PostFlags::SIGNALED)
                        .unwrap();
                    (1, WcOpcode::RdmaWrite, WcStatus::Success)
                }
                Kind::Recv => {
                    a.post_recv(&[mr.sge(48, 8).unwrap()], 2).unwrap();
                    a.send(Payload::Inline(&[5; 8]), 3, PostFlags::UNSIGNALED)
                        .unwrap();
                    (2, WcOpcode::Recv, WcStatus::Success)
                }
                Kind::Error => {
                    a.write_inline(&[5; 8], ro.remote(0).unwrap(), 5, PostFlags::SIGNALED)
                        .unwrap();
                    (5, WcOpcode::RdmaWrite, WcStatus::RemAccessErr)
                }
            };
            // The poll below waits for the completion (a received message lands only when
            // polled: libmlx5 copies one this small from the CQE then).
            let poller = cq.verbs_poller().expect("the verbs path");
            let (aq, bq) = (a.qpn(), b.qpn());
            let (b_sq, b_rq) = {
                let list = poller.registry.lock();
                let q = list.iter().find(|q| q.qpn == bq).unwrap();
                (q.sq.clone().unwrap(), q.rq.clone().unwrap())
            };
            let retired = (b_sq.retired(), b_rq.retired());
            // The list as current (no refresh would undo the renaming), then renamed.
            poller.skip_refresh();
            poller.renumber(aq, NOBODY);
            poller.renumber(bq, aq);
            let got = poll_until_reported(&mut cq, &mut out, many, deadline);
            let reported = the_one_reported(&out[..got], want.1);
            let now = (b_sq.retired(), b_rq.retired());
            if reported != Some((want.0, want.1, want.2, aq)) || now != retired {
                wrong.push(format!(
                    "{api} many={many} {kind:?}: {got} {:?}, the new QP's queues retired \
                     {retired:?} -> {now:?}",
                    &out[..got.min(4)],
                ));
            }
            drop(a);
            drop(b);
        }
    }
    assert!(
        wrong.is_empty(),
        "the old QP's completion was credited to the QP under its number in the list: {wrong:?}"
    );
}

/// [`a_completion_of_a_qp_that_took_a_dropped_qps_number_in_the_window_is_its_own`] when
/// the dropped QP `a` used the CQ for the other side only: the poller's list, read before
/// `a` was dropped and its number given to `b`, has `a` under the number without the queue
/// that `b`'s completion names (`a`'s sends complete on another CQ and `b`'s write here, or
/// `a`'s receives on another and `b`'s receive here; or `a` took its receives from an SRQ
/// and was dropped before the list was read, which holds its dead entry,
/// `crate::queue::registry::DEAD`, and `b`'s write completes here). The number finds `a`'s
/// entry; a side it lacks is no evidence that the completion is `a`'s, and the completion
/// is `b`'s: `b`'s successful write, its receive, its write in error, each reported with
/// its cookie, status and QP number. Shown as the other cases show the reuse: the list as
/// current, `a` renamed to `b`'s number in it (`renumber`; the registry keeps both). Before,
/// the poller found `a`'s entry, saw it had no such queue and reported nothing: `b`'s
/// signaled request never completed (extended and classic API, one at a time and into a
/// larger array). Last, `b` takes its receives from the SRQ dead `a` took its own from:
/// the incarnation (the SRQ's) cannot tell them apart, and `b`'s receive, which the
/// registry has, was given back to the SRQ through `a`'s dead entry, unreported (`a`'s
/// receives were all taken before its number was freed: `Registry::defer`).
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_completion_of_a_qp_that_took_the_number_of_one_without_its_queue_on_the_cq_is_its_own() {
    use crate::queue::registry::DEAD;
    use crate::{Access, Completion, CqOptions, Payload, PostFlags, PostSend, QueuePair};
    use crate::{SrqCaps, WcOpcode, WcStatus};
    #[derive(Copy, Clone, Debug, PartialEq)]
    enum Kind {
        Write,
        Recv,
        Error,
        /// `b`'s write, `a` dead (an SRQ's receiver).
        Dead,
        /// `b`'s receive from the SRQ `a` took its receives from, `a` dead.
        SameSrq,
    }
    let mut wrong = Vec::new();
    for api in ["extended", "legacy"] {
        let (_owner, dev) = verbs_model(api);
        for (many, kind) in [false, true].into_iter().flat_map(|m| {
            use Kind::*;
            [Write, Recv, Error, Dead, SameSrq].map(|k| (m, k))
        }) {
            let pd = dev.alloc_pd().unwrap();
            let (mut cq, other, mut srq) = on_verbs_api(api, || {
                let cq = dev.create_cq_with(&CqOptions::new(64)).unwrap();
                let other = dev.create_cq_with(&CqOptions::new(64)).unwrap();
                let srq = pd.create_srq(&cq, SrqCaps::default()).unwrap();
                (cq, other, srq)
            });
            let mr = pd
                .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
            let ro = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            // `a` on `cq` by the side `b`'s completion does not name; `b` by that side.
            let caps = QpCaps::default();
            let a = match kind {
                Kind::Recv => pd.create_qp(&cq, &other, caps),
                Kind::Dead | Kind::SameSrq => pd.create_qp_with_srq(&other, &srq, caps),
                _ => pd.create_qp(&other, &cq, caps),
            }
            .unwrap();
            let a = connected_to_itself(a);
            let aq = a.qpn();
            // A dead `a` leaves its dead entry in the list (read below), under its number
            // with DEAD.
            let (a, old) = match kind {
                Kind::Dead | Kind::SameSrq => {
                    drop(a);
                    (None, aq | DEAD)
                }
                _ => (Some(a), aq),
            };
            let mut out = [Completion::default(); 4];
            // The poller's list read (`a` alone in it).
            assert_eq!(cq.poll(&mut out), 0, "{api} many={many} {kind:?}");
            let b = match kind {
                Kind::Recv => pd.create_qp(&other, &cq, caps),
                Kind::SameSrq => pd.create_qp_with_srq(&other, &srq, caps),
                _ => pd.create_qp(&cq, &other, caps),
            }
            .unwrap();
            let mut b = connected_to_itself(b);
            let want = match kind {
                Kind::Write | Kind::Dead => {
                    b.write_inline(&[7; 8], mr.remote(0).unwrap(), 41, PostFlags::SIGNALED)
                        .unwrap();
                    wait_landed(&mr, 0, 7, deadline, api);
                    (41, WcOpcode::RdmaWrite, WcStatus::Success)
                }
                Kind::Recv => {
                    b.post_recv(&[mr.sge(48, 8).unwrap()], 42).unwrap();
                    b.send(Payload::Inline(&[5; 8]), 43, PostFlags::UNSIGNALED)
                        .unwrap();
                    (42, WcOpcode::Recv, WcStatus::Success)
                }
                Kind::Error => {
                    b.write_inline(&[5; 8], ro.remote(0).unwrap(), 45, PostFlags::SIGNALED)
                        .unwrap();
                    (45, WcOpcode::RdmaWrite, WcStatus::RemAccessErr)
                }
                Kind::SameSrq => {
                    srq.post_recv(&[mr.sge(48, 8).unwrap()], 46).unwrap();
                    b.send(Payload::Inline(&[5; 8]), 47, PostFlags::UNSIGNALED)
                        .unwrap();
                    (46, WcOpcode::Recv, WcStatus::Success)
                }
            };
            let poller = cq.verbs_poller().expect("the verbs path");
            let bq = b.qpn();
            // The list as current (no refresh would undo the renaming), `a` under `b`'s
            // number: a list read before `a` was dropped and `b` given its number.
            poller.skip_refresh();
            poller.renumber(old, old & DEAD | bq);
            let got = poll_until_reported(&mut cq, &mut out, many, deadline);
            let reported = the_one_reported(&out[..got], want.1);
            if reported != Some((want.0, want.1, want.2, bq)) {
                wrong.push(format!(
                    "{api} many={many} {kind:?}: {got} {:?}",
                    &out[..got.min(4)]
                ));
            }
            drop((a, b, srq));
        }
    }
    assert!(
        wrong.is_empty(),
        "the new QP's completion was lost on the old QP's entry without its queue: {wrong:?}"
    );
}

/// The verbs path's extended poller gives a queue its room back (retires its requests, an
/// SRQ its slots) only after `ibv_end_poll`: libmlx5 publishes the CQ's consumer index
/// there (`mlx5_end_poll` -> `update_cons_index`), rxe too (`cq_end_poll`), so a request
/// posted into room given back before could have its CQE written while the device still
/// counts the polled one: one CQE more than the CQ accounting (`cq_share`) lets the CQ
/// hold, an overrun on rxe, whose CQ has no spare entry. The context's `create_cq_ex` is
/// wrapped so that each CQ's `start_poll` / `end_poll` note how far every queue on the CQ
/// is retired at the start of a pair, and whether that moved by its end; every kind of
/// completion is polled (a send of the CQ's first queue, of another, a receive, an SRQ's
/// receive, a moderation completion, a send and a receive in error), one at a time, into a
/// larger array and with `poll_timed`. Before the fix each of them retired inside the pair.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn the_verbs_poller_retires_only_after_ibv_end_poll() {
    use crate::queue::shadow::Retired;
    use crate::{Access, Completion, CqOptions, Payload, PostFlags, PostSend, QueuePair};
    use crate::{SrqCaps, WcStatus};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    type Cx = *mut ffi::ibv_cq_ex;
    type StartFn = unsafe extern "C" fn(Cx, *mut ffi::ibv_poll_cq_attr) -> c_int;
    type EndFn = unsafe extern "C" fn(Cx);
    static REAL_CREATE: OnceLock<CreateCqExFn> = OnceLock::new();
    /// Each hooked CQ (its address) with the provider's own operations.
    static REAL: Mutex<Vec<(usize, StartFn, EndFn)>> = Mutex::new(Vec::new());
    /// The queues on the CQ polled now, and how far each was retired at `start_poll`.
    static QUEUES: Mutex<Vec<Arc<dyn Retired>>> = Mutex::new(Vec::new());
    static AT_START: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    /// Pairs whose queues were retired before `end_poll`: (before, at end_poll).
    static EARLY: Mutex<Vec<(Vec<u16>, Vec<u16>)>> = Mutex::new(Vec::new());
    static PAIRS: AtomicUsize = AtomicUsize::new(0);
    fn real(cq: Cx) -> (StartFn, EndFn) {
        let r = REAL.lock().unwrap();
        let &(_, s, e) = r.iter().find(|(c, ..)| *c == cq as usize).unwrap();
        (s, e)
    }
    fn retired() -> Vec<u16> {
        QUEUES.lock().unwrap().iter().map(|q| q.retired()).collect()
    }
    unsafe extern "C" fn start(cq: Cx, attr: *mut ffi::ibv_poll_cq_attr) -> c_int {
        // SAFETY: the provider's own operation, on the CQ it was made for.
        let rc = unsafe { (real(cq).0)(cq, attr) };
        if rc == 0 {
            *AT_START.lock().unwrap() = retired();
        }
        rc
    }
    unsafe extern "C" fn end(cq: Cx) {
        let (before, now) = (AT_START.lock().unwrap().clone(), retired());
        if before != now {
            EARLY.lock().unwrap().push((before, now));
        }
        PAIRS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as in `start`.
        unsafe { (real(cq).1)(cq) }
    }
    unsafe extern "C" fn create(
        ctx: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_cq_init_attr_ex,
    ) -> Cx {
        // SAFETY: called as the context's `create_cq_ex`, whose own `REAL_CREATE` holds.
        unsafe {
            create_cq_then(&REAL_CREATE, ctx, attr, |cq| {
                let (s, e) = (cq.start_poll.unwrap(), cq.end_poll.unwrap());
                REAL.lock()
                    .unwrap()
                    .push((cq as *mut ffi::ibv_cq_ex as usize, s, e));
                cq.start_poll = Some(start);
                cq.end_poll = Some(end);
            })
        }
    }
    let (_owner, dev) = verbs_extended_with_cq_hook(&REAL_CREATE, create);
    #[derive(Copy, Clone, Debug)]
    enum Mode {
        One,
        Many,
        Timed,
    }
    for mode in [Mode::One, Mode::Many, Mode::Timed] {
        let pd = dev.alloc_pd().unwrap();
        let opts = match mode {
            Mode::Timed => CqOptions::new(64).timestamps(),
            _ => CqOptions::new(64),
        };
        let mut cq = dev.create_cq_with(&opts).unwrap();
        assert_eq!(cq.verbs_api(), Some(crate::VerbsApi::Extended), "{mode:?}");
        let mut srq = pd.create_srq(&cq, SrqCaps::default()).unwrap();
        // `a` first: its sends are the poller's usual completion.
        let mut a = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        let mut b = pd.create_qp_with_srq(&cq, &srq, QpCaps::default()).unwrap();
        let (ea, eb) = (a.endpoint().unwrap(), b.endpoint().unwrap());
        a.connect(&eb).unwrap();
        b.connect(&ea).unwrap();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = pd.alloc_mr(4096, rw).unwrap();
        let ro = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        *QUEUES.lock().unwrap() = {
            let p = cq.verbs_poller().expect("the verbs path");
            let list = p.registry.lock();
            let mut qs: Vec<Arc<dyn Retired>> = Vec::new();
            for q in list.iter() {
                qs.extend(q.sq.iter().map(|s| s.clone() as Arc<dyn Retired>));
                qs.extend(q.rq.iter().map(|s| s.clone() as Arc<dyn Retired>));
                qs.extend(q.srq.iter().map(|s| s.clone() as Arc<dyn Retired>));
            }
            qs
        };
        let pairs = PAIRS.load(Ordering::Relaxed);
        // Polls until the completions of `want` (cookie, status) came, in any order.
        let expect = |cq: &mut crate::Cq, want: &[(u64, WcStatus)]| {
            let mut got = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while got.len() < want.len() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{mode:?}: {got:?} of {want:?}"
                );
                let mut out = [Completion::default(); 4];
                let mut times = [None; 4];
                let n = match mode {
                    Mode::One => cq.poll(&mut out[..1]),
                    Mode::Many => cq.poll(&mut out),
                    Mode::Timed => cq.poll_timed(&mut out, &mut times).unwrap(),
                };
                got.extend(out[..n].iter().map(|c| (c.cookie, c.status)));
            }
            got.sort_by_key(|&(c, _)| c);
            let mut want = want.to_vec();
            want.sort_by_key(|&(c, _)| c);
            assert_eq!(got, want, "{mode:?}");
        };
        let ok = WcStatus::Success;
        // The first queue's send.
        a.write_inline(&[1], mr.remote(0).unwrap(), 1, PostFlags::SIGNALED)
            .unwrap();
        expect(&mut cq, &[(1, ok)]);
        // A receive of `a`'s own queue, the send of the other QP.
        a.post_recv(&[mr.sge(64, 64).unwrap()], 10).unwrap();
        b.send(Payload::Inline(b"to a"), 2, PostFlags::SIGNALED)
            .unwrap();
        expect(&mut cq, &[(2, ok), (10, ok)]);
        // A receive from the SRQ; unsignaled writes retired by a signaled one.
        srq.post_recv(&[mr.sge(128, 64).unwrap()], 20).unwrap();
        a.send(Payload::Inline(b"to b"), 3, PostFlags::SIGNALED)
            .unwrap();
        for i in 0..3u64 {
            a.write_inline(&[2], mr.remote(8).unwrap(), 100 + i, PostFlags::UNSIGNALED)
                .unwrap();
        }
        a.write_inline(&[3], mr.remote(8).unwrap(), 4, PostFlags::SIGNALED)
            .unwrap();
        expect(&mut cq, &[(3, ok), (4, ok), (20, ok)]);
        // A write the responder refuses: an error, and `a`'s receive flushed.
        a.post_recv(&[mr.sge(256, 64).unwrap()], 11).unwrap();
        a.write_inline(&[4], ro.remote(0).unwrap(), 5, PostFlags::SIGNALED)
            .unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while got.len() < 2 {
            assert!(std::time::Instant::now() < deadline, "{mode:?}: {got:?}");
            let mut out = [Completion::default(); 1];
            if cq.poll(&mut out) == 1 {
                got.push((out[0].cookie, out[0].status));
            }
        }
        got.sort_by_key(|&(c, _)| c);
        assert!(
            matches!(got[..], [(5, WcStatus::RemAccessErr), (11, s)] if s != ok),
            "{mode:?}: {got:?}"
        );
        // Every request retired, after its pair.
        let (sq, rq) = (a.free_send(), a.free_recv());
        assert!(
            PAIRS.load(Ordering::Relaxed) >= pairs + 8,
            "{mode:?}: {} pairs, {} CQs hooked",
            PAIRS.load(Ordering::Relaxed) - pairs,
            REAL.lock().unwrap().len()
        );
        assert_eq!(
            *EARLY.lock().unwrap(),
            Vec::<(Vec<u16>, Vec<u16>)>::new(),
            "{mode:?}: queues retired before ibv_end_poll published the consumer index \
             (retired at start_poll, at end_poll); room now {sq} / {rq}"
        );
        let all = QUEUES
            .lock()
            .unwrap()
            .iter()
            .map(|q| q.retired())
            .collect::<Vec<_>>();
        eprintln!("{mode:?}: retired {all:?}, room {sq} / {rq}");
        drop((a, b, srq));
    }
}

/// A poll whose `ibv_start_poll` fails, or whose `ibv_poll_cq` returns a negative count
/// (libmlx5's `CQ_POLL_ERR`, after a CQE it could not parse), has not seen the CQ empty:
/// the entries of a dropped QP's outstanding requests stay charged (the orphan mark stays),
/// and are given back by the next poll that finds the CQ empty. Before the fix any non-zero
/// start was taken for an empty CQ. On the classic API the context's `poll_cq` is wrapped
/// before the CQ is made (the poller reads the operation once, at its creation: `PollCq::of`),
/// and `BLUEFLAME_VERBS_API=legacy` stays set until the CQ is made (read there, not when
/// the device is opened): else the CQ polls with `ibv_start_poll` and the wrap is never
/// called.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_failed_poll_gives_no_dropped_qps_entries_back() {
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    type Cx = *mut ffi::ibv_cq_ex;
    /// libmlx5's `CQ_POLL_ERR`.
    const POLL_ERR: c_int = -2;
    static FAIL: AtomicBool = AtomicBool::new(false);
    /// Polls failed by the wraps below (each API's must be reached).
    static FAILED: AtomicUsize = AtomicUsize::new(0);
    static REAL_CREATE: OnceLock<CreateCqExFn> = OnceLock::new();
    static REAL_START: OnceLock<StartPollFn> = OnceLock::new();
    static REAL_POLL: OnceLock<PollCqFn> = OnceLock::new();
    /// Whether the poll fails now (counted).
    fn failing() -> bool {
        let fail = FAIL.load(Ordering::Relaxed);
        FAILED.fetch_add(fail as usize, Ordering::Relaxed);
        fail
    }
    unsafe extern "C" fn start(cq: Cx, attr: *mut ffi::ibv_poll_cq_attr) -> c_int {
        if failing() {
            return POLL_ERR;
        }
        // SAFETY: the provider's own operation, on a CQ of its own.
        unsafe { (REAL_START.get().unwrap())(cq, attr) }
    }
    unsafe extern "C" fn poll(cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
        if failing() {
            return POLL_ERR;
        }
        // SAFETY: the provider's own operation, on a CQ of its own.
        unsafe { (REAL_POLL.get().unwrap())(cq, n, wc) }
    }
    unsafe extern "C" fn create(
        ctx: *mut ffi::ibv_context,
        attr: *mut ffi::ibv_cq_init_attr_ex,
    ) -> Cx {
        // SAFETY: called as the context's `create_cq_ex`, whose own `REAL_CREATE` holds.
        unsafe { create_cq_wrapping_start(&REAL_CREATE, &REAL_START, start, ctx, attr) }
    }
    for api in ["extended", "legacy"] {
        let (_owner, dev) = match api {
            "extended" => verbs_extended_with_cq_hook(&REAL_CREATE, create),
            _ => verbs_legacy_with_poll_hook(&REAL_POLL, poll),
        };
        failed_poll_keeps_orphans(api, &dev, &FAIL, &FAILED);
    }
}

/// [`a_failed_poll_gives_no_dropped_qps_entries_back`] on `dev` (rdma-core's `api`, read
/// from `BLUEFLAME_VERBS_API` when the CQ and QP are made, then unset), its polls failing
/// while `fail` is set and counted in `failed`.
fn failed_poll_keeps_orphans(
    api: &str,
    dev: &Device,
    fail: &std::sync::atomic::AtomicBool,
    failed: &std::sync::atomic::AtomicUsize,
) {
    use crate::{Access, Completion, PostFlags, PostSend};
    use std::sync::atomic::Ordering;
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    std::env::remove_var("BLUEFLAME_PATH");
    std::env::remove_var("BLUEFLAME_VERBS_API");
    let want = match api {
        "extended" => crate::VerbsApi::Extended,
        _ => crate::VerbsApi::Legacy,
    };
    assert_eq!(
        cq.verbs_poller().expect("the verbs path").api(),
        want,
        "{api}"
    );
    let e = qp.endpoint().unwrap();
    qp.connect(&e).unwrap();
    let mr = pd
        .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    for i in 0..2u64 {
        qp.write_inline(
            &[9; 8],
            mr.remote(8 * i as usize).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    wait_landed(&mr, 8, 9, deadline, api);
    // Dropped with both requests unpolled: their entries are the orphans' now.
    drop(qp);
    let slots = cq
        .verbs_poller()
        .expect("the verbs path")
        .registry
        .slots
        .clone();
    assert_ne!(
        slots.orphan_mark(),
        0,
        "{api}: the dropped QP left nothing charged"
    );
    let before = failed.load(Ordering::Relaxed);
    fail.store(true, Ordering::Relaxed);
    let (mut one, mut four) = ([Completion::default(); 1], [Completion::default(); 4]);
    assert_eq!(cq.poll(&mut one), 0, "{api}");
    assert_eq!(cq.poll(&mut four), 0, "{api}");
    fail.store(false, Ordering::Relaxed);
    assert!(
        failed.load(Ordering::Relaxed) > before,
        "{api}: the polls never reached the failing operation"
    );
    assert_ne!(
        slots.orphan_mark(),
        0,
        "{api}: a failed poll gave the dropped QP's entries back"
    );
    assert_eq!(
        cq.poll(&mut four),
        0,
        "{api}: libmlx5 cleaned the CQ of the QP's entries"
    );
    assert_eq!(
        slots.orphan_mark(),
        0,
        "{api}: an empty poll gives them back"
    );
}

/// A QP dropped with a request outstanding (an unsignaled write, never retired) while it was
/// its CQ's first queue: once the poller has taken the list without it, nothing of the
/// poller keeps its send queue, so a region dropped afterwards waits for no work of it and
/// is deregistered at once, on both rdma-core APIs. Before the fix the poller's cached
/// first send queue (`first_sq`) kept the dropped QP's queue alive until a QP with a send
/// queue came first in the list again: the region stayed parked (registered, its memory
/// held) for as long.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_dropped_first_qps_send_queue_keeps_no_region_parked() {
    use crate::{Access, Completion, PostFlags, PostSend, QueuePair};
    for api in ["extended", "legacy"] {
        std::env::set_var("BLUEFLAME_PATH", "verbs");
        std::env::set_var("BLUEFLAME_VERBS_API", api);
        let owner = model();
        let dev = device(&owner);
        let pd = dev.alloc_pd().unwrap();
        let mut cq = dev.create_cq(64).unwrap();
        let mut out = [Completion::default(); 1];
        // Both read when the QP is made too: unset after it, so that its API is `api`.
        let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
        std::env::remove_var("BLUEFLAME_PATH");
        std::env::remove_var("BLUEFLAME_VERBS_API");
        let want = match api {
            "extended" => crate::VerbsApi::Extended,
            _ => crate::VerbsApi::Legacy,
        };
        assert_eq!(qp.verbs_api(), Some(want), "{api}");
        let e = qp.endpoint().unwrap();
        qp.connect(&e).unwrap();
        let target = pd
            .alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        // Unsignaled: posted, never retired (no completion of it or after it).
        qp.write_inline(&[7; 8], target.remote(0).unwrap(), 1, PostFlags::UNSIGNALED)
            .unwrap();
        // The poller takes the list with the QP first.
        assert_eq!(cq.poll(&mut out), 0, "{api}");
        drop(qp);
        // And the list without it.
        assert_eq!(cq.poll(&mut out), 0, "{api}");
        drop(target);
        let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        drop(mr);
        assert_eq!(
            pd.reclaim(),
            0,
            "{api}: a region waits for the send queue of a QP dropped and gone from the list"
        );
    }
}

/// On the verbs path a receive of one entry hands the caller's entry to `ibv_post_recv` as
/// the request's list, and counts one entry: after a receive of two, a count left at two
/// would have libmlx5 take the entry after it in the caller's memory as the receive's
/// second (here a live buffer at 256), so a message of 16 bytes would land there instead
/// of failing for the 8-byte buffer. Each receive lands in its own buffers.
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_verbs_receive_of_one_entry_after_one_of_two_has_one_entry() {
    use crate::{Access, Completion, Payload, PostFlags, PostSend, WcStatus};
    let owner = verbs_legacy();
    let dev = device(&owner);
    std::env::remove_var("BLUEFLAME_PATH");
    std::env::remove_var("BLUEFLAME_VERBS_API");
    let (pd, mut cq, mut a, mut b) = pair(&dev);
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mut wait = |n: usize| {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while got.len() < n {
            assert!(std::time::Instant::now() < deadline, "{got:?}");
            let mut out = [Completion::default(); 1];
            if cq.poll(&mut out) == 1 {
                got.push((out[0].cookie, out[0].status, out[0].byte_len));
            }
        }
        got.sort_by_key(|&(c, ..)| c);
        got
    };
    let ok = WcStatus::Success;
    b.post_recv(&[mr.sge(0, 4).unwrap(), mr.sge(64, 4).unwrap()], 1)
        .unwrap();
    a.send(Payload::Inline(&[1; 8]), 10, PostFlags::SIGNALED)
        .unwrap();
    assert_eq!(wait(2), [(1, ok, 8), (10, ok, 0)]);
    // The entry after the one posted is a live buffer of the same region.
    let entries = [mr.sge(128, 8).unwrap(), mr.sge(256, 8).unwrap()];
    b.post_recv(&entries[..1], 2).unwrap();
    a.send(Payload::Inline(&[2; 16]), 11, PostFlags::SIGNALED)
        .unwrap();
    let got = wait(2);
    assert!(
        matches!(got[..], [(2, WcStatus::LocLenErr, _), (11, s, _)] if s != ok),
        "{got:?}"
    );
    let mut bytes = [0u8; 8];
    mr.read(256, &mut bytes).unwrap();
    assert_eq!(bytes, [0; 8], "nothing lands past the receive's one entry");
    mr.read(0, &mut bytes).unwrap();
    assert_eq!(bytes, [1, 1, 1, 1, 0, 0, 0, 0]);
    mr.read(64, &mut bytes).unwrap();
    assert_eq!(bytes, [1, 1, 1, 1, 0, 0, 0, 0]);
}

/// The verbs path posts a request straight (`post_single`, one request, nothing queued)
/// only when the QP is connected, nothing is queued and no fence is armed: a post
/// before `connect` is refused with the invalid state, a request after a type-1 bind
/// carries the fence the bind armed, and one after a batch left queued (`mem::forget` is
/// safe) goes with that batch's requests, in order, in one `ibv_post_send`. Each on the
/// classic API, whose `post_send` records every list it is given (opcode, flags and the
/// list's length).
#[test]
#[ignore = "needs mlx5_0: run by the provider stage (LD_PRELOAD=libkernel_model.so)"]
fn a_straight_post_waits_for_connect_a_queued_batch_and_an_armed_fence() {
    use crate::{Access, Completion, MwType, Payload, PostFlags, PostSend, QueuePair, Request};
    use rdma_sys as ffi;
    use std::os::raw::c_int;
    use std::sync::Mutex;
    static REAL: OnceLock<PostSendFn> = OnceLock::new();
    /// Each list posted: (wr_id, opcode, send_flags) of its requests.
    static SEEN: Mutex<Vec<Vec<(u64, u32, u32)>>> = Mutex::new(Vec::new());
    unsafe extern "C" fn recording(
        qp: *mut ffi::ibv_qp,
        wr: *mut ffi::ibv_send_wr,
        bad: *mut *mut ffi::ibv_send_wr,
    ) -> c_int {
        let mut list = Vec::new();
        // SAFETY: the list libibverbs' caller built.
        unsafe {
            let mut w = wr;
            while !w.is_null() {
                list.push(((*w).wr_id, (*w).opcode, (*w).send_flags));
                w = (*w).next;
            }
            SEEN.lock().unwrap().push(list);
            (REAL.get().unwrap())(qp, wr, bad)
        }
    }
    let owner = verbs_legacy();
    hook_post_send(&owner, &REAL, recording);
    let dev = device(&owner);
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(64).unwrap();
    let mut qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    assert_eq!(qp.data_path(), crate::DataPath::Verbs);
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND;
    let mr = pd.alloc_mr(4096, rights).unwrap();
    let remote = mr.remote(0).unwrap();
    let s = PostFlags::SIGNALED;
    // Before connect: refused, nothing posted.
    // A write through `post` (a send would wait for a receive the QP does not post).
    let send = Request::Write {
        remote,
        data: Payload::Inline(&[1]),
    };
    let sge = [mr.sge(64, 8).unwrap()];
    for e in [
        qp.write_inline(&[1], remote, 1, s),
        qp.post(&send, 1, s),
        qp.read(&sge, remote, 1, s),
    ] {
        assert!(matches!(e, Err(Error::InvalidState { .. })), "{e:?}");
    }
    assert!(SEEN.lock().unwrap().is_empty());
    let me = qp.endpoint().unwrap();
    qp.connect(&me).unwrap();
    let mut out = [Completion::default(); 8];
    let mut polled = 0;
    let mut expect = |cq: &mut crate::Cq, n: usize| {
        polled += n;
        let mut got = 0;
        while got < n {
            let k = cq.poll_n(&mut out, n - got, 1 << 26);
            assert!(k > 0, "{polled} completions expected");
            got += k;
        }
    };
    // Straight, then after a type-1 bind: fenced (the bind's own `ibv_bind_mw` is not
    // recorded here), then not.
    qp.write_inline(&[1], remote, 1, s).unwrap();
    let mut mw = pd.alloc_mw(MwType::One).unwrap();
    qp.bind_mw(&mut mw, &mr, 0, 64, Access::REMOTE_WRITE, 2, s)
        .unwrap();
    qp.write_inline(&[1], remote, 3, s).unwrap();
    qp.post(&send, 4, s).unwrap();
    expect(&mut cq, 4);
    // A batch left queued: the next request goes with it.
    let mut b = qp.batch();
    b.push(&send, 5, s).unwrap();
    std::mem::forget(b);
    qp.write_inline(&[1], remote, 6, s).unwrap();
    expect(&mut cq, 2);
    // Then straight again.
    qp.read(&sge, remote, 7, s).unwrap();
    expect(&mut cq, 1);
    let fence = ffi::ibv_send_flags::IBV_SEND_FENCE.0;
    let seen: Vec<Vec<(u32, bool)>> = SEEN
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.iter().map(|&(_, op, f)| (op, f & fence != 0)).collect())
        .collect();
    use ffi::ibv_wr_opcode as O;
    let (write, send_op, read) = (
        O::IBV_WR_RDMA_WRITE,
        O::IBV_WR_RDMA_WRITE,
        O::IBV_WR_RDMA_READ,
    );
    assert_eq!(
        seen,
        [
            vec![(write, false)],
            vec![(write, true)],
            vec![(send_op, false)],
            vec![(send_op, false), (write, false)],
            vec![(read, false)],
        ],
        "lists posted: (opcode, fenced)"
    );
}
