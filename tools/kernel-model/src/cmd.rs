//! The write ABI of `/dev/infiniband/uverbs*` (the kernel's `ib_uverbs_write`): a
//! `struct ib_uverbs_cmd_hdr`, for extended commands a `struct ib_uverbs_ex_cmd_hdr`, the
//! command's core struct, then the driver's data (`udata`, for mlx5 the structs of
//! `<rdma/mlx5-abi.h>`). The response goes to the user pointer the command names: the
//! core response first, the driver's after it.

use crate::abi;
use libc::c_int;

/// One decoded command.
pub(crate) struct Call<'a> {
    /// The command number (without the extended flag).
    pub(crate) op: u32,
    /// An extended command.
    pub(crate) ex: bool,
    /// The payload after the headers.
    input: &'a [u8],
    /// Bytes of the core struct (extended commands say it; legacy ones have the size of
    /// their struct).
    core_in: Option<usize>,
    /// The response buffer and its length (for a legacy command, its response pointer is
    /// the first word of its core struct: set by [`Call::request`]).
    resp: u64,
    resp_len: usize,
    core_out: Option<usize>,
}

/// Reads a `T` from the front of `bytes`, zero-filled past their end (the kernel's
/// `uverbs_request` takes shorter structs from older libraries the same way).
///
/// # Safety
/// `T` is a plain C struct of the ABI (integers and arrays of them): any bytes make a value.
pub(crate) unsafe fn read<T: Default>(bytes: &[u8]) -> T {
    let mut t = T::default();
    let n = bytes.len().min(core::mem::size_of::<T>());
    // SAFETY: `t` has size_of::<T>() bytes, n is at most that and at most bytes.len(); the
    // caller's contract makes any bytes a valid T.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut t as *mut T).cast(), n) };
    t
}

/// The bytes of a `T`.
///
/// # Safety
/// `T` is a plain C struct of the ABI (no padding the kernel would not also copy).
pub(crate) unsafe fn bytes<T>(t: &T) -> &[u8] {
    // SAFETY: the caller's contract: T's bytes may be read.
    unsafe { core::slice::from_raw_parts((t as *const T).cast(), core::mem::size_of::<T>()) }
}

impl<'a> Call<'a> {
    /// The core struct `T` and the driver's data after it.
    ///
    /// # Safety
    /// As [`read`].
    pub(crate) unsafe fn request<T: Default>(&mut self) -> (T, &'a [u8]) {
        let size = self.core_in.unwrap_or(core::mem::size_of::<T>());
        let input: &'a [u8] = self.input;
        let core = &input[..size.min(input.len())];
        let udata = &input[size.min(input.len())..];
        // SAFETY: the caller's contract.
        let t: T = unsafe { read(core) };
        if !self.ex && core.len() >= 8 {
            // A legacy command with a response names it in its first word.
            self.resp = u64::from_ne_bytes(core[..8].try_into().expect("8 bytes"));
        }
        (t, udata)
    }

    /// Writes the core response `core` and the driver's response `drv` (each cut to the
    /// room the caller gave).
    ///
    /// # Safety
    /// The response pointer of the command is valid for `resp_len` bytes (the caller of
    /// write(2) promised it); `C` and `D` are plain C structs of the ABI.
    pub(crate) unsafe fn respond<C, D>(&self, core: &C, drv: Option<&D>) -> Result<(), c_int> {
        if self.resp == 0 {
            return if self.resp_len == 0 {
                Ok(())
            } else {
                Err(libc::EFAULT)
            };
        }
        let out = self.resp as *mut u8;
        let core_room = self
            .core_out
            .unwrap_or(core::mem::size_of::<C>())
            .min(self.resp_len);
        // SAFETY: the caller's contract; every copy stays inside resp_len bytes.
        unsafe {
            let c = bytes(core);
            core::ptr::copy_nonoverlapping(c.as_ptr(), out, c.len().min(core_room));
            if let Some(d) = drv {
                let d = bytes(d);
                let room = self.resp_len - core_room;
                core::ptr::copy_nonoverlapping(d.as_ptr(), out.add(core_room), d.len().min(room));
            }
        }
        Ok(())
    }
}

/// Decodes one command written to a device file.
///
/// # Safety
/// `buf` holds `len` readable bytes for the life of the result; the response pointers
/// inside are the caller's, valid for the lengths the header gives (the write(2) contract of
/// uverbs).
pub(crate) unsafe fn decode<'a>(buf: *const u8, len: usize) -> Result<Call<'a>, c_int> {
    let hdr_len = core::mem::size_of::<abi::ib_uverbs_cmd_hdr>();
    if len < hdr_len {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    let all = unsafe { core::slice::from_raw_parts(buf, len) };
    // SAFETY: a plain header struct.
    let hdr: abi::ib_uverbs_cmd_hdr = unsafe { read(all) };
    let ex = hdr.command & abi::IB_USER_VERBS_CMD_FLAG_EXTENDED != 0;
    let op = hdr.command & abi::IB_USER_VERBS_CMD_COMMAND_MASK;
    Ok(if ex {
        let ex_len = core::mem::size_of::<abi::ib_uverbs_ex_cmd_hdr>();
        if len < hdr_len + ex_len {
            return Err(libc::EINVAL);
        }
        // SAFETY: a plain header struct.
        let exh: abi::ib_uverbs_ex_cmd_hdr = unsafe { read(&all[hdr_len..]) };
        let core_in = hdr.in_words as usize * 8;
        let drv_in = exh.provider_in_words as usize * 8;
        if hdr_len + ex_len + core_in + drv_in != len {
            return Err(libc::EINVAL);
        }
        let core_out = hdr.out_words as usize * 8;
        Call {
            op,
            ex,
            input: &all[hdr_len + ex_len..],
            core_in: Some(core_in),
            resp: exh.response,
            resp_len: core_out + exh.provider_out_words as usize * 8,
            core_out: Some(core_out),
        }
    } else {
        if hdr.in_words as usize * 4 != len {
            return Err(libc::EINVAL);
        }
        Call {
            op,
            ex,
            input: &all[hdr_len..],
            core_in: None,
            resp: 0,
            resp_len: hdr.out_words as usize * 4,
            core_out: None,
        }
    })
}

/// Whether `KERNEL_MODEL_TRACE` is set: each command and its result go to stderr.
pub(crate) fn trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KERNEL_MODEL_TRACE").is_some())
}
