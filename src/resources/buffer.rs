//! Memory the user owns, handed to a region: the [`RegionBuffer`] trait, its implementations
//! for `Vec<u8>`, `Box<[u8]>`, `&'static [u8]` and [`RawBuffer`], and the type-erased holder
//! a region keeps until its registration is gone.

use core::any::TypeId;
use core::ptr::NonNull;

/// The bytes of a buffer while a region holds them: what [`RegionBuffer::into_raw`] gives up
/// and [`RegionBuffer::from_raw`] takes back.
#[derive(Debug)]
pub struct RawParts {
    /// First byte.
    pub ptr: NonNull<u8>,
    /// Bytes registered (at least one).
    pub len: usize,
    /// Whatever else the type needs to rebuild itself (a `Vec`'s capacity, a mapping's
    /// length).
    pub extra: usize,
    /// Whether the bytes may be written (by the CPU and the NIC). False for read-only
    /// memory: such a buffer is registered only without write rights.
    pub writable: bool,
}

/// An owned buffer with a stable address that a [`MemoryRegion`](super::MemoryRegion) can
/// register and give back ([`Pd::register`](super::Pd::register),
/// [`MemoryRegion::into_buffer`](super::MemoryRegion::into_buffer)).
///
/// Implemented for `Vec<u8>`, `Box<[u8]>`, `&'static [u8]` (read-only),
/// [`HugePages`](crate::mapping::HugePages), [`MappedFile`](crate::mapping::MappedFile) and
/// [`RawBuffer`].
///
/// # Safety
/// `into_raw` gives the bytes up: from then until `from_raw` takes them back (with exactly
/// the parts `into_raw` returned), the `len` bytes at `ptr` stay allocated at that address,
/// nothing but the region (the CPU copies of [`MemoryRegion`](super::MemoryRegion) and the
/// NIC) reads or writes them, and, when `writable` is true, they may be written. `from_raw`
/// is called at most once per `into_raw`, and only after the device has deregistered them.
pub unsafe trait RegionBuffer: Send + Sized + 'static {
    /// Gives the bytes up (see the trait's contract).
    fn into_raw(self) -> RawParts;
    /// Rebuilds the value from what [`RegionBuffer::into_raw`] returned.
    ///
    /// # Safety
    /// `parts` are exactly what `into_raw` returned for one value, used once.
    unsafe fn from_raw(parts: RawParts) -> Self;
}

