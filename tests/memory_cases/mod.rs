//! Memory the user owns, the same cases on any device: the software NIC
//! (`tests/memory/memory.rs`) and rxe (`tests/rxe/rxe_memory.rs`, in the VM).
#![allow(dead_code)]

use blueflame::mapping::{HugePages, MappedFile, PageSize};
use blueflame::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const RIGHTS: Access = Access(1 | 2 | 4 | 8); // local write, remote write/read/atomic

/// Two connected QPs of one domain, each with its own CQ.
pub struct Rig {
    pub dev: Device,
    pub pd: Pd,
    pub a: Qp,
    pub b: Qp,
    pub cq_a: Cq,
    pub cq_b: Cq,
}

impl Rig {
    pub fn new(dev: &Device) -> Rig {
        let pd = dev.alloc_pd().expect("pd");
        let cq_a = dev.create_cq(64).expect("cq a");
        let cq_b = dev.create_cq(64).expect("cq b");
        let caps = QpCaps {
            sq_blocks: 64,
            rq_entries: 32,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline: 64,
            bf_size: 256,
            rnr_retry: 7,
            ..QpCaps::default()
        };
        let mut a = pd.create_qp(&cq_a, &cq_a, caps).expect("qp a");
        let mut b = pd.create_qp(&cq_b, &cq_b, caps).expect("qp b");
        let (ea, eb) = (a.endpoint().expect("ep a"), b.endpoint().expect("ep b"));
        a.connect(&eb).expect("connect a");
        b.connect(&ea).expect("connect b");
        Rig {
            dev: dev.clone(),
            pd,
            a,
            b,
            cq_a,
            cq_b,
        }
    }

    /// `n` completions of A's (or B's) CQ, 20 s at most.
    pub fn wait(&mut self, on_b: bool, n: usize) -> Vec<Completion> {
        let mut out = vec![Completion::default(); n];
        let mut got = 0;
        let start = Instant::now();
        while got < n {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out: {got} of {n} completions"
            );
            self.dev.process();
            let cq = if on_b { &mut self.cq_b } else { &mut self.cq_a };
            got += cq.poll(&mut out[got..]);
        }
        out
    }

    pub fn ok(&mut self, cookie: u64) -> Completion {
        let c = self.wait(false, 1)[0];
        assert_eq!((c.cookie, c.status), (cookie, WcStatus::Success), "{c:?}");
        c
    }
}

fn bytes(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v).expect("read back");
    v
}

/// The first 8-byte aligned offset of a region (atomics need an aligned remote address).
fn aligned(mr: &MemoryRegion) -> usize {
    ((8 - mr.addr() % 8) % 8) as usize
}

