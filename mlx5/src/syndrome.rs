//! Error-CQE syndromes and verbs work-completion statuses.
//!
//! [`Syndrome::wc_status`] maps exactly as rdma-core's `mlx5_handle_error_cqe` (`cq.c`), so
//! the direct path and the verbs path report the same [`WcStatus`] for the same failure.

/// The IB syndrome of an error CQE (`MLX5_CQE_SYNDROME_*`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Syndrome {
    /// Local length error: the data does not fit (e.g. a receive buffer too small).
    LocalLength,
    /// Local QP operation error: a malformed WQE.
    LocalQpOp,
    /// Local protection error: a bad lkey or a buffer outside its region.
    LocalProt,
    /// Work request flushed: the QP was in error.
    WrFlush,
    /// Memory-window bind error.
    MwBind,
    /// Bad response from the responder.
    BadResp,
    /// Local access error.
    LocalAccess,
    /// Remote invalid request: e.g. the responder has no rights for the opcode, or a misaligned
    /// atomic.
    RemoteInvalReq,
    /// Remote access error: a bad rkey, an out-of-bounds remote address or missing rights.
    RemoteAccess,
    /// Remote operation error: e.g. the responder had no receive WQE large enough.
    RemoteOp,
    /// Transport retries exhausted.
    TransportRetryExc,
    /// RNR retries exhausted: the responder had no receive WQE.
    RnrRetryExc,
    /// The remote side aborted.
    RemoteAborted,
    /// A syndrome this crate does not know (kept for the message).
    Other(u8),
}

impl Syndrome {
    /// Every named syndrome.
    pub const ALL: [Syndrome; 13] = [
        Syndrome::LocalLength,
        Syndrome::LocalQpOp,
        Syndrome::LocalProt,
        Syndrome::WrFlush,
        Syndrome::MwBind,
        Syndrome::BadResp,
        Syndrome::LocalAccess,
        Syndrome::RemoteInvalReq,
        Syndrome::RemoteAccess,
        Syndrome::RemoteOp,
        Syndrome::TransportRetryExc,
        Syndrome::RnrRetryExc,
        Syndrome::RemoteAborted,
    ];

    /// The hardware value.
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::LocalLength => 0x01,
            Syndrome::LocalQpOp => 0x02,
            Syndrome::LocalProt => 0x04,
            Syndrome::WrFlush => 0x05,
            Syndrome::MwBind => 0x06,
            Syndrome::BadResp => 0x10,
            Syndrome::LocalAccess => 0x11,
            Syndrome::RemoteInvalReq => 0x12,
            Syndrome::RemoteAccess => 0x13,
            Syndrome::RemoteOp => 0x14,
            Syndrome::TransportRetryExc => 0x15,
            Syndrome::RnrRetryExc => 0x16,
            Syndrome::RemoteAborted => 0x22,
            Syndrome::Other(v) => v,
        }
    }

    /// The syndrome of a hardware value.
    pub const fn from_u8(v: u8) -> Syndrome {
        match v {
            0x01 => Syndrome::LocalLength,
            0x02 => Syndrome::LocalQpOp,
            0x04 => Syndrome::LocalProt,
            0x05 => Syndrome::WrFlush,
            0x06 => Syndrome::MwBind,
            0x10 => Syndrome::BadResp,
            0x11 => Syndrome::LocalAccess,
            0x12 => Syndrome::RemoteInvalReq,
            0x13 => Syndrome::RemoteAccess,
            0x14 => Syndrome::RemoteOp,
            0x15 => Syndrome::TransportRetryExc,
            0x16 => Syndrome::RnrRetryExc,
            0x22 => Syndrome::RemoteAborted,
            v => Syndrome::Other(v),
        }
    }

    /// The work-completion status rdma-core reports for this syndrome.
    pub const fn wc_status(self) -> WcStatus {
        match self {
            Syndrome::LocalLength => WcStatus::LocLenErr,
            Syndrome::LocalQpOp => WcStatus::LocQpOpErr,
            Syndrome::LocalProt => WcStatus::LocProtErr,
            Syndrome::WrFlush => WcStatus::WrFlushErr,
            Syndrome::MwBind => WcStatus::MwBindErr,
            Syndrome::BadResp => WcStatus::BadRespErr,
            Syndrome::LocalAccess => WcStatus::LocAccessErr,
            Syndrome::RemoteInvalReq => WcStatus::RemInvReqErr,
            Syndrome::RemoteAccess => WcStatus::RemAccessErr,
            Syndrome::RemoteOp => WcStatus::RemOpErr,
            Syndrome::TransportRetryExc => WcStatus::RetryExcErr,
            Syndrome::RnrRetryExc => WcStatus::RnrRetryExcErr,
            Syndrome::RemoteAborted => WcStatus::RemAbortErr,
            Syndrome::Other(_) => WcStatus::GeneralErr,
        }
    }
}

/// A work-completion status, with the values of verbs' `enum ibv_wc_status`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum WcStatus {
    /// Success.
    Success = 0,
    /// Local length error.
    LocLenErr = 1,
    /// Local QP operation error.
    LocQpOpErr = 2,
    /// Local EE context operation error.
    LocEecOpErr = 3,
    /// Local protection error.
    LocProtErr = 4,
    /// Work request flushed.
    WrFlushErr = 5,
    /// Memory-window bind error.
    MwBindErr = 6,
    /// Bad response.
    BadRespErr = 7,
    /// Local access error.
    LocAccessErr = 8,
    /// Remote invalid request.
    RemInvReqErr = 9,
    /// Remote access error.
    RemAccessErr = 10,
    /// Remote operation error.
    RemOpErr = 11,
    /// Transport retries exhausted.
    RetryExcErr = 12,
    /// RNR retries exhausted.
    RnrRetryExcErr = 13,
    /// Local RDD violation.
    LocRddViolErr = 14,
    /// Remote invalid RD request.
    RemInvRdReqErr = 15,
    /// Remote aborted.
    RemAbortErr = 16,
    /// Invalid EE context number.
    InvEecnErr = 17,
    /// Invalid EE context state.
    InvEecStateErr = 18,
    /// Fatal error.
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// General error.
    GeneralErr = 21,
}

impl WcStatus {
    /// Every status, in value order.
    pub const ALL: [WcStatus; 22] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
    ];

    /// The status with this verbs value, or [`WcStatus::GeneralErr`] for values beyond it.
    pub const fn from_u32(v: u32) -> WcStatus {
        if (v as usize) < Self::ALL.len() {
            Self::ALL[v as usize]
        } else {
            WcStatus::GeneralErr
        }
    }

    /// `ibv_wc_status_str`'s text for this status.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_u8_inverts_to_u8() {
        for s in Syndrome::ALL {
            assert_eq!(Syndrome::from_u8(s.to_u8()), s);
        }
        assert_eq!(Syndrome::from_u8(0x99), Syndrome::Other(0x99));
        assert_eq!(Syndrome::Other(0x99).wc_status(), WcStatus::GeneralErr);
    }

    #[test]
    fn statuses_in_value_order() {
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert_eq!(WcStatus::from_u32(i as u32), *s);
        }
    }
}