// SAFETY: a Vec's heap block stays where it is until the Vec is rebuilt (it is not touched
// in between: the parts are the only handle), and `from_raw_parts` rebuilds it from its
// pointer, length and capacity.
unsafe impl RegionBuffer for Vec<u8> {
    fn into_raw(self) -> RawParts {
        let mut v = core::mem::ManuallyDrop::new(self);
        RawParts {
            // `as_mut_ptr` makes no reference to the bytes; a Vec's pointer is never null.
            ptr: NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len: v.len(),
            extra: v.capacity(),
            writable: true,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        // SAFETY: the caller passes back what `into_raw` took apart, once.
        unsafe { Vec::from_raw_parts(p.ptr.as_ptr(), p.len, p.extra) }
    }
}

// SAFETY: the box is turned into a raw pointer (a moved `Box` would assert uniqueness over
// the bytes the NIC writes) and rebuilt with `Box::from_raw`, once.
unsafe impl RegionBuffer for Box<[u8]> {
    fn into_raw(self) -> RawParts {
        let len = self.len();
        let ptr = Box::into_raw(self).cast::<u8>();
        RawParts {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            extra: 0,
            writable: true,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        let slice = core::ptr::slice_from_raw_parts_mut(p.ptr.as_ptr(), p.len);
        // SAFETY: the caller passes back what `into_raw` took apart, once.
        unsafe { Box::from_raw(slice) }
    }
}

// SAFETY: 'static bytes never go away; they are marked read-only, so they are registered
// only without write rights and `MemoryRegion::write` refuses them (nothing writes them).
unsafe impl RegionBuffer for &'static [u8] {
    fn into_raw(self) -> RawParts {
        RawParts {
            ptr: NonNull::new(self.as_ptr().cast_mut()).unwrap_or(NonNull::dangling()),
            len: self.len(),
            extra: 0,
            writable: false,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        // SAFETY: the parts came from a `&'static [u8]`, never written since.
        unsafe { core::slice::from_raw_parts(p.ptr.as_ptr(), p.len) }
    }
}

/// Memory the caller vouches for, by address and length: the `unsafe` form of
/// registration ([`Pd::register_raw`](super::Pd::register_raw)). Dropping it does nothing;
/// [`MemoryRegion::into_buffer`](super::MemoryRegion::into_buffer) gives it back once the
/// device no longer uses the bytes, which is when the caller may free or reuse them.
#[derive(Debug)]
pub struct RawBuffer {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: a RawBuffer is an address and a length; `RawBuffer::new`'s contract makes the
// bytes usable from any thread (they are touched only through atomics and by the device).
unsafe impl Send for RawBuffer {}

impl RawBuffer {
    /// `len` bytes at `ptr`, `writable` or read-only.
    ///
    /// # Safety
    /// From this call until the buffer is given back by
    /// [`PendingBuffer::try_take`](super::PendingBuffer::try_take) (or, when the region is
    /// dropped instead, until [`Pd::reclaim`](super::Pd::reclaim) returns 0 while the
    /// protection domain lives; once the domain is gone, until every CQ its QPs' and SRQs'
    /// receives completed on is dropped too: a CQ's poller may still be copying a message
    /// that arrived inside a CQE into the bytes until then):
    /// - `ptr .. ptr + len` stays allocated and mapped (readable; writable when `writable`);
    /// - no Rust reference (`&`/`&mut`) to those bytes is used, and nothing else reads or
    ///   writes them except through atomics: the NIC writes them at any time and
    ///   [`MemoryRegion`](super::MemoryRegion)'s copies use relaxed atomic loads and stores;
    /// - any other registration overlapping them has the same bounds, or both start and
    ///   end on 8-byte boundaries (the copies use 8-byte atomics on the whole aligned words
    ///   of a region and 1-byte atomics on its edges; atomics of different sizes on the same
    ///   bytes may not race).
    pub unsafe fn new(ptr: NonNull<u8>, len: usize, writable: bool) -> RawBuffer {
        RawBuffer { ptr, len, writable }
    }
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// SAFETY: the contract of `RawBuffer::new` is this trait's contract, moved to the caller.
unsafe impl RegionBuffer for RawBuffer {
    fn into_raw(self) -> RawParts {
        RawParts {
            ptr: self.ptr,
            len: self.len,
            extra: 0,
            writable: self.writable,
        }
    }
    unsafe fn from_raw(p: RawParts) -> Self {
        RawBuffer {
            ptr: p.ptr,
            len: p.len,
            writable: p.writable,
        }
    }
}

/// A buffer a region holds, its type erased: rebuilt and dropped (or handed back) only after
/// the registration is gone.
pub(crate) struct Owned {
    parts: Option<RawParts>,
    type_id: TypeId,
    type_name: &'static str,
    drop_fn: unsafe fn(RawParts),
}

// SAFETY: the parts stand for a value of a `RegionBuffer` type, which is `Send`.
unsafe impl Send for Owned {}
// SAFETY: `&Owned` gives out only the address, length and type (plain values); the bytes
// themselves are reached through the region's atomics, never through the buffer value.
unsafe impl Sync for Owned {}

unsafe fn drop_as<B: RegionBuffer>(p: RawParts) {
    // SAFETY: `Owned::new::<B>` stored these parts from `B::into_raw`; used once (Drop).
    drop(unsafe { B::from_raw(p) })
}

impl Owned {
    pub(crate) fn new<B: RegionBuffer>(buf: B) -> Owned {
        Owned {
            parts: Some(buf.into_raw()),
            type_id: TypeId::of::<B>(),
            type_name: core::any::type_name::<B>(),
            drop_fn: drop_as::<B>,
        }
    }

    pub(crate) fn parts(&self) -> &RawParts {
        self.parts
            .as_ref()
            .expect("parts are taken only by into/drop")
    }

    pub(crate) fn type_name(&self) -> &'static str {
        self.type_name
    }

    pub(crate) fn is<B: RegionBuffer>(&self) -> bool {
        self.type_id == TypeId::of::<B>()
    }

    /// The buffer back, or `self` when it is of another type.
    ///
    /// # Safety
    /// The registration of these bytes is gone (the device no longer uses them).
    pub(crate) unsafe fn into<B: RegionBuffer>(mut self) -> Result<B, Owned> {
        if !self.is::<B>() {
            return Err(self);
        }
        let p = self.parts.take().expect("parts present until taken");
        // SAFETY: same type as stored; the caller says the device is done with the bytes.
        Ok(unsafe { B::from_raw(p) })
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(p) = self.parts.take() {
            // SAFETY: an Owned is dropped only once its registration is gone (it lives in
            // the registration that is parked until deregistered, or leaked with it).
            unsafe { (self.drop_fn)(p) }
        }
    }
}

/// The operating system's page size (`sysconf(_SC_PAGESIZE)`, at least 4096): the kernel's
/// `PAGE_SIZE`, by which it pins and maps registered memory.
pub(crate) fn os_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}
