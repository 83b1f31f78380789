//! The region pin protocol (`src/queue/pin.rs`), model-checked with loom: every
//! interleaving of receives posted and completed on two threads, the region's drop on a
//! third, and a reclaim on a fourth (issue 25, "a receive can outlive its region").
//!
//! The file under test is compiled here against loom's atomics (`sync` below is its
//! `super::sync`); the releasing side is written as `resources/lifetime.rs` uses it: close
//! the pins, deregister at once when none is held, else park, and deregister a parked
//! region at a reclaim once none is held. loom's `UnsafeCell` stands for the region's bytes:
//! the poller's copy into them and the owner's use of them after the deregistration must be
//! ordered (happen-before), or loom reports the race; a receive that pins after the close,
//! a deregistration under a pin, or one made twice or never fail the assertions.

mod sync {
    pub(crate) use loom::sync::atomic::{AtomicU32, Ordering};
}

#[path = "../src/queue/pin.rs"]
#[allow(dead_code)]
mod pin;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};

/// One registered region: its pins, its bytes (one word per receive: two receives land in
/// different bytes), whether its registration is parked, and how many times it was
/// deregistered.
struct Region {
    pins: pin::Pins,
    bytes: [UnsafeCell<u64>; 2],
    parked: Mutex<bool>,
    deregistered: AtomicUsize,
}

impl Region {
    fn new() -> Region {
        Region {
            pins: pin::Pins::new(),
            bytes: [UnsafeCell::new(0), UnsafeCell::new(0)],
            parked: Mutex::new(false),
            deregistered: AtomicUsize::new(0),
        }
    }

    /// Receive `i`: pinned (one step), then the device completes it and the poller copies
    /// the message into its bytes of the region, then gives the pin back. False when the
    /// region was gone.
    fn receive(&self, i: usize) -> bool {
        if !self.pins.pin() {
            return false;
        }
        assert_eq!(
            self.deregistered.load(Ordering::Relaxed),
            0,
            "a receive pinned a deregistered region"
        );
        self.bytes[i].with_mut(|b| {
            // SAFETY: loom's cell hands out a valid pointer; whether this write is ordered
            // against the owner's is what loom checks.
            unsafe { *b = i as u64 + 1 }
        });
        self.pins.unpin();
        true
    }

    /// The registration goes and the owner has the bytes back: it writes them.
    fn deregister(&self) {
        assert_eq!(
            self.deregistered.fetch_add(1, Ordering::Relaxed),
            0,
            "deregistered twice"
        );
        for b in &self.bytes {
            b.with_mut(|b| {
                // SAFETY: as in `receive`.
                unsafe { *b = 0xdead }
            });
        }
    }

    /// `Lifetimes::release`: close, deregister now or park, then reclaim.
    fn release(&self) {
        if self.pins.close() {
            self.deregister();
        } else {
            *self.parked.lock().unwrap() = true;
        }
        self.reclaim();
    }

    /// `Lifetimes::reclaim`: a parked registration with no pin left is deregistered.
    fn reclaim(&self) {
        let mut parked = self.parked.lock().unwrap();
        if *parked && self.pins.released() {
            *parked = false;
            self.deregister();
        }
    }
}

/// Runs `f` under loom with at most three preemptions per execution (loom's advice for
/// models of this size: the bugs it finds need few), every interleaving within that bound.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Spawns `f` on a loom thread over a clone of `r`.
fn on(r: &Arc<Region>, f: fn(&Region)) -> loom::thread::JoinHandle<()> {
    let r = r.clone();
    loom::thread::spawn(move || f(&r))
}

/// The end of a model: the next reclaim point after every receive completed deregisters
/// the region, exactly once, and nothing pins it any more.
fn settle(r: &Region) {
    r.reclaim();
    assert_eq!(
        r.deregistered.load(Ordering::Relaxed),
        1,
        "deregistered once"
    );
    assert!(r.pins.released());
    assert!(!r.pins.pin(), "no pin after the close");
}

/// Two receives race the drop of their region: whatever the interleaving, no receive
/// writes the region after it was deregistered (loom checks the bytes), and a receive that
/// found it gone wrote nothing.
#[test]
fn receives_racing_the_release_of_their_region_never_write_it_after_deregistration() {
    model(|| {
        let r = Arc::new(Region::new());
        let threads = [
            on(&r, |r| {
                r.receive(0);
            }),
            on(&r, |r| {
                r.receive(1);
            }),
            on(&r, Region::release),
        ];
        for t in threads {
            t.join().unwrap();
        }
        settle(&r);
    });
}

/// A receive, the release and a reclaim on three threads: the last pin's holder and the
/// reclaim race to see the count drop; the region is deregistered exactly once, and only
/// after the receive's write.
#[test]
fn a_reclaim_racing_the_last_unpin_deregisters_once_after_the_write() {
    model(|| {
        let r = Arc::new(Region::new());
        let threads = [
            on(&r, |r| {
                r.receive(0);
            }),
            on(&r, Region::release),
            on(&r, Region::reclaim),
        ];
        for t in threads {
            t.join().unwrap();
        }
        settle(&r);
    });
}

/// A pin taken before the close holds the region: it is parked, not deregistered, until
/// the pin goes (sequential: the exact states).
#[test]
fn a_pin_taken_before_the_close_parks_the_region_until_it_goes() {
    loom::model(|| {
        let p = pin::Pins::new();
        assert!(p.pin());
        assert!(p.pin());
        assert!(!p.close(), "two pins held");
        assert!(!p.pin(), "closed");
        p.unpin();
        assert!(!p.released());
        p.unpin();
        assert!(p.released());
    });
}
