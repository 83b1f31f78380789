//! The send fast paths (`inline_write.rs`, `one_block.rs`, the batch's inline-write
//! encoder) against the general path, on queues accounted on a CQ and on both kinds of
//! register (`inline_write`'s differential tests run an unaccounted queue on a shared
//! register only, where the dedicated fast path and the batch encoder are off), with
//! batches, and a device model that completes in order and retires up to each signaled
//! WQE. The same random steps go to a queue with BlueFlame (the fast paths on) and one
//! without (every post general); results, producer index, credit, WQEs and shadow entries
//! must match after each.

use super::inline_write::tests::{mem, queue, raw_qp};
use crate::queue::cq_share::CqSlots;
use crate::queue::flags::PostFlags;
use mlx5::request::{Payload, Remote, Request, Sge};
use std::sync::Arc;

#[derive(Clone, Debug)]
enum Step {
    Write {
        len: usize,
        signaled: bool,
        imm: bool,
    },
    Read {
        len: u32,
        signaled: bool,
    },
    Send {
        len: usize,
        signaled: bool,
    },
    List {
        write: bool,
        len: u32,
        signaled: bool,
    },
    Invalidate,
    /// The device completes up to the k-th outstanding signaled WQE (in order).
    Complete(u8),
    /// A batch of inline writes (len, signaled), rung or dropped.
    Batch {
        writes: Vec<(usize, bool)>,
        ring: bool,
    },
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0usize..=40, any::<bool>(), any::<bool>())
            .prop_map(|(len, signaled, imm)| Step::Write { len, signaled, imm }),
        2 => (0u32..=64, any::<bool>()).prop_map(|(len, signaled)| Step::Read { len, signaled }),
        2 => (0usize..=40, any::<bool>()).prop_map(|(len, signaled)| Step::Send { len, signaled }),
        2 => (any::<bool>(), 0u32..=64, any::<bool>())
            .prop_map(|(write, len, signaled)| Step::List { write, len, signaled }),
        1 => Just(Step::Invalidate),
        3 => (0u8..3).prop_map(Step::Complete),
        2 => (proptest::collection::vec((0usize..=40, any::<bool>()), 0..6), any::<bool>())
            .prop_map(|(writes, ring)| Step::Batch { writes, ring }),
    ]
}

fn dedicated_queue(m: &mut super::inline_write::tests::Mem) -> super::SendQueue {
    let raw = raw_qp(m, 256, 40);
    // SAFETY: the memory lives in `m`, longer than the queue; nothing else rings it.
    let q = unsafe { super::SendQueue::new_dedicated(&raw) }.unwrap();
    assert_eq!(q.doorbell_mode(), super::DoorbellMode::Dedicated);
    q
}

fn flags(signaled: bool) -> PostFlags {
    let mut f = PostFlags::UNSIGNALED;
    f.signaled = signaled;
    f
}

/// The WQEs of `q` from `from` to its producer index: (start, blocks, signaled).
fn wqes(q: &super::SendQueue, from: u16) -> Vec<(u16, u16, bool)> {
    let mut v = Vec::new();
    let mut p = from;
    while p != q.pi {
        let b = q.block(p);
        // SAFETY: the block is in the ring (test memory alive).
        let (ds, fm) = unsafe { (*b.add(7) & 0x3f, *b.add(11)) };
        let bbs = (ds as u16 * 16).div_ceil(64);
        v.push((p, bbs, fm & 0x0c == 0x08));
        p = p.wrapping_add(bbs);
    }
    v
}

