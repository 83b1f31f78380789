//! The device's asynchronous events (`ibv_get_async_event`; the software NIC raises the
//! same ones), and what each is about: the types every layer shares. Reading and keeping
//! them is `crate::resources::events`.

/// An asynchronous event of the device, as `ibv_get_async_event` reports them
/// (`IBV_EVENT_CQ_ERR`, `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_ACCESS_ERR`,
/// `IBV_EVENT_PORT_ERR`, `IBV_EVENT_DEVICE_FATAL`, `IBV_EVENT_SRQ_ERR`, and the informational
/// SRQ limit and last-WQE events): what
/// [`Error::AsyncEvent`](crate::Error::AsyncEvent) carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A CQ overran (or its memory failed): it is in error, writes nothing more. The CQ
    /// number is [`Cq::cqn`](crate::Cq::cqn)'s (on the verbs path the crate's own number:
    /// rdma-core names the CQ by its `ibv_cq`, whose context holds it).
    CqError {
        /// The CQ.
        cqn: u32,
    },
    /// A QP went to error for a reason no completion reports (its completion did not fit
    /// in an overrun CQ).
    QpFatal {
        /// The QP.
        qpn: u32,
    },
    /// A responder QP went to error on an incoming request it refused (a class-C error:
    /// remote access or invalid request).
    QpAccessError {
        /// The QP.
        qpn: u32,
    },
    /// The port went down.
    PortError {
        /// The port.
        port: u8,
    },
    /// The port came up (again) (`IBV_EVENT_PORT_ACTIVE`). Never reported as an error: it
    /// ends the port's [`AsyncEvent::PortError`] for the QPs and CQs on it (their own events,
    /// a QP gone to error during the outage, stay).
    PortActive {
        /// The port.
        port: u8,
    },
    /// The device failed; nothing runs any more.
    DeviceFatal,
    /// An SRQ's limit was reached: fewer receives than the limit set with
    /// [`Srq::set_limit`](crate::Srq::set_limit) remain posted
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit is disarmed. Not an error: read it with
    /// [`Srq::limit_reached`](crate::Srq::limit_reached). The SRQ number is
    /// [`Srq::srqn`](crate::Srq::srqn)'s (as for [`AsyncEvent::CqError`]).
    SrqLimitReached {
        /// The SRQ.
        srqn: u32,
    },
    /// A QP with an SRQ went to error and takes no more receives from it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`): its receive completions are all written. Not an
    /// error: read it with [`Qp::last_wqe_reached`](crate::Qp::last_wqe_reached).
    QpLastWqeReached {
        /// The QP.
        qpn: u32,
    },
    /// An SRQ failed (`IBV_EVENT_SRQ_ERR`): the receives posted to it complete no more.
    /// Reported by [`Srq::check`](crate::Srq::check), a refused post of the SRQ, and
    /// [`QueuePair::check`](crate::QueuePair::check) of every QP that takes its receives from it. The SRQ
    /// number is [`Srq::srqn`](crate::Srq::srqn)'s (as for [`AsyncEvent::CqError`]).
    SrqError {
        /// The SRQ.
        srqn: u32,
    },
}

#[cfg(feature = "sim")]
impl From<mlx5::sim::AsyncEvent> for AsyncEvent {
    fn from(e: mlx5::sim::AsyncEvent) -> Self {
        use mlx5::sim::AsyncEvent as S;
        match e {
            S::CqError { cqn } => AsyncEvent::CqError { cqn },
            S::QpFatal { qpn } => AsyncEvent::QpFatal { qpn },
            S::QpAccessError { qpn } => AsyncEvent::QpAccessError { qpn },
            S::PortError { port } => AsyncEvent::PortError { port },
            S::PortActive { port } => AsyncEvent::PortActive { port },
            S::DeviceFatal => AsyncEvent::DeviceFatal,
            S::SrqLimitReached { srqn } => AsyncEvent::SrqLimitReached { srqn },
            S::QpLastWqeReached { qpn } => AsyncEvent::QpLastWqeReached { qpn },
            S::SrqError { srqn } => AsyncEvent::SrqError { srqn },
            // The software NIC's enum is non-exhaustive: an event this crate does not know
            // yet stops everything rather than go unreported.
            _ => AsyncEvent::DeviceFatal,
        }
    }
}

#[cfg(feature = "sim")]
impl From<AsyncEvent> for mlx5::sim::AsyncEvent {
    fn from(e: AsyncEvent) -> Self {
        use mlx5::sim::AsyncEvent as S;
        match e {
            AsyncEvent::CqError { cqn } => S::CqError { cqn },
            AsyncEvent::QpFatal { qpn } => S::QpFatal { qpn },
            AsyncEvent::QpAccessError { qpn } => S::QpAccessError { qpn },
            AsyncEvent::PortError { port } => S::PortError { port },
            AsyncEvent::PortActive { port } => S::PortActive { port },
            AsyncEvent::DeviceFatal => S::DeviceFatal,
            AsyncEvent::SrqLimitReached { srqn } => S::SrqLimitReached { srqn },
            AsyncEvent::QpLastWqeReached { qpn } => S::QpLastWqeReached { qpn },
            AsyncEvent::SrqError { srqn } => S::SrqError { srqn },
        }
    }
}

/// What an event is about.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Subject {
    /// A software-NIC CQ by number.
    #[cfg(feature = "sim")]
    Cq(u32),
    /// A verbs CQ by its `ibv_cq` address.
    VerbsCq(usize),
    /// A QP by number.
    Qp(u32),
    /// The informational events of an SRQ (its limit): a software-NIC SRQ by number, a
    /// verbs SRQ by its `ibv_srq` address.
    Srq(u64),
    /// The last-WQE-reached event of a QP by number (informational).
    LastWqe(u32),
    /// The error of an SRQ, named as [`Subject::Srq`] names it (kept, unlike the limit).
    SrqError(u64),
    /// A port (its error: down), reported to the devices opened on it: connections on one
    /// librdmacm context share one record whatever their ports.
    Port(u8),
    /// Everything (device fatal).
    All,
}
