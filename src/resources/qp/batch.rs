//! Batches: many requests, one doorbell.

use crate::direct::{self};
use crate::error::{Error, Result};
use crate::queue::flags::PostFlags;
use crate::verbs::sq::VerbsBatch;
use mlx5::request::Request;
/// Requests written together and posted with one doorbell (direct path) or one
/// `ibv_post_send` of a linked list (verbs path). Dropped without [`Batch::ring`], it posts
/// nothing.
///
/// Unsignaled requests complete silently; the signaled one after them reports that they
/// are all done (and an error of any of them is reported whatever its flag).
///
/// ```
/// # #[cfg(feature = "sim")] fn main() -> blueflame::Result<()> {
/// use blueflame::{Access, Completion, Device, Payload, PostFlags, QpCaps, Request};
/// let dev = Device::sim_stepped();
/// let pd = dev.alloc_pd()?;
/// let mut cq = dev.create_cq(64)?;
/// let mut qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
/// qp.connect(&qp.endpoint()?)?;
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
/// let mut batch = qp.batch();
/// for i in 0..8u64 {
///     let flags = if i == 7 { PostFlags::SIGNALED } else { PostFlags::UNSIGNALED };
///     let bytes = i.to_le_bytes();
///     let remote = mr.remote(8 * i as usize)?;
///     let req = Request::Write { remote, data: Payload::Inline(&bytes) };
///     batch.push(&req, i, flags)?;
/// }
/// assert_eq!(batch.len(), 8);
/// batch.ring()?;                                  // one doorbell for the eight writes
/// dev.process();
/// let mut out = [Completion::default(); 8];
/// assert_eq!(cq.poll(&mut out), 1);               // only the signaled one
/// assert_eq!(out[0].cookie, 7);
/// assert_eq!(mr.read_u64(56)?, 7);
/// # Ok(()) }
/// # #[cfg(not(feature = "sim"))] fn main() {}
/// ```
#[must_use = "a batch posts nothing until rung"]
pub struct Batch<'a>(Path<'a>);

/// The data path a batch is written on.
pub(super) enum Path<'a> {
    /// Direct path.
    Direct(direct::Batch<'a>),
    /// Verbs path.
    Verbs(VerbsBatch<'a>),
    /// The QP is not connected: every push fails with [`Error::InvalidState`].
    NotConnected(&'static str),
}

impl<'a> Batch<'a> {
    pub(super) fn new(path: Path<'a>) -> Batch<'a> {
        Batch(path)
    }
}

impl Batch<'_> {
    /// Adds one request. On the direct path a batch holds as many as the ring has room for;
    /// on the verbs path at most 64 (one `ibv_post_send` list).
    ///
    /// # Errors
    /// As [`PostSend::post`](crate::PostSend::post); on the verbs path a 65th request is
    /// [`Error::QueueFull`] with [`QueueUnit::VerbsBatch`](crate::QueueUnit::VerbsBatch)
    /// (ring the batch, then push the rest into another). The requests pushed before stay
    /// in the batch.
    #[inline(always)]
    pub fn push(&mut self, req: &Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        match &mut self.0 {
            Path::Direct(b) => b.push(req, cookie, flags),
            // By value: the direct path's request can then stay in registers.
            _ => self.push_other(*req, cookie, flags),
        }
    }

    /// [`Batch::push`] on the verbs path, or before `connect`.
    #[inline(never)]
    fn push_other(&mut self, req: Request<'_>, cookie: u64, flags: PostFlags) -> Result<()> {
        match &mut self.0 {
            Path::Direct(b) => b.push(&req, cookie, flags),
            Path::Verbs(b) => b.push(&req, cookie, flags),
            Path::NotConnected(state) => Err(Error::InvalidState { state }),
        }
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        match &self.0 {
            Path::Direct(b) => b.len(),
            Path::Verbs(b) => b.len(),
            Path::NotConnected(_) => 0,
        }
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Posts the whole batch.
    ///
    /// # Errors
    /// On the verbs path, the `ibv_post_send` error (the direct path cannot fail here).
    #[inline(always)]
    pub fn ring(self) -> Result<()> {
        match self.0 {
            Path::Direct(b) => {
                b.ring();
                Ok(())
            }
            Path::Verbs(b) => b.ring(),
            Path::NotConnected(_) => Ok(()),
        }
    }
}
