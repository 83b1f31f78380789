//! The asynchronous events of the software NIC (its event queue's entries).

/// An asynchronous event of the device, as `ibv_get_async_event` reports them
/// (`IBV_EVENT_CQ_ERR`, `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_ACCESS_ERR`, ...).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A CQ overran (or its memory failed): it is in error, writes nothing more.
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
    /// The port came up (again): `IBV_EVENT_PORT_ACTIVE` (the software NIC raises it only
    /// when told to, `NicView::raise_event`).
    PortActive {
        /// The port.
        port: u8,
    },
    /// The device failed; nothing runs any more.
    DeviceFatal,
    /// An SRQ's armed limit was reached: fewer WQEs than the limit remain posted
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit is disarmed.
    SrqLimitReached {
        /// The SRQ.
        srqn: u32,
    },
    /// A QP with an SRQ went to error and will take no more WQEs from it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached {
        /// The QP.
        qpn: u32,
    },
    /// An SRQ failed (`IBV_EVENT_SRQ_ERR`): its receives complete no more (the software NIC
    /// raises it only when told to, `NicView::raise_event`).
    SrqError {
        /// The SRQ.
        srqn: u32,
    },
}
