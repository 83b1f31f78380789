//! rdma-core's mlx5 environment variables that change what the direct path may do, read as
//! rdma-core reads them (`providers/mlx5/mlx5.c` `get_shut_up_bf`, `verbs.c`
//! `qp_sig_enabled`). The README's table lists every variable and what blueflame does.
//!
//! - `MLX5_SHUT_UP_BF` set to anything but `0`: rdma-core maps the UAR pages uncached
//!   (`MLX5_UAR_TYPE_NC`) and never BlueFlame-copies, yet `mlx5dv_init_obj` still reports
//!   `bf.size`: the direct path treats the register as doorbell only (`bf_size = 0`).
//! - `MLX5_QP_SIGNATURE` set (any value, even `0`): rdma-core creates QPs with WQE signatures
//!   (`wq_sig`): receive WQEs start with a signature segment and every control segment carries
//!   a signature byte the device checks. The direct path writes neither, so such QPs run the
//!   verbs path (`BLUEFLAME_PATH=direct` is refused with [`Error::Unsupported`]).
//! - `MLX5_POST_SEND_PREFER_BF=0` (`mlx5.c` `get_always_bf`): rdma-core BlueFlame-copies
//!   only WQEs with inline data; so does the direct path.
//! - `MLX5_SCATTER_TO_CQE=0` (`verbs.c` `use_scatter_to_cqe`): rdma-core creates QPs without
//!   responder scatter-to-CQE, so small received sends land in the receive buffers instead
//!   of inside the CQE. The direct path handles both; the software NIC follows the switch.

use crate::data_path::DataPath;
use crate::error::{Error, Result};
use mlx5::RawQp;

/// The variables that matter to the direct path, as rdma-core interprets them.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Mlx5Env {
    /// `MLX5_SHUT_UP_BF` set and not `0`: doorbell only.
    pub shut_up_bf: bool,
    /// `MLX5_QP_SIGNATURE` set: QPs carry WQE signatures.
    pub qp_signature: bool,
    /// `MLX5_SCATTER_TO_CQE` set to `0`: no responder scatter-to-CQE.
    pub scatter_to_cqe_off: bool,
    /// `MLX5_POST_SEND_PREFER_BF` set to `0`: BlueFlame copies only for WQEs with inline
    /// data (rdma-core's default, `prefer_bf`, copies any WQE that fits).
    pub prefer_bf_off: bool,
    /// `MLX5_SRQ_SIGNATURE` set: SRQs are created with WQE signatures
    /// (`MLX5_SRQ_FLAG_SIGNATURE`), which the direct path does not write: such an SRQ is
    /// refused there.
    pub srq_signature: bool,
}

