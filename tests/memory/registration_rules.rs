//! Registrations the kernel refuses, refused before the device is asked, on every backend
//! (the software NIC accepted them): a read-only buffer with MW_BIND, a dma-buf region with
//! rights `UVERBS_METHOD_REG_DMABUF_MR` does not take or an iova whose page offset is not the
//! offset's.

use blueflame::*;

/// `ib_umem_get` pins with FOLL_WRITE when `ib_access_writable(access)`, which counts
/// MW_BIND (include/rdma/ib_verbs.h): a read-only mapping registered with MW_BIND is
/// EFAULT from `ibv_reg_mr` on every kernel device. The crate promises ReadOnlyBuffer for
/// a read-only buffer with rights the kernel refuses.
#[test]
fn a_read_only_buffer_with_mw_bind_is_refused() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    static RO: &[u8] = b"constant";
    let r = pd.register(RO, Access::REMOTE_READ | Access::MW_BIND);
    assert!(
        matches!(
            r,
            Err(Refused {
                error: Error::ReadOnlyBuffer { .. },
                ..
            })
        ),
        "{:?}",
        r.map(|m| m.access())
    );
}

/// `UVERBS_METHOD_REG_DMABUF_MR` (drivers/infiniband/core/uverbs_std_types_mr.c):
/// `(offset & ~PAGE_MASK) != (iova & ~PAGE_MASK)` is EINVAL.
#[test]
fn a_dma_buf_iova_must_share_the_offsets_page_offset() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let gpu = SimDmaBuf::new(&dev, 8192).unwrap();
    let r = pd.register_dmabuf(gpu.fd(), 0, 4096, 0x7000_0008, Access::LOCAL_WRITE);
    assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
    let r = pd.register_dmabuf(gpu.fd(), 8, 4096, 0x7000_0000, Access::LOCAL_WRITE);
    assert!(matches!(r, Err(Error::InvalidParameter { .. })), "{r:?}");
}

/// The same handler takes the access flags with `uverbs_get_flags32(..., LOCAL_WRITE |
/// REMOTE_READ | REMOTE_WRITE | REMOTE_ATOMIC | RELAXED_ORDERING)`: any other bit (MW_BIND,
/// ON_DEMAND) is EINVAL.
#[test]
fn a_dma_buf_region_takes_only_the_kernels_rights() {
    let dev = Device::sim_stepped();
    let pd = dev.alloc_pd().unwrap();
    let gpu = SimDmaBuf::new(&dev, 4096).unwrap();
    for extra in [Access::MW_BIND, Access::ON_DEMAND] {
        let r = pd.register_dmabuf(gpu.fd(), 0, 4096, 0x7000_0000, Access::LOCAL_WRITE | extra);
        assert!(r.is_err(), "{extra}: {r:?}");
    }
}
