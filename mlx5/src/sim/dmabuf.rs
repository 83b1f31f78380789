//! dma-buf exporters beside the software NIC: memory of another device (a GPU, an
//! accelerator) that the NIC reaches through a registration (`ibv_reg_dmabuf_mr`), and that
//! its exporter may move.
//!
//! What a ConnectX does, and the model of it: the kernel registers a dma-buf through its
//! on-demand paging machinery (`ib_umem_dmabuf_get` with `mlx5_ib_dmabuf_attach_ops`;
//! `mlx5_ib_reg_user_mr_dmabuf` refuses without `CONFIG_INFINIBAND_ON_DEMAND_PAGING`). When
//! the exporter moves the buffer, its `move_notify` reaches `mlx5_ib_dmabuf_invalidate_cb`,
//! which zaps the region's translation; the NIC's next access to it is a page fault that
//! the kernel resolves by mapping the buffer where it now is (`pagefault_dmabuf_mr`). Here
//! an export owns its bytes ([`DmaBuf`]); `Nic::dmabuf_move` copies them to a new
//! allocation, frees the old one and marks every region on it unmapped. The NIC translates
//! a region's addresses through its export's current buffer; the first receive into an SRQ
//! WQE whose buffers lie in an unmapped region faults (see `exec.rs`: the WQE completes with
//! REMOTE_ABORTED and vendor syndrome 0x93, the message comes again after an RNR NAK), any
//! other access maps it on the way, as the faults a ConnectX resolves without telling
//! software. Regions with `Access::ON_DEMAND` fault the same way after
//! `NicView::invalidate_odp` (the kernel's MMU-notifier invalidation,
//! `mlx5_ib_invalidate_range`).
//!
//! An export lives while its exporter holds it (the dma-buf file is open) or a region uses
//! it (the kernel's attachment holds a reference): closing the file after registering is
//! allowed, as with a real dma-buf. The exporter's and the driver's calls are in
//! `nic_dmabuf.rs`.

use super::dma::DmaBuf;
use std::collections::HashMap;

/// One exported buffer.
pub(crate) struct Export {
    /// Its bytes, where they are now.
    pub(crate) buf: DmaBuf,
    pub(crate) len: usize,
    /// The exporter still holds it.
    pub(crate) open: bool,
    /// Regions registered on it.
    pub(crate) users: u32,
    /// Moves so far.
    pub(crate) moves: u64,
}

/// Where a dma-buf region lies: `offset` bytes into export `handle`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Exported {
    pub(crate) handle: u64,
    pub(crate) offset: u64,
}

/// The exports, by handle (the identity of the dma-buf file, chosen by the exporter).
#[derive(Default)]
pub(crate) struct Exports {
    pub(crate) map: HashMap<u64, Export>,
}

impl Exports {
    pub(crate) fn get(&self, handle: u64) -> Option<&Export> {
        self.map.get(&handle)
    }

    /// A region on `handle` was deregistered: the export goes when nothing holds it.
    pub(crate) fn release(&mut self, handle: u64) {
        if let Some(e) = self.map.get_mut(&handle) {
            e.users = e.users.saturating_sub(1);
            if !e.open && e.users == 0 {
                self.map.remove(&handle);
            }
        }
    }
}