/// A `Vec<u8>`, a `Box<[u8]>` and a `&'static [u8]` serve writes, reads, sends and atomics.
pub fn owned_forms_serve_every_operation(dev: &Device) {
    let mut r = Rig::new(dev);
    let src =
        r.pd.register(b"0123456789abcdef".to_vec(), Access::NONE)
            .expect("vec");
    let dst =
        r.pd.register(vec![0u8; 256].into_boxed_slice(), RIGHTS)
            .expect("box");
    static RODATA: &[u8] = b"read-only bytes!";
    let ro = r.pd.register(RODATA, Access::REMOTE_READ).expect("static");
    // write: Vec -> Box
    r.a.write(
        &[src.sge(0, 16).unwrap()],
        dst.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(1);
    assert_eq!(bytes(&dst, 0, 16), b"0123456789abcdef");
    // read: &'static -> Box
    r.a.read(
        &[dst.sge(32, 16).unwrap()],
        ro.remote(0).unwrap(),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(2);
    assert_eq!(bytes(&dst, 32, 16), b"read-only bytes!");
    // send: &'static -> a receive in the Box
    r.b.post_recv(&[dst.sge(64, 32).unwrap()], 7).unwrap();
    r.a.send(
        Payload::Sgl(&[ro.sge(0, 16).unwrap()]),
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(3);
    let c = r.wait(true, 1)[0];
    assert_eq!((c.cookie, c.status, c.byte_len), (7, WcStatus::Success, 16));
    assert_eq!(bytes(&dst, 64, 16), b"read-only bytes!");
    // atomics on the Box, old value into the Box
    let t = 128 + aligned(&dst);
    dst.write(t, &5u64.to_ne_bytes()).unwrap();
    r.a.fetch_add(
        dst.remote(t).unwrap(),
        10,
        dst.sge(t + 16, 8).unwrap(),
        4,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(4);
    assert_eq!(dst.read_u64(t).unwrap(), 15);
    let old = r.a.atomic_result(&bytes(&dst, t + 16, 8)).unwrap();
    assert_eq!(old, 5);
    r.a.compare_swap(
        dst.remote(t).unwrap(),
        15,
        99,
        dst.sge(t + 16, 8).unwrap(),
        5,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(5);
    assert_eq!(dst.read_u64(t).unwrap(), 99);
}

/// The device moves bytes into the user's own buffer (no copy): they are in the `Vec` it
/// gets back, at the address the region reported.
pub fn the_device_writes_the_users_buffer_in_place(dev: &Device) {
    let mut r = Rig::new(dev);
    let mut v = vec![0u8; 4096];
    let addr = v.as_mut_ptr() as u64;
    let dst = r.pd.register(v, RIGHTS).unwrap();
    assert_eq!(dst.addr(), addr, "registered where the Vec lives");
    assert_eq!(dst.len(), 4096);
    let src = r.pd.register(vec![0xabu8; 100], Access::NONE).unwrap();
    r.a.write(
        &[src.sge(0, 100).unwrap()],
        dst.remote(1000).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(1);
    let back: Vec<u8> = dst
        .into_buffer()
        .unwrap()
        .try_take()
        .expect("idle: back at once");
    assert_eq!(back.as_ptr() as u64, addr);
    assert!(back[1000..1100].iter().all(|&b| b == 0xab));
    assert!(back[..1000].iter().chain(&back[1100..]).all(|&b| b == 0));
}

/// A buffer whose drop is seen.
pub struct Tracked {
    pub bytes: Vec<u8>,
    pub dropped: Arc<AtomicBool>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

// SAFETY: the bytes are a Vec's heap block (as Vec's own impl); the flag rides along in a
// leaked box until `from_raw`.
unsafe impl RegionBuffer for Tracked {
    fn into_raw(self) -> RawParts {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: read out once; `me` is never dropped.
        let (bytes, flag) = unsafe { (std::ptr::read(&me.bytes), std::ptr::read(&me.dropped)) };
        let mut p = bytes.into_raw();
        assert_eq!(p.extra, p.len, "test buffers have len == capacity");
        p.extra = Box::into_raw(Box::new(flag)) as usize;
        p
    }
    unsafe fn from_raw(mut p: RawParts) -> Self {
        // SAFETY: made by `into_raw` above.
        let dropped = *unsafe { Box::from_raw(p.extra as *mut Arc<AtomicBool>) };
        p.extra = p.len;
        Tracked {
            // SAFETY: the Vec's parts, as `into_raw` took them.
            bytes: unsafe { Vec::from_raw_parts(p.ptr.as_ptr(), p.len, p.extra) },
            dropped,
        }
    }
}

pub fn tracked(len: usize, fill: u8) -> (Tracked, Arc<AtomicBool>) {
    let flag = Arc::new(AtomicBool::new(false));
    (
        Tracked {
            bytes: vec![fill; len],
            dropped: flag.clone(),
        },
        flag,
    )
}

/// A region dropped (or turned back into its buffer) with a request in flight keeps its
/// buffer registered and alive until the request completes.
pub fn buffers_outlive_requests_in_flight(dev: &Device) {
    let mut r = Rig::new(dev);
    let dst = r.pd.alloc_mr(4096, RIGHTS).unwrap();
    // Dropped with a write in flight: not freed until it completed.
    let (buf, dropped) = tracked(4096, 0x5a);
    let src = r.pd.register(buf, Access::NONE).unwrap();
    r.a.write(
        &[src.sge(0, 4096).unwrap()],
        dst.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    drop(src);
    assert!(
        !dropped.load(Ordering::SeqCst),
        "freed while the device may still read it"
    );
    assert_eq!(r.pd.reclaim(), 1, "parked");
    r.ok(1);
    assert!(
        bytes(&dst, 0, 4096).iter().all(|&b| b == 0x5a),
        "the write read live bytes"
    );
    assert_eq!(r.pd.reclaim(), 0);
    assert!(
        dropped.load(Ordering::SeqCst),
        "freed once the write completed"
    );

    // Turned back into its buffer with a read in flight that writes it.
    dst.write(0, b"fresh").unwrap();
    let (buf, dropped) = tracked(64, 0);
    let land = r.pd.register(buf, RIGHTS).unwrap();
    r.a.read(
        &[land.sge(0, 5).unwrap()],
        dst.remote(0).unwrap(),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut pending = land.into_buffer::<Tracked>().unwrap();
    assert!(
        pending.try_take().is_none(),
        "not back while the read is outstanding"
    );
    r.ok(2);
    let back = pending.try_take().expect("back once the read completed");
    assert_eq!(&back.bytes[..5], b"fresh");
    assert!(pending.try_take().is_none(), "given back once");
    assert!(!dropped.load(Ordering::SeqCst));
    drop(back);
    assert!(dropped.load(Ordering::SeqCst));

    // A pending buffer dropped before the work completed: freed after it, not before.
    let (buf, dropped) = tracked(64, 1);
    let src = r.pd.register(buf, Access::NONE).unwrap();
    r.a.write(
        &[src.sge(0, 8).unwrap()],
        dst.remote(0).unwrap(),
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    drop(src.into_buffer::<Tracked>().unwrap());
    assert!(!dropped.load(Ordering::SeqCst));
    r.ok(3);
    r.pd.reclaim();
    assert!(dropped.load(Ordering::SeqCst));
}

/// Read-only memory takes no write rights, and the CPU cannot write it through the region.
pub fn read_only_memory_refuses_write_rights(dev: &Device) {
    let r = Rig::new(dev);
    static RO: &[u8] = b"constant";
    for w in [
        Access::LOCAL_WRITE,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        RIGHTS,
    ] {
        match r.pd.register(RO, w) {
            Err(Refused {
                value,
                error: Error::ReadOnlyBuffer { access },
            }) => {
                assert_eq!(access, w);
                assert_eq!(value, RO, "the buffer comes back");
            }
            other => panic!("{w}: {other:?}"),
        }
    }
    let mr = r.pd.register(RO, Access::REMOTE_READ).unwrap();
    assert!(matches!(
        mr.write(0, b"x"),
        Err(Error::ReadOnlyBuffer { .. })
    ));
    assert_eq!(bytes(&mr, 0, 8), b"constant");
    // An empty buffer is refused and given back.
    match r.pd.register(Vec::<u8>::new(), Access::NONE) {
        Err(Refused {
            value,
            error: Error::InvalidParameter { .. },
        }) => assert!(value.is_empty()),
        other => panic!("{other:?}"),
    }
}

/// `into_buffer` asks for the type the region holds.
pub fn into_buffer_checks_the_type(dev: &Device) {
    let r = Rig::new(dev);
    let mr = r.pd.register(vec![1u8; 8], Access::NONE).unwrap();
    let mr = match mr.into_buffer::<Box<[u8]>>() {
        Err(Refused {
            value,
            error: Error::BufferType { holds, .. },
        }) => {
            assert!(holds.contains("Vec"), "{holds}");
            value
        }
        other => panic!("{other:?}"),
    };
    mr.write(0, b"ok").unwrap(); // still a live region
    let v: Vec<u8> = mr.into_buffer().unwrap().try_take().unwrap();
    assert_eq!(&v[..], &[b'o', b'k', 1, 1, 1, 1, 1, 1]);
    let own = r.pd.alloc_mr(64, Access::NONE).unwrap();
    assert!(matches!(
        own.into_buffer::<Vec<u8>>(),
        Err(Refused {
            error: Error::BufferType { .. },
            ..
        })
    ));
}

/// A `Vec` registers its length, not its capacity: the key checks and bounds apply to it.
pub fn a_vec_registers_its_length_only(dev: &Device) {
    let mut r = Rig::new(dev);
    let mut v = Vec::with_capacity(4096);
    v.resize(16, 7u8);
    let src = r.pd.register(v, Access::NONE).unwrap();
    assert_eq!(src.len(), 16);
    assert!(src.sge(0, 17).is_err());
    let dst = r.pd.alloc_mr(4096, RIGHTS).unwrap();
    // Past its length (inside the capacity): a local protection error from the device.
    let past = Sge {
        addr: src.addr(),
        len: 32,
        lkey: src.lkey(),
    };
    r.a.write(&[past], dst.remote(0).unwrap(), 1, PostFlags::SIGNALED)
        .unwrap();
    let c = r.wait(false, 1)[0];
    assert_eq!(c.status, WcStatus::LocProtErr, "{c:?}");
}

/// The `unsafe` form: memory owned elsewhere, given back as a `RawBuffer` when the device
/// is done with it.
pub fn raw_registration(dev: &Device) {
    let mut r = Rig::new(dev);
    let mut mine = vec![0u8; 256].into_boxed_slice();
    let ptr = mine.as_mut_ptr();
    // SAFETY: `mine` stays alive and untouched until the RawBuffer comes back below.
    let dst = unsafe { r.pd.register_raw(ptr, 256, true, RIGHTS) }.unwrap();
    let src = r.pd.register(b"raw!".to_vec(), Access::NONE).unwrap();
    r.a.write(
        &[src.sge(0, 4).unwrap()],
        dst.remote(8).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    let mut pending = dst.into_buffer::<RawBuffer>().unwrap();
    assert!(pending.try_take().is_none(), "the write is outstanding");
    r.ok(1);
    let raw = pending.try_take().unwrap();
    assert_eq!((raw.as_ptr(), raw.len()), (ptr, 256));
    assert_eq!(&mine[8..12], b"raw!");
    // SAFETY: null is refused before anything else.
    let null = unsafe {
        r.pd.register_raw(std::ptr::null_mut(), 8, true, Access::NONE)
    };
    assert!(matches!(null, Err(Error::InvalidParameter { .. })));
}

/// Huge pages, or the error naming the sysctl when there are none; the fallback registers
/// either way and says what it got.
pub fn huge_pages_or_the_sysctl(dev: &Device) {
    let mut r = Rig::new(dev);
    let free2m = free_huge_pages("hugepages-2048kB");
    match HugePages::new(3 << 20, PageSize::Huge2M) {
        Ok(h) => {
            assert!(free2m >= 2, "got huge pages with {free2m} free");
            assert_eq!((h.len(), h.page_size()), (4 << 20, PageSize::Huge2M));
            assert_eq!(h.as_ptr() as usize % (2 << 20), 0, "2 MiB aligned");
            println!("2 MiB huge pages: mapped and registered");
        }
        Err(Error::NoHugePages {
            page_size,
            len,
            sysctl,
        }) => {
            assert!(free2m < 2, "{free2m} free pages, still refused");
            assert_eq!((page_size, len), (2 << 20, 4 << 20));
            assert!(sysctl.contains("vm.nr_hugepages"), "{sysctl}");
            println!("2 MiB huge pages: none reserved ({sysctl})");
        }
        Err(e) => panic!("{e}"),
    }
    match HugePages::new(1, PageSize::Huge1G) {
        Ok(h) => assert_eq!(h.page_size(), PageSize::Huge1G),
        Err(Error::NoHugePages { sysctl, .. }) => {
            assert!(
                sysctl.contains("hugepages-1048576kB/nr_hugepages"),
                "{sysctl}"
            )
        }
        Err(e) => panic!("{e}"),
    }
    let h = match HugePages::new(1 << 20, PageSize::Huge2M) {
        Err(Error::NoHugePages { .. }) => HugePages::new(1 << 20, PageSize::Normal),
        r => r,
    }
    .unwrap();
    let expect = if free2m >= 1 {
        PageSize::Huge2M
    } else {
        PageSize::Normal
    };
    assert_eq!(h.page_size(), expect);
    let got = h.page_size();
    let mr = r.pd.register(h, RIGHTS).unwrap();
    let src = r.pd.register(vec![9u8; 64], Access::NONE).unwrap();
    r.a.write(
        &[src.sge(0, 64).unwrap()],
        mr.remote(4000).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(1);
    let back: HugePages = mr.into_buffer().unwrap().try_take().unwrap();
    assert_eq!(back.page_size(), got);
    // SAFETY: the mapping is ours again and nothing else touches it.
    let seen = unsafe { std::slice::from_raw_parts(back.as_ptr().add(4000), 64) };
    assert!(seen.iter().all(|&b| b == 9));
    assert!(matches!(
        HugePages::new(0, PageSize::Huge2M),
        Err(Error::InvalidParameter { .. })
    ));
}

/// Free huge pages of one size (0 when the system does not list the size).
pub fn free_huge_pages(dir: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/{dir}/free_hugepages"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// A file mapped read-only serves reads and refuses write rights; a writable map receives
/// writes that reach the file. `path` is the file (created or truncated here).
pub fn mapped_files(dev: &Device, path: &std::path::Path) {
    use std::io::Write;
    let mut r = Rig::new(dev);
    let path = path.to_path_buf();
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&[b'f'; 8192]).unwrap();
    drop(f);
    // SAFETY: this test's own file, truncated only after every mapping of it is gone.
    let ro = unsafe { MappedFile::map(&std::fs::File::open(&path).unwrap(), false) }.unwrap();
    let ro = match r
        .pd
        .register(ro, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
    {
        Err(Refused {
            value,
            error: Error::ReadOnlyBuffer { .. },
        }) => value,
        other => panic!("{other:?}"),
    };
    let ro = r.pd.register(ro, Access::REMOTE_READ).unwrap();
    let dst = r.pd.alloc_mr(64, RIGHTS).unwrap();
    r.a.read(
        &[dst.sge(0, 16).unwrap()],
        ro.remote(8000).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(1);
    assert_eq!(bytes(&dst, 0, 16), [b'f'; 16]);
    drop(ro);
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: as above.
    let rw = unsafe { MappedFile::map(&rw, true) }.unwrap();
    let rw = r.pd.register(rw, RIGHTS);
    match rw {
        Ok(rw) => {
            dst.write(0, b"written by RDMA").unwrap();
            r.a.write(
                &[dst.sge(0, 15).unwrap()],
                rw.remote(100).unwrap(),
                2,
                PostFlags::SIGNALED,
            )
            .unwrap();
            r.ok(2);
            let m: MappedFile = rw.into_buffer().unwrap().try_take().unwrap();
            drop(m);
            let content = std::fs::read(&path).unwrap();
            assert_eq!(&content[100..115], b"written by RDMA");
            println!("writable shared file mapping: registered, written");
        }
        // Kernels that refuse long-term write pins of file pages (6.5+ outside shmem).
        Err(Refused { error, .. }) => println!("writable shared file mapping refused: {error}"),
    }
    std::fs::File::create(&path).unwrap(); // truncated to 0
                                           // SAFETY: refused (an empty file): nothing is mapped.
    let empty = unsafe { MappedFile::map(&std::fs::File::open(&path).unwrap(), false) };
    assert!(matches!(empty, Err(Error::InvalidParameter { .. })));
}

/// A memfd (shmem: tmpfs pages the kernel pins like anonymous memory), named by its
/// `/proc/self/fd` path; keep the descriptor while the path is used.
pub fn memfd_file() -> (std::os::fd::OwnedFd, std::path::PathBuf) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: memfd_create with a valid C string; the descriptor is owned from here on.
    let fd = unsafe { libc::memfd_create(c"blueflame-map".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let path = std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    (fd, path)
}

/// Explicit on-demand regions when `odp_caps` has RC support, else the typed error;
/// implicit likewise.
pub fn on_demand_paging(dev: &Device) {
    let caps = dev.odp_caps();
    println!("odp_caps: {caps:?}");
    let r = Rig::new(dev);
    let reg = r.pd.register(vec![0u8; 8192], RIGHTS | Access::ON_DEMAND);
    if caps.rc(true) {
        let mr = reg.expect("on-demand registration");
        match mr.prefetch(0, 8192, true, true) {
            Ok(()) => println!("explicit ODP: registered and prefetched"),
            // A kernel without `ibv_advise_mr`'s ioctl (the kernel model's write ABI).
            Err(Error::Capability(Capability::Prefetch)) => {
                println!("explicit ODP: registered; prefetch refused with Capability::Prefetch")
            }
            Err(e) => panic!("prefetch: {e:?}"),
        }
    } else {
        assert!(
            matches!(
                reg,
                Err(Refused {
                    error: Error::Capability(Capability::OnDemandPaging),
                    ..
                })
            ),
            "{reg:?}"
        );
        println!("explicit ODP: not reported, refused with Capability::OnDemandPaging");
    }
    // SAFETY: local write only, no request names it; refused or dropped at once.
    let implicit = unsafe { r.pd.register_implicit_odp(Access::LOCAL_WRITE) };
    if caps.implicit() {
        let mr = implicit.expect("implicit ODP");
        assert_eq!(mr.addr(), 0);
        assert!(matches!(
            mr.read(0, &mut [0u8; 1]),
            Err(Error::NoCpuMapping)
        ));
        println!("implicit ODP: registered");
    } else {
        assert!(
            matches!(
                implicit,
                Err(Error::Capability(Capability::ImplicitOnDemandPaging))
            ),
            "{implicit:?}"
        );
        println!("implicit ODP: not reported, refused with Capability::ImplicitOnDemandPaging");
    }
}

/// A udmabuf when the kernel has `/dev/udmabuf`; otherwise a memfd (not a dma-buf) shows
/// what the device answers: `Capability::DmaBuf` for a provider without
/// `ibv_reg_dmabuf_mr` (rxe), an error for a bad fd elsewhere.
pub fn dma_buf(dev: &Device) {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let r = Rig::new(dev);
    println!(
        "/dev/udmabuf: {}",
        if std::path::Path::new("/dev/udmabuf").exists() {
            "present"
        } else {
            "absent"
        }
    );
    // SAFETY: memfd_create with a valid C string; the fd is owned from here on.
    let fd = unsafe { libc::memfd_create(c"blueflame-dmabuf".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let res =
        r.pd.register_dmabuf(fd.as_fd(), 0, 4096, 0x10000, Access::LOCAL_WRITE);
    println!("ibv_reg_dmabuf_mr: {res:?}");
    match res {
        Err(Error::Capability(Capability::DmaBuf)) => {}
        Err(Error::Verbs(e)) => println!("dma-buf registration exists; a memfd is refused: {e}"),
        other => panic!("a memfd is no dma-buf: {other:?}"),
    }
}

/// How a QP that never ran is left before it is dropped (an RC QP is created in INIT, where
/// it takes receives).
#[derive(Clone, Copy, Debug)]
pub enum Unconnected {
    /// Never connected: dropped in INIT.
    Never,
    /// Its `connect` refused (a bare QP number, no address): left in INIT.
    Refused,
    /// Moved to error before it was connected: its own receives flush.
    Errored,
}

/// Polls `cq` until `n` completions came, then for `settle` more: what came (20 s at most).
fn drain(dev: &Device, cq: &mut Cq, n: usize, settle: Duration) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut out = [Completion::default(); 16];
    let start = Instant::now();
    let mut full_at = None;
    loop {
        dev.process();
        let k = cq.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        if got.len() >= n && full_at.is_none() {
            full_at = Some(Instant::now());
        }
        if full_at.is_some_and(|t| t.elapsed() >= settle) {
            return got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {got:?}, {n} wanted"
        );
        std::thread::yield_now();
    }
}

/// The drop of an RC QP that was never connected, whose `connect` was refused, or that was
/// moved to error before connecting, with receives posted on its own receive queue or on an
/// SRQ, gives everything back: its receive CQ reports no completion of it afterwards and
/// another QP's completions exactly once; the region its receives pointed into is
/// deregistered and its buffer handed back; an SRQ's WQEs it never consumed stay for the
/// next QP on the SRQ; and the CQ's whole capacity is there again for another QP.
/// Since RC QPs are created in INIT every path takes receives before `connect`, so a
/// never-connected QP's drop meets posted receives on the verbs path too.
pub fn an_unconnected_qp_gives_everything_back(dev: &Device) {
    for how in [
        Unconnected::Never,
        Unconnected::Refused,
        Unconnected::Errored,
    ] {
        for on_srq in [false, true] {
            unconnected_teardown(dev, how, on_srq);
        }
    }
}

fn unconnected_teardown(dev: &Device, how: Unconnected, on_srq: bool) {
    const N: u64 = 4;
    let ctx = format!("{how:?}, on an SRQ {on_srq}");
    let pd = dev.alloc_pd().expect("pd");
    let mut cq = dev.create_cq(32).expect("receive cq");
    let mut scq = dev.create_cq(64).expect("send cq");
    let caps = QpCaps {
        sq_blocks: 64,
        rq_entries: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline: 64,
        rnr_retry: 7,
        ..QpCaps::default()
    };
    let pair = |rx: &Cq| {
        let mut r = pd.create_qp(&scq, rx, caps).expect("qp");
        let mut s = pd.create_qp(&scq, &scq, caps).expect("qp");
        let (er, es) = (r.endpoint().expect("ep"), s.endpoint().expect("ep"));
        r.connect(&es).expect("connect");
        s.connect(&er).expect("connect");
        (r, s)
    };
    let mut srq = on_srq.then(|| {
        pd.create_srq(
            &cq,
            SrqCaps {
                entries: 8,
                max_sge: 1,
            },
        )
        .expect("srq")
    });
    // Another QP receiving on the same CQ, and its peer.
    let (mut o, mut q) = pair(&cq);
    let keep = pd.alloc_mr(4096, RIGHTS).expect("mr");
    o.post_recv(&[keep.sge(0, 64).unwrap()], 1).unwrap();
    o.post_recv(&[keep.sge(64, 64).unwrap()], 2).unwrap();

    // The QP dropped, its receives in a region of its own.
    let mr = pd.register(vec![0u8; 4096], RIGHTS).expect("register");
    let mut v = match &srq {
        Some(s) => pd.create_qp_with_srq(&scq, s, caps),
        None => pd.create_qp(&scq, &cq, caps),
    }
    .expect("the QP dropped");
    for i in 0..N {
        let sge = [mr.sge(i as usize * 64, 64).unwrap()];
        match &mut srq {
            Some(s) => s.post_recv(&sge, 100 + i),
            None => v.post_recv(&sge, 100 + i),
        }
        .unwrap_or_else(|e| panic!("{ctx}: a receive before connect: {e}"));
    }
    match how {
        Unconnected::Never => {}
        Unconnected::Refused => {
            let bare = Endpoint {
                qpn: q.qpn(),
                ..Endpoint::default()
            };
            match v.connect(&bare) {
                Err(Error::InvalidParameter { .. }) => {}
                other => panic!("{ctx}: connect by a bare number: {other:?}"),
            }
        }
        Unconnected::Errored => v.set_error().expect("set_error"),
    }
    // One message for `o` completes before the drop and stays in the CQ, unpolled.
    q.send(Payload::Inline(b"one"), 10, PostFlags::SIGNALED)
        .unwrap();
    let sent = drain(dev, &mut scq, 1, Duration::ZERO);
    assert_eq!(sent[0].status, WcStatus::Success, "{ctx}: {sent:?}");
    if matches!(how, Unconnected::Errored) {
        // Give the flushes of its receives (own receive queue) time to land in the CQ.
        std::thread::sleep(Duration::from_millis(20));
        dev.process();
    }
    drop(v);
    q.send(Payload::Inline(b"two"), 11, PostFlags::SIGNALED)
        .unwrap();
    let sent = drain(dev, &mut scq, 1, Duration::ZERO);
    assert_eq!(sent[0].status, WcStatus::Success, "{ctx}: {sent:?}");
    // (3) Only `o`'s two, once each, in order.
    let got: Vec<(u64, WcStatus)> = drain(dev, &mut cq, 2, Duration::from_millis(100))
        .iter()
        .map(|c| (c.cookie, c.status))
        .collect();
    assert_eq!(
        got,
        [(1, WcStatus::Success), (2, WcStatus::Success)],
        "{ctx}: the receive CQ after the drop"
    );

    let mut pending = mr.into_buffer::<Vec<u8>>().expect("a Vec");
    if let Some(s) = &mut srq {
        // (4) The SRQ still holds the N receives: room for capacity - N more, no more.
        let room = s.capacity() - N as u32;
        assert_eq!(s.free(), room, "{ctx}: the SRQ's free entries");
        for i in 0..room {
            s.post_recv(&[keep.sge(1024, 64).unwrap()], 200 + i as u64)
                .unwrap_or_else(|e| panic!("{ctx}: SRQ receive {i} of {room}: {e}"));
        }
        match s.post_recv(&[keep.sge(1024, 64).unwrap()], 299) {
            Err(Error::QueueFull { .. }) => {}
            other => panic!("{ctx}: one past the SRQ's capacity: {other:?}"),
        }
        // The next QP on the SRQ takes them, the oldest first.
        let mut w = pd.create_qp_with_srq(&scq, s, caps).expect("qp on the srq");
        let mut p = pd.create_qp(&scq, &scq, caps).expect("qp");
        let (ew, ep) = (w.endpoint().unwrap(), p.endpoint().unwrap());
        w.connect(&ep).unwrap();
        p.connect(&ew).unwrap();
        for i in 0..N {
            p.send(Payload::Inline(b"later"), 20 + i, PostFlags::SIGNALED)
                .unwrap();
        }
        let sent = drain(dev, &mut scq, N as usize, Duration::ZERO);
        assert!(
            sent.iter().all(|c| c.status == WcStatus::Success),
            "{ctx}: {sent:?}"
        );
        let got: Vec<(u64, WcStatus, u32)> =
            drain(dev, &mut cq, N as usize, Duration::from_millis(50))
                .iter()
                .map(|c| (c.cookie, c.status, c.byte_len))
                .collect();
        let want: Vec<_> = (0..N).map(|i| (100 + i, WcStatus::Success, 5)).collect();
        assert_eq!(got, want, "{ctx}: the SRQ's receives, taken by the next QP");
        drop((w, p));
    }
    // (2) The region is deregistered and its buffer handed back.
    let buf = pending
        .try_take()
        .unwrap_or_else(|| panic!("{ctx}: the buffer is not handed back"));
    if on_srq {
        assert_eq!(&buf[..5], b"later", "{ctx}");
    }
    assert_eq!(pd.reclaim(), 0, "{ctx}: parked registrations");

    // (1) With every other queue gone, a new QP may post as many receives as the CQ has
    // entries, and is refused (CqFull) only past them.
    drop((o, q, srq));
    drain(dev, &mut cq, 0, Duration::from_millis(10));
    let mut x = pd.create_qp(&scq, &cq, caps).expect("qp");
    let cap = cq.guaranteed();
    assert!(
        caps.rq_entries > cap,
        "{ctx}: the receive queue is deeper than the CQ"
    );
    for i in 0..cap {
        x.post_recv(&[keep.sge(2048, 64).unwrap()], 300 + i as u64)
            .unwrap_or_else(|e| panic!("{ctx}: receive {i} of the CQ's {cap}: {e}"));
    }
    match x.post_recv(&[keep.sge(2048, 64).unwrap()], 399) {
        Err(Error::CqFull { .. }) => {}
        other => panic!("{ctx}: one past the CQ's {cap} entries: {other:?}"),
    }
}

/// A QP that never left INIT (never connected, or its `connect` refused) completes nothing:
/// its receives were never taken (a responder below RTR takes none) and its destroy (to
/// RESET) flushes none. Dropped with receives filling its CQ, it leaves the CQ's every
/// entry to the next QP at once, with no poll of the CQ in between. Before RC QPs were
/// created in INIT the verbs path refused such receives, so its drop never met any.
pub fn an_init_qps_drop_frees_its_cq_entries_at_once(dev: &Device) {
    for refused in [false, true] {
        let ctx = format!("connect refused {refused}");
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(32).expect("receive cq");
        let scq = dev.create_cq(16).expect("send cq");
        let caps = QpCaps {
            sq_blocks: 16,
            rq_entries: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..QpCaps::default()
        };
        let mr = pd.alloc_mr(4096, RIGHTS).expect("mr");
        let cap = cq.guaranteed();
        assert!(
            caps.rq_entries > cap,
            "{ctx}: the receive queue is deeper than the CQ"
        );
        let mut v = pd.create_qp(&scq, &cq, caps).expect("qp");
        for i in 0..cap {
            v.post_recv(&[mr.sge(0, 64).unwrap()], i as u64)
                .unwrap_or_else(|e| panic!("{ctx}: receive {i} of the CQ's {cap}: {e}"));
        }
        if refused {
            let bare = Endpoint {
                qpn: v.qpn(),
                ..Endpoint::default()
            };
            match v.connect(&bare) {
                Err(Error::InvalidParameter { .. }) => {}
                other => panic!("{ctx}: connect by a bare number: {other:?}"),
            }
        }
        drop(v);
        let mut x = pd.create_qp(&scq, &cq, caps).expect("qp");
        for i in 0..cap {
            x.post_recv(&[mr.sge(64, 64).unwrap()], 100 + i as u64)
                .unwrap_or_else(|e| {
                    panic!("{ctx}: receive {i} of the CQ's {cap} after the drop: {e}")
                });
        }
        match x.post_recv(&[mr.sge(64, 64).unwrap()], 999) {
            Err(Error::CqFull { .. }) => {}
            other => panic!("{ctx}: one past the CQ's {cap} entries: {other:?}"),
        }
    }
}
