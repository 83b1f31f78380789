//! What every sender posts ([`PostSend`]): RDMA write, read, send and atomics, written once
//! over one required `post` for [`Qp`](crate::Qp) and a DCI's [`DcSend`](crate::DcSend).

use crate::error::Result;
use crate::queue::flags::PostFlags;
use mlx5::request::Payload;
use mlx5::request::Remote;
use mlx5::request::Request;
use mlx5::request::Sge;

/// Posting requests: one required method, [`PostSend::post`], and the shapes every sender
/// shares built on it (io-uring's one-place-per-opcode: a request kind is a [`Request`]
/// variant, and each method here only names one).
///
/// [`Qp`](crate::Qp) implements it (an RC QP posts to its connected peer), and so does
/// [`DcSend`](crate::DcSend), a DCI aimed at one DC target ([`Dci::to`](crate::Dci::to)).
/// Bring it into scope to call the methods: `use blueflame::PostSend;` (or `use
/// blueflame::*`).
///
/// Each request is checked before anything is written, and refused whole: nothing is
/// posted on error.
pub trait PostSend {
    /// Posts one request.
    ///
    /// # Errors
    /// [`Error::QueueFull`](crate::Error::QueueFull),
    /// [`Error::CqFull`](crate::Error::CqFull), [`Error::TooManySge`](crate::Error::TooManySge),
    /// [`Error::InlineTooLong`](crate::Error::InlineTooLong),
    /// [`Error::WqeTooLarge`](crate::Error::WqeTooLarge),
    /// [`Error::Misaligned`](crate::Error::Misaligned), ...;
    /// [`Error::InvalidParameter`](crate::Error::InvalidParameter) for a write, send or read
    /// whose entries add up to more than the port's largest message
    /// ([`Device::max_message`](crate::Device::max_message): 2^30 on a ConnectX-6 and the
    /// software NIC, 2^23 on rxe; the sum in the error);
    /// [`Error::Unsupported`](crate::Error::Unsupported) for a request this sender does not
    /// take ([`Request::BindMw`] and [`Request::LocalInvalidate`] go through
    /// [`Qp::bind_mw`](crate::Qp::bind_mw) and [`Qp::unbind_mw`](crate::Qp::unbind_mw), which
    /// check the range, the rights and the window's state and keep its key in step; a DCI
    /// takes no window request, send with invalidate or NOP); an
    /// [`Error::AsyncEvent`](crate::Error::AsyncEvent) instead when a full queue or CQ is the
    /// sign of one (a CQ in error, a failed device).
    fn post(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()>;

    /// RDMA write of a gather list.
    ///
    /// # Errors
    /// See [`PostSend::post`].
    #[inline(always)]
    fn write(&mut self, sgl: &[Sge], remote: Remote, cookie: u64, flags: PostFlags) -> Result<()> {
        let data = Payload::Sgl(sgl);
        self.post(&Request::Write { remote, data }, cookie, flags)
    }

    /// RDMA write of bytes carried in the work request (no registration needed; at most
    /// the QP's `max_inline_data`).
    ///
    /// # Errors
    /// See [`PostSend::post`].
    #[inline(always)]
    fn write_inline(
        &mut self,
        data: &[u8],
        remote: Remote,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let data = Payload::Inline(data);
        self.post(&Request::Write { remote, data }, cookie, flags)
    }

    /// RDMA write with immediate: the 32-bit `imm` consumes a receive of the target and
    /// arrives in its completion.
    ///
    /// # Errors
    /// See [`PostSend::post`].
    #[inline(always)]
    fn write_imm(
        &mut self,
        data: Payload<'_>,
        remote: Remote,
        imm: u32,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::WriteImm { remote, data, imm }, cookie, flags)
    }

    /// RDMA read from `remote` into a scatter list.
    ///
    /// # Errors
    /// See [`PostSend::post`].
    #[inline(always)]
    fn read(&mut self, sgl: &[Sge], remote: Remote, cookie: u64, flags: PostFlags) -> Result<()> {
        self.post(&Request::Read { remote, sgl }, cookie, flags)
    }

    /// Send: lands in a receive of the target.
    ///
    /// # Errors
    /// See [`PostSend::post`].
    #[inline(always)]
    fn send(&mut self, data: Payload<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.post(&Request::Send { data }, cookie, flags)
    }

    /// Atomic compare-and-swap of the 8 bytes at `remote`; the old value lands in `local`
    /// (read it with [`QueuePair::atomic_result`](crate::QueuePair::atomic_result)).
    ///
    /// # Errors
    /// See [`PostSend::post`]; [`Error::Misaligned`](crate::Error::Misaligned) for a remote
    /// address not 8-byte aligned; [`Error::AtomicLength`](crate::Error::AtomicLength) for a
    /// local entry that is not 8 bytes; [`Error::Unsupported`](crate::Error::Unsupported) on
    /// a device without atomics (`atomic_cap` `IBV_ATOMIC_NONE`).
    #[inline(always)]
    fn compare_swap(
        &mut self,
        remote: Remote,
        compare: u64,
        swap: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        let req = Request::CompareSwap {
            remote,
            compare,
            swap,
            local,
        };
        self.post(&req, cookie, flags)
    }

    /// Atomic fetch-and-add on the 8 bytes at `remote`; the old value lands in `local`.
    ///
    /// # Errors
    /// See [`PostSend::compare_swap`].
    #[inline(always)]
    fn fetch_add(
        &mut self,
        remote: Remote,
        add: u64,
        local: Sge,
        cookie: u64,
        flags: PostFlags,
    ) -> Result<()> {
        self.post(&Request::FetchAdd { remote, add, local }, cookie, flags)
    }
}