impl Mlx5Env {
    /// Reads the variables through `get` (the process environment in [`Mlx5Env::current`]).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Mlx5Env {
        Mlx5Env {
            // mlx5.c get_shut_up_bf: set and strcmp(env, "0") != 0.
            shut_up_bf: get("MLX5_SHUT_UP_BF").is_some_and(|v| v != "0"),
            // verbs.c qp_sig_enabled: set at all.
            qp_signature: get("MLX5_QP_SIGNATURE").is_some(),
            // verbs.c use_scatter_to_cqe: off only for exactly "0".
            scatter_to_cqe_off: get("MLX5_SCATTER_TO_CQE").is_some_and(|v| v == "0"),
            // mlx5.c get_always_bf: unset -> 1, else strcmp(env, "0") != 0.
            prefer_bf_off: get("MLX5_POST_SEND_PREFER_BF").is_some_and(|v| v == "0"),
            // verbs.c srq_sig_enabled: set at all.
            srq_signature: get("MLX5_SRQ_SIGNATURE").is_some(),
        }
    }

    /// The process environment now (read when a device is opened or a QP created, never on
    /// the data path; which switch when: [`Mlx5Env::for_qp`]).
    pub fn current() -> Mlx5Env {
        Mlx5Env::from_vars(|k| std::env::var(k).ok())
    }

    /// The switches a QP is created under on a device opened under `opened`: rdma-core reads
    /// `MLX5_QP_SIGNATURE` and `MLX5_SCATTER_TO_CQE` (and `MLX5_SRQ_SIGNATURE`) at each
    /// creation, but `MLX5_SHUT_UP_BF` and `MLX5_POST_SEND_PREFER_BF` once, when it opens the
    /// context (`mlx5_set_context`): a QP's register is rung as the context was opened, or
    /// a queue would ring a shared BlueFlame register as doorbell-only, without its lock.
    pub(crate) fn for_qp(opened: &Mlx5Env) -> Mlx5Env {
        Mlx5Env {
            shut_up_bf: opened.shut_up_bf,
            prefer_bf_off: opened.prefer_bf_off,
            ..Mlx5Env::current()
        }
    }

    /// Applies what rdma-core does to a QP's rings: `MLX5_SHUT_UP_BF` makes it doorbell only.
    pub fn apply(&self, raw: &mut RawQp) {
        if self.shut_up_bf {
            raw.bf_size = 0;
        }
    }

    /// Applies what rdma-core does to a QP's send queue: `MLX5_POST_SEND_PREFER_BF=0` makes
    /// BlueFlame copies for WQEs with inline data only (`post_send_db`: `inl || prefer_bf`).
    pub fn configure(&self, sq: &mut crate::direct::SendQueue) {
        sq.set_blueflame_inline_only(self.prefer_bf_off);
    }

    /// The data path of a QP on a device that would run `path`: the verbs path on mlx5
    /// when rdma-core creates QPs with WQE signatures.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the direct path was asked for explicitly
    /// (`BLUEFLAME_PATH=direct`) and `MLX5_QP_SIGNATURE` is set.
    pub fn path(&self, path: DataPath, forced: bool) -> Result<DataPath> {
        match (path, self.qp_signature) {
            (DataPath::Direct, true) if forced => Err(Error::Unsupported(
                "BLUEFLAME_PATH=direct with MLX5_QP_SIGNATURE set: the direct path writes no \
                 WQE signatures (unset it, or run the verbs path)",
            )),
            (DataPath::Direct, true) => Ok(DataPath::Verbs),
            (p, _) => Ok(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Mlx5Env {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Mlx5Env::from_vars(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn read_as_rdma_core_reads_them() {
        assert_eq!(env(&[]), Mlx5Env::default());
        assert!(env(&[("MLX5_SHUT_UP_BF", "1")]).shut_up_bf);
        assert!(env(&[("MLX5_SHUT_UP_BF", "yes")]).shut_up_bf);
        assert!(!env(&[("MLX5_SHUT_UP_BF", "0")]).shut_up_bf);
        // Any value enables signatures, "0" included (verbs.c qp_sig_enabled).
        assert!(env(&[("MLX5_QP_SIGNATURE", "0")]).qp_signature);
        assert!(env(&[("MLX5_QP_SIGNATURE", "")]).qp_signature);
        assert!(env(&[("MLX5_SCATTER_TO_CQE", "0")]).scatter_to_cqe_off);
        assert!(!env(&[("MLX5_SCATTER_TO_CQE", "1")]).scatter_to_cqe_off);
        assert!(!env(&[("MLX5_SCATTER_TO_CQE", "")]).scatter_to_cqe_off);
        assert!(env(&[("MLX5_POST_SEND_PREFER_BF", "0")]).prefer_bf_off);
        assert!(!env(&[("MLX5_POST_SEND_PREFER_BF", "1")]).prefer_bf_off);
        assert!(!env(&[("MLX5_POST_SEND_PREFER_BF", "")]).prefer_bf_off);
        assert!(env(&[("MLX5_SRQ_SIGNATURE", "0")]).srq_signature);
        assert!(!env(&[]).srq_signature);
    }

    #[test]
    fn shut_up_bf_means_doorbell_only() {
        let mut raw = RawQp {
            qpn: 1,
            sq_buf: core::ptr::null_mut(),
            sq_wqe_cnt: 64,
            sq_stride: 64,
            rq_buf: core::ptr::null_mut(),
            rq_wqe_cnt: 0,
            rq_stride: 0,
            dbrec: core::ptr::null_mut(),
            bf_reg: core::ptr::null_mut(),
            bf_size: 256,
            max_inline: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
        };
        env(&[("MLX5_SHUT_UP_BF", "0")]).apply(&mut raw);
        assert_eq!(raw.bf_size, 256);
        env(&[("MLX5_SHUT_UP_BF", "1")]).apply(&mut raw);
        assert_eq!(raw.bf_size, 0);
    }

    #[test]
    fn qp_signature_sends_mlx5_to_the_verbs_path() {
        let sig = env(&[("MLX5_QP_SIGNATURE", "1")]);
        assert_eq!(sig.path(DataPath::Direct, false).unwrap(), DataPath::Verbs);
        assert!(matches!(
            sig.path(DataPath::Direct, true),
            Err(Error::Unsupported(_))
        ));
        assert_eq!(sig.path(DataPath::Verbs, false).unwrap(), DataPath::Verbs);
        let none = Mlx5Env::default();
        assert_eq!(none.path(DataPath::Direct, true).unwrap(), DataPath::Direct);
    }
}
