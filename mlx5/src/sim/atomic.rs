//! The NIC's atomics at the responder: compare-and-swap, fetch-and-add and their masked
//! forms, with the reply written in the device's byte order.

use super::dma;
use super::progress::Outcome;
use super::state::State;
use crate::request::{Access, MaskedAtomic, Remote, Request, Sge};
use crate::syndrome::Syndrome;

impl State {
    /// Runs an atomic of `qpn` (domain `pd`) on its responder's memory; the reply goes to
    /// `local`.
    pub(crate) fn atomic(
        &mut self,
        qpn: u32,
        pd: u32,
        req: &Request<'_>,
        remote: Remote,
        local: Sge,
    ) -> Outcome {
        let (size, supported) = match req {
            Request::Masked { op, .. } => (op.size() as usize, self.atomics.masked),
            _ => (8, self.atomics.standard),
        };
        if !supported {
            // The device cannot run this opcode: the requester fails it locally.
            return Outcome::Failed(Syndrome::LocalQpOp);
        }
        let (ppd, peer) = match self.responder(qpn) {
            Ok(x) => x,
            Err(s) => return Outcome::Failed(s),
        };
        let dst = match self
            .mem
            .local(pd, local.lkey, local.addr, size as u64, true)
        {
            Ok(p) => p,
            Err(_) => return Outcome::Failed(Syndrome::LocalProt),
        };
        if remote.addr % size as u64 != 0 {
            return self.remote_fault(peer, Syndrome::RemoteInvalReq);
        }
        let target = match self.mem.remote(
            ppd,
            peer,
            remote.rkey,
            remote.addr,
            size as u64,
            Access::REMOTE_ATOMIC,
        ) {
            Ok(p) => p,
            Err(_) => return self.remote_fault(peer, Syndrome::RemoteAccess),
        };
        let mut old = [0u8; 8];
        // SAFETY: `target` was checked for `size` bytes with atomic rights.
        unsafe { dma::read_region(target, &mut old[..size]) };
        let new: Option<[u8; 8]> = match *req {
            Request::CompareSwap { compare, swap, .. } => {
                (u64::from_ne_bytes(old) == compare).then(|| swap.to_ne_bytes())
            }
            Request::FetchAdd { add, .. } => {
                Some(u64::from_ne_bytes(old).wrapping_add(add).to_ne_bytes())
            }
            Request::Masked { op, .. } => masked(op, old),
            _ => None,
        };
        if let Some(new) = new {
            // SAFETY: as above.
            unsafe { dma::write_region(target, &new[..size]) };
        }
        // The reply in the device's byte order (big-endian for 4 bytes, and for 8 in
        // `atomic_req_8B_endianness_mode` 0); the target memory is operated on in host order.
        let value = if size == 4 {
            u32::from_ne_bytes([old[0], old[1], old[2], old[3]]) as u64
        } else {
            u64::from_ne_bytes(old)
        };
        let reply = self.atomics.reply_bytes(value, size);
        // SAFETY: `dst` was checked for `size` locally writable bytes.
        unsafe { dma::write_region(dst, &reply[..size]) };
        Outcome::Done(size as u32)
    }
}

/// New value of a masked atomic on `old` (host order), or None when a compare fails.
fn masked(op: MaskedAtomic, old: [u8; 8]) -> Option<[u8; 8]> {
    let o32 = u32::from_ne_bytes([old[0], old[1], old[2], old[3]]);
    let o64 = u64::from_ne_bytes(old);
    let w32 = |v: u32| {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&v.to_ne_bytes());
        b
    };
    match op {
        MaskedAtomic::Cs32 {
            swap,
            compare,
            swap_mask,
            compare_mask,
        } => ((o32 & compare_mask) == (compare & compare_mask))
            .then(|| w32((o32 & !swap_mask) | (swap & swap_mask))),
        MaskedAtomic::Cs64 {
            swap,
            compare,
            swap_mask,
            compare_mask,
        } => ((o64 & compare_mask) == (compare & compare_mask))
            .then(|| ((o64 & !swap_mask) | (swap & swap_mask)).to_ne_bytes()),
        MaskedAtomic::Fa32 {
            add,
            field_boundary,
        } => Some(w32(
            field_add(o32 as u64, add as u64, field_boundary as u64, 32) as u32,
        )),
        MaskedAtomic::Fa64 {
            add,
            field_boundary,
        } => Some(field_add(o64, add, field_boundary, 64).to_ne_bytes()),
    }
}

/// Adds field by field: a set bit in `boundary` ends a field (no carry out of that bit).
fn field_add(a: u64, b: u64, boundary: u64, bits: u32) -> u64 {
    let mut out = 0u64;
    let mut carry = 0u64;
    for i in 0..bits {
        let s = ((a >> i) & 1) + ((b >> i) & 1) + carry;
        out |= (s & 1) << i;
        carry = if (boundary >> i) & 1 == 1 { 0 } else { s >> 1 };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_add_stops_carries_at_boundaries() {
        assert_eq!(field_add(0xff, 1, 0, 64), 0x100);
        assert_eq!(field_add(0xff, 1, 0x80, 64), 0x00);
        assert_eq!(
            field_add(0x00ff_00ff, 0x0001_0001, 0x0080_0080, 32),
            0x0000_0000
        );
        assert_eq!(field_add(u64::MAX, 1, 0, 64), 0);
    }

    #[test]
    fn masked_compare_swap() {
        let old = 0x1234u64.to_ne_bytes();
        let op = MaskedAtomic::Cs64 {
            swap: 0xff00,
            compare: 0x34,
            swap_mask: 0xff00,
            compare_mask: 0xff,
        };
        assert_eq!(masked(op, old), Some(0xff34u64.to_ne_bytes()));
        let op = MaskedAtomic::Cs64 {
            swap: 0xff00,
            compare: 0x35,
            swap_mask: 0xff00,
            compare_mask: 0xff,
        };
        assert_eq!(masked(op, old), None);
    }
}
