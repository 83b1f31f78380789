//! UD sends on the direct path: control segment, datagram segment (the address handle's
//! address vector with the destination QP and Q_Key), payload, as rdma-core's
//! `_mlx5_post_send` builds them for `IBV_QPT_UD` (`set_datagram_seg`) and UCX's
//! `uct_ud_mlx5` does. They go through the send queue's ring machinery (room, CQ charge,
//! completion moderation, shadow table, doorbell or BlueFlame) by their own post function,
//! so the RC post path is unchanged.

use super::sq::{SendQueue, Transport};
use crate::completion::WcOpcode;
use crate::error::Result;
use crate::queue::flags::PostFlags;
use mlx5::request::Payload;
use mlx5::wqe::{encode_ud, ud_wqe_ds, UdSend};

impl SendQueue {
    /// Writes one UD send and rings at once. The caller checked the message against the
    /// path MTU (a longer one fails at the NIC with a local length error).
    ///
    /// # Errors
    /// As [`SendQueue::post`] for the payload and queue room ([`crate::Error::InvalidParameter`]
    /// for more than the port's largest message); [`crate::Error::Unsupported`] on the queue of one of the
    /// crate's QPs that is not UD (an RC QP's). Nothing is
    /// written on an error.
    #[inline]
    pub fn post_ud(&mut self, send: &UdSend<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        self.check_transport(Transport::Ud)?;
        // A refusal rings too: WQEs of a forgotten batch (`mem::forget` is safe) would
        // otherwise never be rung, and a refusal for want of the room they hold never end.
        let r = self.push_ud(send, cookie, flags);
        self.ring();
        r
    }

    /// [`SendQueue::post_ud`]'s checks and WQE, not rung.
    #[inline(always)]
    fn push_ud(&mut self, send: &UdSend<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        if let Payload::Sgl(sgl) = send.data {
            crate::queue::checks::message_len(sgl, self.max_message())?;
        }
        let ds = ud_wqe_ds(&send.data, &self.limits())?;
        self.push_encoded(
            ds,
            cookie,
            flags,
            (WcOpcode::Send, 0),
            |span, pi, qpn, fm| encode_ud(send, ds, pi, qpn, fm, span),
        )
    }
}
