//! Which rdma-core calls the verbs path posts and polls with ([`VerbsApi`]), as
//! `BLUEFLAME_VERBS_API` asks ([`ApiChoice`]).

use crate::error::{Error, Result};

/// Which rdma-core calls a verbs-path QP posts with, or a verbs-path CQ polls with.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VerbsApi {
    /// QP: `ibv_wr_start`, `ibv_wr_rdma_write` (and the other `ibv_wr_*` opcodes),
    /// `ibv_wr_set_sge_list` / `ibv_wr_set_inline_data`, `ibv_wr_complete`.
    /// CQ: `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`.
    Extended,
    /// QP: `ibv_post_send` of a linked list of `ibv_send_wr`. CQ: `ibv_poll_cq`.
    Legacy,
}

impl std::fmt::Display for VerbsApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VerbsApi::Extended => "extended (ibv_wr_* / ibv_start_poll)",
            VerbsApi::Legacy => "legacy (ibv_post_send / ibv_poll_cq)",
        })
    }
}

/// What `BLUEFLAME_VERBS_API` asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ApiChoice {
    /// Extended where the provider has it, else legacy.
    Auto,
    /// Extended, or an error.
    Extended,
    /// Legacy.
    Legacy,
}

/// The environment variable that overrides the choice.
pub const VAR: &str = "BLUEFLAME_VERBS_API";

impl ApiChoice {
    /// The choice `var` (the value of `BLUEFLAME_VERBS_API`) asks for.
    ///
    /// # Errors
    /// [`Error::Environment`] (with the value) for a value other than `auto`, `extended`,
    /// `legacy`.
    pub fn parse(var: Option<&str>) -> Result<ApiChoice> {
        match var.unwrap_or("auto") {
            "auto" | "" => Ok(ApiChoice::Auto),
            "extended" => Ok(ApiChoice::Extended),
            "legacy" => Ok(ApiChoice::Legacy),
            other => Err(Error::Environment {
                var: VAR,
                value: other.into(),
            }),
        }
    }

    /// The choice of the environment now (read when a QP or CQ is created).
    ///
    /// # Errors
    /// As [`ApiChoice::parse`].
    pub fn current() -> Result<ApiChoice> {
        ApiChoice::parse(std::env::var(VAR).ok().as_deref())
    }

    /// Whether to try the extended API.
    pub fn wants_extended(self) -> bool {
        self != ApiChoice::Legacy
    }

    /// The error when the extended API was required and the provider lacks it.
    pub(crate) fn unavailable(self, what: &'static str) -> Result<()> {
        if self == ApiChoice::Extended {
            return Err(Error::Unsupported(what));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_override_names_three_choices() {
        assert_eq!(ApiChoice::parse(None).unwrap(), ApiChoice::Auto);
        assert_eq!(ApiChoice::parse(Some("auto")).unwrap(), ApiChoice::Auto);
        assert_eq!(
            ApiChoice::parse(Some("extended")).unwrap(),
            ApiChoice::Extended
        );
        assert_eq!(ApiChoice::parse(Some("legacy")).unwrap(), ApiChoice::Legacy);
        assert!(matches!(
            ApiChoice::parse(Some("ex")),
            Err(Error::Environment { var: VAR, ref value }) if &**value == "ex"
        ));
        let shown = ApiChoice::parse(Some("ex")).unwrap_err().to_string();
        assert!(
            shown.contains("\"ex\"") && shown.contains("auto, extended or legacy"),
            "{shown}"
        );
        assert!(ApiChoice::Auto.unavailable("x").is_ok());
        assert!(ApiChoice::Legacy.unavailable("x").is_ok());
        assert!(matches!(
            ApiChoice::Extended.unavailable("x"),
            Err(Error::Unsupported("x"))
        ));
        assert!(!ApiChoice::Legacy.wants_extended());
    }
}
