//! How a CQ is created: its size, its entry size, the completion channel its events go to
//! and CQE compression.

use super::CompletionChannel;

/// Creation options of a CQ ([`Device::create_cq_with`](super::Device::create_cq_with)).
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{CqOptions, Device};
/// let dev = Device::sim();
/// let ch = dev.create_channel()?;
/// let cq = dev.create_cq_with(&CqOptions::new(64).cqe_size(128).channel(&ch))?;
/// assert!(cq.channel().is_some());
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct CqOptions {
    pub(crate) entries: u32,
    pub(crate) cqe_size: u32,
    pub(crate) channel: Option<CompletionChannel>,
    pub(crate) zip: Option<mlx5::MiniCqeFormat>,
    pub(crate) timestamps: bool,
}

impl CqOptions {
    /// At least `entries` entries of 64 bytes, no completion channel.
    pub fn new(entries: u32) -> CqOptions {
        CqOptions {
            entries,
            cqe_size: 64,
            channel: None,
            zip: None,
            timestamps: false,
        }
    }

    /// Entries of `bytes` bytes: 64 (the default) or 128 (a ConnectX then delivers received
    /// sends of up to 64 bytes inside the entry instead of 32).
    pub fn cqe_size(mut self, bytes: u32) -> CqOptions {
        self.cqe_size = bytes;
        self
    }

    /// The channel the CQ's completion events go to: the CQ can then be armed
    /// ([`Cq::arm`](super::Cq::arm)) and waited on ([`Cq::wait`](super::Cq::wait)). One channel
    /// serves any number of CQs of its device, but none more while an `AsyncCq` (feature
    /// `tokio`) holds it: creating the CQ then fails with
    /// [`Error::ChannelTaken`](crate::Error::ChannelTaken).
    pub fn channel(mut self, channel: &CompletionChannel) -> CqOptions {
        self.channel = Some(channel.clone());
        self
    }

    /// CQE compression: the device may write runs of completions of one QP as a title entry
    /// and arrays of 8-byte mini-CQEs of `format` (what a receive's mini-CQE carries besides
    /// its byte count), cutting PCIe traffic at high message rates. Polling gives exactly
    /// the completions an uncompressed CQ gives; a session read over several polls gives its
    /// entries back at its end. Direct path only (mlx5, software NIC): the README's "CQE
    /// compression" section says what runs where.
    ///
    /// [`Device::create_cq_with`](super::Device::create_cq_with) then fails with
    /// [`Error::CqeCompression`](crate::Error::CqeCompression) where the device does not
    /// support `format` ([`Device::cqe_compression_caps`](super::Device::cqe_compression_caps))
    /// or nothing decodes compressed entries (a device that is not mlx5, or the verbs path).
    pub fn compression(mut self, format: mlx5::MiniCqeFormat) -> CqOptions {
        self.zip = Some(format);
        self
    }

    /// Completion timestamps: [`Cq::poll_timed`](super::Cq::poll_timed) gives, beside
    /// each completion, when the NIC wrote it, in nanoseconds of the NIC's clock (the
    /// README's "Hardware timestamps" section says which clock on which device). The plain
    /// [`Cq::poll`](super::Cq::poll) costs the same either way.
    ///
    /// [`Device::create_cq_with`](super::Device::create_cq_with) then fails with
    /// [`Error::Timestamps`](crate::Error::Timestamps) where the device has no completion
    /// clock (rxe, siw: `completion_timestamp_mask` 0), with
    /// [`compression`](CqOptions::compression) (a mini-CQE carries no timestamp), and on
    /// the verbs path with `BLUEFLAME_VERBS_API=legacy` (`ibv_poll_cq` reads none).
    pub fn timestamps(mut self) -> CqOptions {
        self.timestamps = true;
        self
    }
}
