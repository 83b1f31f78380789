//! Memory the user owns on the software NIC: every registration form in writes, reads,
//! sends and atomics; buffers kept alive and registered while requests are in flight;
//! read-only memory; huge pages and files; on-demand paging; dma-buf regions and their
//! moving exporter.

use crate::memory_cases;

use blueflame::*;
use memory_cases::*;

fn sim() -> Device {
    Device::sim_stepped()
}

#[test]
fn owned_forms_serve_every_operation_on_the_software_nic() {
    owned_forms_serve_every_operation(&sim());
}

#[test]
fn the_software_nic_writes_the_users_buffer_in_place() {
    the_device_writes_the_users_buffer_in_place(&sim());
}

#[test]
fn buffers_outlive_requests_in_flight_on_the_software_nic() {
    buffers_outlive_requests_in_flight(&sim());
}

#[test]
fn read_only_memory_refuses_write_rights_on_the_software_nic() {
    read_only_memory_refuses_write_rights(&sim());
}

#[test]
fn into_buffer_checks_the_type_on_the_software_nic() {
    into_buffer_checks_the_type(&sim());
}

#[test]
fn a_vec_registers_its_length_only_on_the_software_nic() {
    a_vec_registers_its_length_only(&sim());
}

#[test]
fn raw_registration_on_the_software_nic() {
    raw_registration(&sim());
}

#[test]
fn huge_pages_or_the_sysctl_on_the_software_nic() {
    huge_pages_or_the_sysctl(&sim());
}

#[test]
fn mapped_files_on_the_software_nic() {
    let path = std::env::temp_dir().join(format!("blueflame-map-{}", std::process::id()));
    mapped_files(&sim(), &path);
    let _ = std::fs::remove_file(&path);
    let (_fd, path) = memfd_file();
    mapped_files(&sim(), &path);
}

#[test]
fn threaded_nic_moves_bytes_into_owned_buffers() {
    // The NIC's own thread writes the user's buffer while this thread polls.
    buffers_outlive_requests_in_flight(&Device::sim());
}

