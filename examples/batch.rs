//! Batched posting with unsignaled requests: many RDMA writes, one doorbell per batch, one
//! completion per batch.
//!
//! ```sh
//! cargo run --example batch                          # on the software NIC
//! BLUEFLAME_DEVICE=rxe0 cargo run --example batch    # on a device (rxe, mlx5, ...)
//! # options: --writes N (default 4096)  --every N (a signaled request every N, default 16)
//! ```
//!
//! Three rules make this fast and safe:
//! - **A batch, one doorbell.** `Qp::batch()` writes requests into the send queue and
//!   `Batch::ring()` rings the doorbell once for all of them (direct path: one doorbell
//!   record and one 8-byte doorbell; verbs path: one `ibv_post_send` of a linked list).
//!   A batch dropped without `ring()` posts nothing.
//! - **Signal one request in N.** An unsignaled request produces no completion when it
//!   succeeds; its queue slot is given back when a *later* completion of the same QP is
//!   polled. Signal one request in every N, N at most half the send queue: its completion
//!   says the N before it are done (their buffers may be reused) and frees their slots
//!   (perftest's `-Q, --cq-mod`; UCX's `RC_TX_CQ_MODERATION`, which `rc_mlx5_iface.c` caps at
//!   a quarter of the send queue). blueflame also signals one request of every half queue
//!   of unsignaled ones by itself, so a long unsignaled run cannot stall the queue, but it
//!   does not report those completions: they free slots without telling you what is done.
//!   Errors are always reported, unsignaled or not.
//! - **Size the CQ for what may complete, not for what is signaled.** After an error every
//!   outstanding request completes with its own flush entry, signaled or not, so each one
//!   holds a CQ entry until it is retired. A CQ with at least as many entries as the send
//!   queue has slots (`Qp::free_send()` of a fresh QP on the direct path, `Qp::send_depth()`
//!   requests on the verbs path) is never refused; a smaller one works too, but a post that
//!   could overrun it is refused with `Error::CqFull` (poll, then post again).

use blueflame::QueuePair;
use blueflame::{Access, Completion, Cq, Device, Payload, PostFlags, QpCaps, Request};
use std::time::{Duration, Instant};

/// Any error, with a message for the user.
type Res<T> = Result<T, Box<dyn std::error::Error>>;

const USAGE: &str = "usage: batch [--writes N] [--every N]";

/// Waits for the next completion on `cq` (at most 10 s) and requires a success.
fn next_success(cq: &mut Cq) -> Res<Completion> {
    let mut out = [Completion::default(); 1];
    let deadline = Instant::now() + Duration::from_secs(10);
    while cq.poll(&mut out) == 0 {
        if Instant::now() > deadline {
            cq.check()?; // an asynchronous event says why nothing completes
            return Err("no completion within 10 s".into());
        }
        std::thread::yield_now();
    }
    if !out[0].is_ok() {
        return Err(format!("request {} failed: {:?}", out[0].cookie, out[0]).into());
    }
    Ok(out[0])
}

fn run() -> Res<()> {
    let (mut writes, mut every) = (4096u64, 16u32);
    let mut args = std::env::args().skip(1);
    while let Some(opt) = args.next() {
        let value = args.next().ok_or(format!("{opt} needs a value\n{USAGE}"))?;
        match opt.as_str() {
            "--writes" => writes = value.parse()?,
            "--every" => every = value.parse()?,
            _ => return Err(format!("unknown option '{opt}'\n{USAGE}").into()),
        }
    }

    let dev = Device::open_default()?;
    println!("batch: device {}", dev);
    let caps = QpCaps {
        sq_blocks: 256, // the direct path's send ring: 256 blocks of 64 bytes
        ..QpCaps::default()
    };
    // The CQ covers every slot of the send queue: a post is never refused for CQ room.
    let mut cq = dev.create_cq(caps.sq_blocks)?;
    let pd = dev.alloc_pd()?;
    let mut qp = pd.create_qp(&cq, &cq, caps)?;
    // The target: another QP with a region of 8-byte slots that the writes fill.
    let target_cq = dev.create_cq(16)?;
    let mut target = pd.create_qp(&target_cq, &target_cq, QpCaps::default())?;
    let slots = 512u64;
    let region = pd.alloc_mr(
        (slots * 8) as usize,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )?;
    qp.connect(&target.endpoint()?)?;
    target.connect(&qp.endpoint()?)?;

    // An 8-byte inline write takes one slot of the send queue on either path (one 64-byte
    // block, or one work request): N must fit twice in the empty queue.
    let room = qp.free_send();
    if every == 0 || every > room / 2 || writes % every as u64 != 0 {
        return Err(format!(
            "--every must be 1 to {} (half the send queue) and divide --writes",
            room / 2
        )
        .into());
    }
    println!(
        "batch: {writes} writes of 8 bytes, batches of {every} with the last one signaled; \
         send queue {} slots, CQ {} entries",
        room,
        cq.capacity()
    );

    let start = Instant::now();
    let (mut posted, mut completions) = (0u64, 0u64);
    while posted < writes {
        // Room for a whole batch? If not, poll: each completion of a signaled request
        // retires it and every unsignaled request before it.
        while qp.free_send() < every {
            next_success(&mut cq)?;
            completions += 1;
        }
        let mut batch = qp.batch();
        for k in 0..every as u64 {
            let i = posted + k;
            let value = i.to_le_bytes();
            let req = Request::Write {
                remote: region.remote(((i % slots) * 8) as usize)?,
                data: Payload::Inline(&value), // copied into the WQE: no registration needed
            };
            let flags = if k + 1 == every as u64 {
                PostFlags::SIGNALED
            } else {
                PostFlags::UNSIGNALED
            };
            // The cookie comes back in the completion: here the write's number.
            batch.push(&req, i, flags)?;
        }
        batch.ring()?; // one doorbell for the whole batch
        posted += every as u64;
    }
    // The last batches: one completion each.
    while completions < writes / every as u64 {
        next_success(&mut cq)?;
        completions += 1;
    }
    let took = start.elapsed();

    // Only the signaled requests completed, and every write landed.
    let mut extra = [Completion::default(); 4];
    if cq.poll(&mut extra) != 0 {
        return Err(format!("an unexpected completion: {:?}", extra[0]).into());
    }
    for slot in 0..slots.min(writes) {
        let last = (writes - 1 - slot) / slots * slots + slot; // the last write into `slot`
        let mut bytes = [0u8; 8];
        region.read((slot * 8) as usize, &mut bytes)?;
        let got = u64::from_le_bytes(bytes);
        if got != last {
            return Err(format!("slot {slot} holds {got}, expected {last}").into());
        }
    }
    println!(
        "batch: {writes} writes, {completions} completions (one per batch), every write landed; \
         {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("batch: {e}");
        std::process::exit(1);
    }
}
