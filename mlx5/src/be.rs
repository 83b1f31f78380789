//! Big-endian integers as types.
//!
//! Every multi-byte field that the NIC reads or writes is big-endian. Keeping the byte order
//! in the type (as `vm-memory` does) means no `to_be()` is ever forgotten: a field can only be
//! set with `Be32::new(host_value)` and read with `.get()`. The types have alignment 1, so a
//! `#[repr(C)]` struct made of them has exactly the offsets of the C struct it mirrors (the
//! hardware structs have no padding), which the header checks prove field by field.

/// A big-endian `u16` (`__be16`).
pub type Be16 = zerocopy::byteorder::big_endian::U16;
/// A big-endian `u32` (`__be32`).
pub type Be32 = zerocopy::byteorder::big_endian::U32;
/// A big-endian `u64` (`__be64`).
pub type Be64 = zerocopy::byteorder::big_endian::U64;

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn bytes_are_big_endian() {
        assert_eq!(Be16::new(0x0102).as_bytes(), &[1, 2]);
        assert_eq!(Be32::new(0x0102_0304).as_bytes(), &[1, 2, 3, 4]);
        assert_eq!(
            Be64::new(0x0102_0304_0506_0708).as_bytes(),
            &[1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(core::mem::align_of::<Be64>(), 1);
    }
}
