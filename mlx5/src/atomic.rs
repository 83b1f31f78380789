//! What a device's atomics can do, and in which byte order it writes their replies (the old
//! value) into the requester's local buffer.
//!
//! On mlx5 the order is a device capability (PRM `atomic_caps`, read by UCX
//! `ib_mlx5dv_md.c`): with `atomic_req_8B_endianness_mode` 0 the 8-byte replies (compare-swap,
//! fetch-add, 64-bit masked) are big-endian, with 1 they are in host order; the 4-byte replies
//! of 32-bit masked atomics are always big-endian (UCX `rc_mlx5_iface.c` installs its
//! `atomic32_le_handler` / `atomic64_le_handler` accordingly). The Linux driver sets mode 1
//! when the device supports it, and reports `IBV_ATOMIC_HCA` only then (`get_atomic_caps` in
//! `drivers/infiniband/hw/mlx5/main.c`), so mode 1 is what rdma-core and UCX see on a current
//! ConnectX; it reports `masked_atomic_cap = IBV_ATOMIC_NONE` whatever the device can do.
//! rxe and the other verbs devices write every reply in host order.

/// Atomic capabilities of a device and the byte order of its replies.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AtomicCaps {
    /// 8-byte compare-swap and fetch-add (verbs: `atomic_cap != IBV_ATOMIC_NONE`).
    pub standard: bool,
    /// Masked (extended) atomics of 4 and 8 bytes.
    pub masked: bool,
    /// 8-byte replies are big-endian (`atomic_req_8B_endianness_mode == 0`).
    pub reply8_be: bool,
    /// 4-byte (32-bit masked) replies are big-endian (always on mlx5).
    pub reply4_be: bool,
}

impl AtomicCaps {
    /// A ConnectX under a current Linux driver: every atomic, 8-byte replies in host order
    /// (`atomic_req_8B_endianness_mode` 1), 4-byte replies big-endian.
    pub const CONNECTX: AtomicCaps = AtomicCaps {
        standard: true,
        masked: true,
        reply8_be: false,
        reply4_be: true,
    };
    /// A ConnectX in `atomic_req_8B_endianness_mode` 0: every reply big-endian.
    pub const CONNECTX_BIG_ENDIAN: AtomicCaps = AtomicCaps {
        reply8_be: true,
        ..AtomicCaps::CONNECTX
    };
    /// A device without atomics (`IBV_ATOMIC_NONE`).
    pub const NONE: AtomicCaps = AtomicCaps {
        standard: false,
        masked: false,
        reply8_be: false,
        reply4_be: false,
    };
    /// A verbs device with standard atomics and host-order replies (rxe, siw, ...).
    pub const HOST_ORDER: AtomicCaps = AtomicCaps {
        standard: true,
        masked: false,
        reply8_be: false,
        reply4_be: false,
    };

    /// Whether a reply of `size` bytes (4 or 8) is big-endian.
    #[inline]
    pub const fn reply_be(&self, size: usize) -> bool {
        if size == 4 {
            self.reply4_be
        } else {
            self.reply8_be
        }
    }

    /// The old value an atomic wrote into its local buffer, in host order: `reply` holds the
    /// 8 bytes of a compare-swap, fetch-add or 64-bit masked atomic, or the 4 bytes of a
    /// 32-bit masked one. None for any other length.
    #[inline]
    pub fn reply_value(&self, reply: &[u8]) -> Option<u64> {
        match *reply {
            [a, b, c, d, e, f, g, h] => {
                let raw = [a, b, c, d, e, f, g, h];
                Some(if self.reply8_be {
                    u64::from_be_bytes(raw)
                } else {
                    u64::from_ne_bytes(raw)
                })
            }
            [a, b, c, d] => {
                let raw = [a, b, c, d];
                Some(if self.reply4_be {
                    u32::from_be_bytes(raw)
                } else {
                    u32::from_ne_bytes(raw)
                } as u64)
            }
            _ => None,
        }
    }

    /// The reply bytes a device writes for an old value `old` of `size` bytes (4 or 8; the
    /// value's low bytes for 4): what the software NIC puts in the local buffer.
    #[inline]
    pub fn reply_bytes(&self, old: u64, size: usize) -> [u8; 8] {
        let mut out = [0u8; 8];
        if size == 4 {
            let v = old as u32;
            out[..4].copy_from_slice(&if self.reply4_be {
                v.to_be_bytes()
            } else {
                v.to_ne_bytes()
            });
        } else {
            out = if self.reply8_be {
                old.to_be_bytes()
            } else {
                old.to_ne_bytes()
            };
        }
        out
    }
}

impl Default for AtomicCaps {
    fn default() -> Self {
        AtomicCaps::CONNECTX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip_in_every_mode() {
        for caps in [
            AtomicCaps::CONNECTX,
            AtomicCaps::CONNECTX_BIG_ENDIAN,
            AtomicCaps::HOST_ORDER,
        ] {
            let v = 0x0102_0304_0506_0708u64;
            assert_eq!(caps.reply_value(&caps.reply_bytes(v, 8)), Some(v));
            let r4 = caps.reply_bytes(0xa1b2_c3d4, 4);
            assert_eq!(caps.reply_value(&r4[..4]), Some(0xa1b2_c3d4));
            assert_eq!(caps.reply_value(&r4[..5]), None);
        }
    }

    #[test]
    fn connectx_byte_orders() {
        let cx = AtomicCaps::CONNECTX;
        assert_eq!(cx.reply_bytes(1, 8), 1u64.to_ne_bytes());
        assert_eq!(cx.reply_bytes(1, 4)[..4], [0, 0, 0, 1]);
        let be = AtomicCaps::CONNECTX_BIG_ENDIAN;
        assert_eq!(be.reply_bytes(1, 8), [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(be.reply_value(&[0, 0, 0, 0, 0, 0, 1, 0]), Some(0x100));
        assert_eq!(AtomicCaps::default(), cx);
    }
}
