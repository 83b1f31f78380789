//! Granting a peer a memory window, then revoking it.
//!
//! ```sh
//! cargo run --example window                          # on the software NIC
//! BLUEFLAME_DEVICE=rxe0 cargo run --example window    # on a device (rxe, mlx5, ...)
//! ```
//!
//! A memory window gives a peer remote access to part of a registered region under a key of
//! its own, which the owner can revoke without deregistering the region. Here the *owner*
//! QP binds a type-2 window to 256 bytes of its region and hands the key to the *peer* QP
//! (in a real program: in a send, or over the out-of-band exchange of the `pingpong`
//! example). The peer's RDMA write through the window succeeds. The owner then unbinds the
//! window (a local invalidate of its key); the peer's next write with the same key fails
//! with a remote access error (`WcStatus::RemAccessErr`), which the example prints.
//!
//! Both QPs live in this process on one device (the software NIC lives in one process).
//! The example exits 0 only when every step did what it should.

use blueflame::PostSend;
use blueflame::{Access, Completion, Cq, Device, MwType, PostFlags, QpCaps, Remote, WcStatus};
use std::time::{Duration, Instant};

/// Any error, with a message for the user.
type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Waits for the next completion on `cq` (at most 10 s).
fn next_completion(cq: &mut Cq) -> Res<Completion> {
    let mut out = [Completion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(10);
    while cq.poll(&mut out) == 0 {
        if Instant::now() > deadline {
            cq.check()?; // an asynchronous event says why nothing completes
            return Err("no completion within 10 s".into());
        }
        std::thread::yield_now();
    }
    Ok(out[0])
}

/// Waits for the completion of request `cookie` and requires it to have succeeded.
fn expect_success(cq: &mut Cq, cookie: u64, what: &str) -> Res<()> {
    let c = next_completion(cq)?;
    if c.cookie != cookie || c.status != WcStatus::Success {
        return Err(format!("{what}: expected a success for request {cookie}, got {c:?}").into());
    }
    Ok(())
}

fn run() -> Res<()> {
    let dev = Device::open_default()?;
    println!("window: device {}", dev);

    // The owner: a region the peer will reach only through the window. A region that
    // windows are bound to needs MW_BIND, and every right a window grants (here
    // REMOTE_WRITE, which in turn needs LOCAL_WRITE).
    let owner_pd = dev.alloc_pd()?;
    let mut owner_cq = dev.create_cq(16)?;
    let mut owner = owner_pd.create_qp(&owner_cq, &owner_cq, QpCaps::default())?;
    let region = owner_pd.alloc_mr(
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND,
    )?;

    // The peer: another protection domain, as another program would have.
    let peer_pd = dev.alloc_pd()?;
    let mut peer_cq = dev.create_cq(16)?;
    let mut peer = peer_pd.create_qp(&peer_cq, &peer_cq, QpCaps::default())?;

    // Connect the two QPs to each other (on two hosts, the endpoints travel out of band).
    owner.connect(&peer.endpoint()?)?;
    peer.connect(&owner.endpoint()?)?;

    // 1. Grant: bind a type-2 window (tied to the owner's QP: the peer must come in through
    //    it) to bytes 1024..1280 of the region, remote write only. `bind_mw` returns the new
    //    key; the bind is a request on the send queue, and the key is good once it completed.
    let mut window = owner_pd.alloc_mw(MwType::Two)?;
    let (offset, len) = (1024usize, 256usize);
    let rkey = owner.bind_mw(
        &mut window,
        &region,
        offset,
        len,
        Access::REMOTE_WRITE,
        1,
        PostFlags::SIGNALED,
    )?;
    expect_success(&mut owner_cq, 1, "bind")?;
    // Type-2 windows are addressed by virtual address, like the region.
    let grant = Remote {
        addr: region.addr() + offset as u64,
        rkey,
    };
    println!(
        "window: granted {len} bytes at {:#x}, key {rkey:#x}",
        grant.addr
    );

    // 2. The peer writes through the window: it works.
    peer.write_inline(b"written through the window", grant, 2, PostFlags::SIGNALED)?;
    expect_success(&mut peer_cq, 2, "write through the window")?;
    let mut seen = [0u8; 26];
    region.read(offset, &mut seen)?;
    println!(
        "window: the peer wrote {:?}",
        String::from_utf8_lossy(&seen)
    );
    if &seen != b"written through the window" {
        return Err("the region does not hold what the peer wrote".into());
    }

    // 3. Revoke: unbind the window (for type 2, a local invalidate of its key through the
    //    QP it is bound to). Once this completes, the key grants nothing.
    owner.unbind_mw(&mut window, 3, PostFlags::SIGNALED)?;
    expect_success(&mut owner_cq, 3, "unbind")?;
    println!("window: revoked key {rkey:#x}");

    // 4. The peer tries again with the old key: the responder refuses it, and the peer's
    //    completion says so. A remote access error is fatal to the connection: the peer's QP
    //    goes to the error state (later requests would be flushed), so a real program
    //    reconnects, or treats the peer as misbehaving.
    peer.write_inline(b"too late", grant, 4, PostFlags::SIGNALED)?;
    let c = next_completion(&mut peer_cq)?;
    println!(
        "window: the peer's write with the revoked key completed with {:?}",
        c.status
    );
    if (c.cookie, c.status) != (4, WcStatus::RemAccessErr) {
        return Err(format!("expected a remote access error for request 4, got {c:?}").into());
    }
    let mut after = [0u8; 8];
    region.read(offset, &mut after)?;
    if &after == b"too late" {
        return Err("the revoked key still wrote the region".into());
    }
    println!("window: the region is untouched: revocation works");
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("window: {e}");
        std::process::exit(1);
    }
}
