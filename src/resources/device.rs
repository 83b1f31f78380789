//! Devices and protection domains.

use super::{Cq, MemoryRegion};
use crate::error::Result;
use crate::Access;
use mlx5::sim::Nic;
use std::sync::Arc;

/// An RDMA device.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) nic: Nic,
}

impl Device {
    /// The software mlx5 NIC, running in its own thread (it watches doorbell records as
    /// hardware does): code reads the same as on a ConnectX.
    pub fn sim() -> Device {
        let nic = Nic::new();
        nic.start();
        Device { nic }
    }

    /// The software mlx5 NIC in stepped mode: nothing runs until [`Device::process`] is
    /// called (deterministic tests; BlueFlame writes are checked against the ring).
    pub fn sim_stepped() -> Device {
        Device { nic: Nic::new() }
    }

    /// The software NIC behind this device.
    pub fn nic(&self) -> &Nic {
        &self.nic
    }

    /// Runs the stepped software NIC until it has nothing left to do; returns the WQEs and
    /// receives it handled. A no-op for a threaded NIC.
    pub fn process(&self) -> usize {
        if self.nic.is_threaded() {
            0
        } else {
            self.nic.drain()
        }
    }

    /// A protection domain.
    ///
    /// # Errors
    /// Never on the software NIC; device errors otherwise.
    pub fn alloc_pd(&self) -> Result<Pd> {
        Ok(Pd {
            inner: Arc::new(PdInner {
                dev: self.clone(),
                pd: self.nic.alloc_pd(),
            }),
        })
    }

    /// A completion queue of at least `entries` entries.
    ///
    /// # Errors
    /// [`Error::Sim`](crate::Error::Sim) for a size the NIC refuses.
    pub fn create_cq(&self, entries: u32) -> Result<Cq> {
        Cq::new(self, entries)
    }
}

pub(crate) struct PdInner {
    pub(crate) dev: Device,
    pub(crate) pd: u32,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let _ = self.dev.nic.dealloc_pd(self.pd);
    }
}

/// A protection domain: regions and QPs in one domain can work together.
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl core::fmt::Debug for Pd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pd").field("pd", &self.inner.pd).finish()
    }
}

impl Pd {
    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// Allocates and registers `len` zeroed bytes with `access` rights.
    ///
    /// # Errors
    /// [`Error::Sim`](crate::Error::Sim) for `len == 0`.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        let info = self.inner.dev.nic.alloc_mr(self.inner.pd, len, access)?;
        Ok(MemoryRegion::new(self.clone(), info, access))
    }
}