#[test]
fn on_demand_regions_work_and_prefetch_checks_like_the_kernel() {
    let dev = sim();
    let caps = dev.odp_caps();
    assert!(caps.rc(true) && !caps.implicit(), "{caps:?}");
    let mut r = Rig::new(&dev);
    let odp =
        r.pd.register(vec![0u8; 8192], RIGHTS | Access::ON_DEMAND)
            .unwrap();
    assert!(odp.access().contains(Access::ON_DEMAND));
    let src = r.pd.register(vec![3u8; 32], Access::NONE).unwrap();
    r.a.write(
        &[src.sge(0, 32).unwrap()],
        odp.remote(4096).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(1);
    let mut got = [0u8; 32];
    odp.read(4096, &mut got).unwrap();
    assert_eq!(got, [3u8; 32]);
    odp.prefetch(0, 8192, true, true).unwrap();
    odp.prefetch(100, 10, false, false).unwrap();
    r.pd.prefetch(
        &[odp.sge(0, 16).unwrap(), odp.sge(16, 16).unwrap()],
        false,
        true,
    )
    .unwrap();
    // The kernel's get_prefetchable_mr refuses a region that is not on demand ...
    let pinned = r.pd.register(vec![0u8; 64], RIGHTS).unwrap();
    assert!(matches!(
        pinned.prefetch(0, 64, false, true),
        Err(Error::InvalidParameter { value, .. }) if value == pinned.lkey() as u64
    ));
    // ... a write prefetch of one without local write ...
    let ro =
        r.pd.register(vec![0u8; 64], Access::REMOTE_READ | Access::ON_DEMAND)
            .unwrap();
    ro.prefetch(0, 64, false, true).unwrap();
    assert!(matches!(
        ro.prefetch(0, 64, true, true),
        Err(Error::InvalidParameter { .. })
    ));
    // ... and a range outside it (an entry made by hand).
    let out = Sge {
        addr: odp.addr() + 8000,
        len: 300,
        lkey: odp.lkey(),
    };
    assert!(matches!(
        r.pd.prefetch(&[out], false, true),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(matches!(
        r.pd.prefetch(&[], false, true),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(odp.prefetch(0, 0, false, true).is_err());
}

#[test]
fn a_nic_without_on_demand_paging_refuses_it_with_a_typed_error() {
    let dev = sim();
    dev.nic().unwrap().set_memory_caps(mlx5::sim::MemoryCaps {
        odp: false,
        ..Default::default()
    });
    assert_eq!(dev.odp_caps(), OdpCaps::default());
    let pd = dev.alloc_pd().unwrap();
    match pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::ON_DEMAND) {
        Err(Refused {
            value,
            error: Error::Capability(Capability::OnDemandPaging),
        }) => assert_eq!(value.len(), 64),
        other => panic!("{other:?}"),
    }
    let pinned = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    assert!(matches!(
        pinned.prefetch(0, 8, false, true),
        Err(Error::Capability(Capability::OnDemandPaging))
    ));
}

#[test]
fn implicit_on_demand_paging_is_a_capability_the_software_nic_lacks() {
    let dev = sim();
    let pd = dev.alloc_pd().unwrap();
    // SAFETY: refused before anything is registered.
    let implicit = unsafe { pd.register_implicit_odp(Access::LOCAL_WRITE) };
    assert!(matches!(
        implicit,
        Err(Error::Capability(Capability::ImplicitOnDemandPaging))
    ));
}

/// dma-buf regions on the software NIC (issue 27, item 4): a peer writes into one and
/// reads from it by its device addresses (`iova`), the bytes are where the exporter has
/// them, also after the exporter moved them (the old place is freed: a translation that
/// survived the move would be a use after free under valgrind); the region has no CPU
/// view; the registration outlives the exporter's file.
#[test]
fn dma_buf_regions_follow_their_exporter_when_it_moves_the_buffer() {
    let dev = sim();
    let mut r = Rig::new(&dev);
    let gpu = SimDmaBuf::new(&dev, 8192).unwrap();
    let iova = 0x5_0000_0000;
    let mr =
        r.pd.register_dmabuf(gpu.fd(), 4096, 4096, iova, RIGHTS)
            .unwrap();
    assert_eq!((mr.addr(), mr.len()), (iova, 4096));
    assert!(matches!(
        mr.read(0, &mut [0u8; 4]),
        Err(Error::NoCpuMapping)
    ));
    let src = r.pd.register(vec![7u8; 64], Access::NONE).unwrap();
    let dst = r.pd.register(vec![0u8; 64], RIGHTS).unwrap();
    for round in 0..3u8 {
        src.write(0, &[round + 1; 64]).unwrap();
        r.a.write(
            &[src.sge(0, 64).unwrap()],
            mr.remote(100).unwrap(),
            1,
            PostFlags::SIGNALED,
        )
        .unwrap();
        r.ok(1);
        let mut got = [0u8; 64];
        gpu.read(4096 + 100, &mut got).unwrap();
        assert_eq!(got, [round + 1; 64], "round {round}");
        gpu.write(4096 + 200, &[0xc0 + round; 64]).unwrap();
        r.a.read(
            &[dst.sge(0, 64).unwrap()],
            mr.remote(200).unwrap(),
            2,
            PostFlags::SIGNALED,
        )
        .unwrap();
        r.ok(2);
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, [0xc0 + round; 64]);
        gpu.move_buffer().unwrap();
    }
    assert_eq!(gpu.moves(), 3);
    // The exporter's file may go: the registration keeps the buffer.
    drop(gpu);
    r.a.write(
        &[src.sge(0, 64).unwrap()],
        mr.remote(0).unwrap(),
        3,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(3);
}

#[test]
fn dma_buf_refusals_are_typed() {
    let dev = sim();
    let pd = dev.alloc_pd().unwrap();
    let gpu = SimDmaBuf::new(&dev, 4096).unwrap();
    // A file no exporter beside this NIC made.
    let f = std::fs::File::open("/dev/null").unwrap();
    use std::os::fd::AsFd;
    let r = pd.register_dmabuf(f.as_fd(), 0, 4096, 0x1000, Access::LOCAL_WRITE);
    assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
    // A range outside the buffer.
    let r = pd.register_dmabuf(gpu.fd(), 4000, 200, 0x1000, Access::LOCAL_WRITE);
    assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
    let r = pd.register_dmabuf(gpu.fd(), 0, 0, 0x1000, Access::LOCAL_WRITE);
    assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
    // An iova whose range wraps the address space is refused before the device sees it
    // (requests would compute addresses past u64::MAX).
    let r = pd.register_dmabuf(gpu.fd(), 0, 4096, u64::MAX - 100, Access::LOCAL_WRITE);
    assert!(
        matches!(r, Err(Error::InvalidParameter { value, .. }) if value == u64::MAX - 100),
        "{r:?}"
    );
    assert!(matches!(
        SimDmaBuf::new(&dev, 0),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(gpu.write(4090, &[0; 8]).is_err() && gpu.read(usize::MAX, &mut [0; 2]).is_err());
    // The kernel registers dma-bufs through on-demand paging: none, no dma-buf.
    dev.nic().unwrap().set_memory_caps(mlx5::sim::MemoryCaps {
        odp: false,
        ..Default::default()
    });
    let r = pd.register_dmabuf(gpu.fd(), 0, 4096, 0x1000, Access::LOCAL_WRITE);
    assert!(
        matches!(r, Err(Error::Capability(Capability::DmaBuf))),
        "{r:?}"
    );
}

#[test]
fn region_copies_at_every_offset_of_an_unaligned_region_match_the_nic() {
    // A region starting 3 bytes past an 8-byte boundary: edge bytes and whole words.
    let dev = sim();
    let mut r = Rig::new(&dev);
    let mut v = vec![0u8; 64 + 3];
    let start = (8 - v.as_ptr() as usize % 8) % 8 + 3;
    v.truncate(start + 40);
    let buf: Box<[u8]> = v.into_boxed_slice();
    // SAFETY: `buf` lives (untouched) until the RawBuffer comes back below.
    let mr = unsafe {
        r.pd.register_raw(buf.as_ptr().add(start).cast_mut(), 40, true, RIGHTS)
    }
    .unwrap();
    assert_eq!(mr.addr() % 8, 3);
    let mut model = [0u8; 40];
    for off in 0..40 {
        for len in 0..=40 - off {
            let data: Vec<u8> = (0..len).map(|k| (off * 13 + k) as u8).collect();
            mr.write(off, &data).unwrap();
            model[off..off + len].copy_from_slice(&data);
            let mut got = [0u8; 40];
            mr.read(0, &mut got).unwrap();
            assert_eq!(got, model, "{off}+{len}");
        }
    }
    // The NIC reads and writes the same bytes with the same sizes: an RDMA read of the
    // whole region into an aligned one, and a write back at an odd offset.
    let dst = r.pd.alloc_mr(64, RIGHTS).unwrap();
    r.a.read(
        &[dst.sge(0, 40).unwrap()],
        mr.remote(0).unwrap(),
        1,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(1);
    let mut got = [0u8; 40];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, model);
    dst.write(0, &[0xee; 21]).unwrap();
    r.a.write(
        &[dst.sge(0, 21).unwrap()],
        mr.remote(7).unwrap(),
        2,
        PostFlags::SIGNALED,
    )
    .unwrap();
    r.ok(2);
    model[7..28].fill(0xee);
    mr.read(0, &mut got).unwrap();
    assert_eq!(got, model);
    for (k, &m) in model.iter().enumerate() {
        assert_eq!(mr.read_volatile_u8(k).unwrap(), m);
    }
    let raw = mr.into_buffer::<RawBuffer>().unwrap().try_take().unwrap();
    assert_eq!(raw.len(), 40);
    assert_eq!(&buf[start..start + 40], &model[..]);
}

#[test]
fn threads_copying_while_the_nic_writes_see_whole_words() {
    // A writer thread fills the region with one byte value per pass while the threaded
    // NIC writes it too: every aligned 8-byte word read back is one value repeated (words
    // are single accesses everywhere), never a mix within a word.
    let dev = Device::sim();
    let mut r = Rig::new(&dev);
    let mr = std::sync::Arc::new(r.pd.register(vec![0u8; 4096], RIGHTS).unwrap());
    let src = r.pd.register(vec![0x77u8; 4096], Access::NONE).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let w = {
        let (mr, stop) = (mr.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut b = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                b = b.wrapping_add(1) | 1;
                mr.write(0, &[b; 4096]).unwrap();
            }
        })
    };
    let base = (8 - mr.addr() % 8) % 8;
    for i in 0..200u64 {
        r.a.write(
            &[src.sge(0, 4096).unwrap()],
            mr.remote(0).unwrap(),
            i,
            PostFlags::SIGNALED,
        )
        .unwrap();
        r.ok(i);
        let mut word = [0u8; 8];
        for k in 0..500 {
            let off = (base + 8 * k) as usize;
            mr.read(off, &mut word).unwrap();
            assert!(word.iter().all(|&x| x == word[0]), "torn word {word:?}");
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    w.join().unwrap();
}

#[test]
fn an_unconnected_qp_gives_everything_back_on_the_software_nic() {
    an_unconnected_qp_gives_everything_back(&sim());
}

#[test]
fn an_init_qps_drop_frees_its_cq_entries_at_once_on_the_software_nic() {
    an_init_qps_drop_frees_its_cq_entries_at_once(&sim());
}