/// The bytes the device reads of the WQE at `start` (the blocks read wrapping through the
/// ring): its DS count of 16-byte units, of which an inline segment's padding after its
/// data is not the device's (the general path leaves older bytes there, as rdma-core's
/// `set_data_inl_seg` does; the fast path writes whole words), nor what the fast path
/// writes beyond DS (an unused inline header).
fn wqe_bytes(q: &super::SendQueue, start: u16) -> Vec<u8> {
    let byte = |i: usize| {
        let b = q.block(start.wrapping_add((i / 64) as u16));
        // SAFETY: byte `i % 64` of a 64-byte block of the ring (test memory alive).
        unsafe { *b.add(i % 64) }
    };
    let ds = (byte(7) & 0x3f) as usize;
    let mut len = ds * 16;
    // An inline write's (opcodes 0x08, 0x09) segment follows the remote address, a send's
    // (0x0a, 0x0b) the control segment: its header's top bit set, the data's length below.
    let at = match byte(3) {
        0x08 | 0x09 => Some(32),
        0x0a | 0x0b => Some(16),
        _ => None,
    };
    if let Some(at) = at.filter(|&at| at + 4 <= len && byte(at) & 0x80 != 0) {
        let n = u32::from_be_bytes([byte(at), byte(at + 1), byte(at + 2), byte(at + 3)]);
        len = len.min(at + 4 + (n & 0x3ff) as usize);
    }
    (0..len).map(byte).collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
    #[test]
    fn accounted_fast_and_general_paths_agree(
        cap in 4u32..40,
        dedicated in proptest::prelude::any::<bool>(),
        steps in proptest::collection::vec(step(), 1..150)
    ) {
        let (mut fm, mut gm) = (mem(), mem());
        let mut f = if dedicated { dedicated_queue(&mut fm) } else { queue(&mut fm, 256, 40) };
        // No BlueFlame: every fast path is off, the general path posts everything.
        let mut g = queue(&mut gm, 0, 40);
        let (fs, gs) = (Arc::new(CqSlots::new(1, cap, None)), Arc::new(CqSlots::new(1, cap, None)));
        f.attach_cq(fs.clone());
        g.attach_cq(gs.clone());
        // Outstanding WQEs (start, blocks, signaled), as the device sees them.
        let mut out: Vec<(u16, u16, bool)> = Vec::new();
        let data: Vec<u8> = (0..40u8).collect();
        let remote = Remote { addr: 0x1000, rkey: 0x77 };
        for (k, st) in steps.iter().enumerate() {
            let cookie = k as u64;
            let start = f.pi;
            let (a, b): (String, String) = match st {
                Step::Write { len, signaled, imm } => {
                    let d = &data[..*len];
                    let req = if *imm {
                        Request::WriteImm { remote, data: Payload::Inline(d), imm: 7 }
                    } else {
                        Request::Write { remote, data: Payload::Inline(d) }
                    };
                    let fl = flags(*signaled);
                    let a = if *imm { f.post(&req, cookie, fl) } else { f.write_inline(d, remote, cookie, fl) };
                    (format!("{a:?}"), format!("{:?}", g.post(&req, cookie, fl)))
                }
                Step::Read { len, signaled } => {
                    let s = [Sge { addr: 0x2000, len: *len, lkey: 5 }];
                    let req = Request::Read { remote, sgl: &s };
                    (format!("{:?}", f.post(&req, cookie, flags(*signaled))),
                     format!("{:?}", g.post(&req, cookie, flags(*signaled))))
                }
                Step::Send { len, signaled } => {
                    let req = Request::Send { data: Payload::Inline(&data[..*len]) };
                    (format!("{:?}", f.post(&req, cookie, flags(*signaled))),
                     format!("{:?}", g.post(&req, cookie, flags(*signaled))))
                }
                Step::List { write, len, signaled } => {
                    let s = [Sge { addr: 0x3000, len: *len, lkey: 6 }];
                    let data = Payload::Sgl(&s);
                    let req = if *write { Request::Write { remote, data } } else { Request::Send { data } };
                    (format!("{:?}", f.post(&req, cookie, flags(*signaled))),
                     format!("{:?}", g.post(&req, cookie, flags(*signaled))))
                }
                Step::Invalidate => {
                    let req = Request::LocalInvalidate { rkey: 0x99 };
                    (format!("{:?}", f.post(&req, cookie, PostFlags::SIGNALED)),
                     format!("{:?}", g.post(&req, cookie, PostFlags::SIGNALED)))
                }
                Step::Complete(n) => {
                    // In order, up to the n-th signaled outstanding WQE.
                    let mut seen = 0;
                    let mut upto = None;
                    for (i, w) in out.iter().enumerate() {
                        if w.2 {
                            if seen == *n { upto = Some(i); break; }
                            seen += 1;
                        }
                    }
                    if let Some(i) = upto {
                        let end = out[i].0.wrapping_add(out[i].1);
                        f.shadow.retire(end);
                        g.shadow.retire(end);
                        out.drain(..=i);
                    }
                    (String::new(), String::new())
                }
                Step::Batch { writes, ring } => {
                    let mut ra = Vec::new();
                    let mut rb = Vec::new();
                    {
                        let mut ba = f.batch();
                        for (j, (len, sig)) in writes.iter().enumerate() {
                            let req = Request::Write { remote, data: Payload::Inline(&data[..*len]) };
                            ra.push(format!("{:?}", ba.push(&req, cookie + j as u64, flags(*sig))));
                        }
                        let mut all = out.clone();
                        all.extend(wqes(ba.sq, start));
                        if ra.iter().any(|r| r.contains("Full")) {
                            proptest::prop_assert!(all.iter().any(|w| w.2) || all.is_empty(),
                                "step {} {:?}: {:?} with only unsignaled WQEs outstanding: {:?}", k, st, ra, all);
                        }
                        if *ring { ba.ring() }
                    }
                    {
                        let mut bb = g.batch();
                        for (j, (len, sig)) in writes.iter().enumerate() {
                            let req = Request::Write { remote, data: Payload::Inline(&data[..*len]) };
                            rb.push(format!("{:?}", bb.push(&req, cookie + j as u64, flags(*sig))));
                        }
                        if *ring { bb.ring() }
                    }
                    (ra.join(","), rb.join(","))
                }
            };
            proptest::prop_assert_eq!(&a, &b, "step {} {:?}", k, st);
            proptest::prop_assert_eq!((f.pi, f.credit), (g.pi, g.credit), "step {} {:?}", k, st);
            let (wf, wg) = (wqes(&f, start), wqes(&g, start));
            proptest::prop_assert_eq!(&wf, &wg, "step {} {:?}", k, st);
            for w in &wf {
                proptest::prop_assert_eq!(wqe_bytes(&f, w.0), wqe_bytes(&g, w.0), "step {} {:?}", k, st);
                let (x, y) = (f.shadow.get(w.0), g.shadow.get(w.0));
                proptest::prop_assert_eq!(format!("{x:?}"), format!("{y:?}"), "step {}", k);
            }
            out.extend(wf);
            // Liveness: a refusal for want of room comes only while something signaled is
            // outstanding (else nothing the user polls would ever free the room).
            if !matches!(st, Step::Batch { .. }) && (a.contains("CqFull") || a.contains("QueueFull")) {
                let any_signaled = out.iter().any(|w| w.2);
                proptest::prop_assert!(any_signaled || out.is_empty(),
                    "step {} {:?}: {} with only unsignaled WQEs outstanding: {:?}", k, st, a, out);
            }
        }
    }
}
