//! Every struct layout and constant of the `mlx5` crate against the values the C compiler
//! produced from rdma-core's installed `<infiniband/mlx5dv.h>` and `<infiniband/verbs.h>`.
//!
//! One `#[test]` per member or constant, so the run lists each check. The C side is looked
//! up by name in the table of `csrc/hdrcheck.c`: a name missing from the table fails its
//! test. `table::no_orphan_entries` fails when the table holds a value no test compares.
#![allow(missing_docs)]

use core::mem::{offset_of, size_of, size_of_val};
use mlx5_hdrcheck::{table, value};

/// Defines one test for `sizeof` of each struct and one per member (offset and size), and a
/// const `$names` listing every C name those tests read.
macro_rules! layout {
    (names: $names:ident; $(
        $rust:ty = $c:literal, $size_test:ident {
            $( $test:ident => $field:ident ),* $(,)?
        }
    )*) => {
        $(
            #[test]
            fn $size_test() {
                assert_eq!(
                    size_of::<$rust>() as u64,
                    value(concat!("sizeof(struct ", $c, ")")),
                    "sizeof {} vs struct {}",
                    stringify!($rust),
                    $c
                );
            }
            $(
                #[test]
                fn $test() {
                    let zeroed: $rust = zerocopy::FromZeros::new_zeroed();
                    let off = offset_of!($rust, $field) as u64;
                    let size = size_of_val(&zeroed.$field) as u64;
                    assert_eq!(
                        off,
                        value(concat!("offsetof(", $c, ", ", stringify!($field), ")")),
                        "offset of {}::{} vs {}.{}",
                        stringify!($rust),
                        stringify!($field),
                        $c,
                        stringify!($field)
                    );
                    assert_eq!(
                        size,
                        value(concat!("sizeof(", $c, ".", stringify!($field), ")")),
                        "size of {}::{} vs {}.{}",
                        stringify!($rust),
                        stringify!($field),
                        $c,
                        stringify!($field)
                    );
                }
            )*
        )*
        pub const $names: &[&str] = &[
            $(
                concat!("sizeof(struct ", $c, ")"),
                $(
                    concat!("offsetof(", $c, ", ", stringify!($field), ")"),
                    concat!("sizeof(", $c, ".", stringify!($field), ")"),
                )*
            )*
        ];
    };
}

/// Defines one test per constant: the Rust value (any integer) equals the C one. `$names`
/// lists the C names, `$pairs` the (C name, Rust value) pairs for the coverage tests.
macro_rules! consts {
    (names: $names:ident, pairs: $pairs:ident; $( $test:ident : $rust:expr => $c:literal ),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                assert_eq!(
                    ($rust) as u64,
                    value($c),
                    "Rust `{}` vs header `{}`",
                    stringify!($rust),
                    $c
                );
            }
        )*
        pub const $names: &[&str] = &[ $( $c ),* ];
        pub const $pairs: &[(&str, fn() -> u64)] = &[ $( ($c, || ($rust) as u64) ),* ];
    };
}

/// Defines tests that bind C values to local names (`let x = value("...")`) and check a
/// relation; `$names` lists exactly the names they read.
macro_rules! checks {
    (names: $names:ident; $( $test:ident ( $( $var:ident = $c:literal ),* $(,)? ) $body:block )*) => {
        $(
            #[test]
            fn $test() {
                $( let $var = value($c); )*
                $body
            }
        )*
        pub const $names: &[&str] = &[ $( $( $c, )* )* ];
    };
}

mod layout {
    use super::*;
    use mlx5::cqe::{Cqe64, ErrCqe};
    use mlx5::seg::{AtomicSeg, DataSeg, InlineHeader, RaddrSeg};
    use mlx5::srq::SrqNextSeg;
    use mlx5::umr::{KlmSeg, MkeyContextSeg, UmrCtrlSeg};
    use mlx5::CtrlSeg;

    layout! {
        names: NAMES;
        CtrlSeg = "mlx5_wqe_ctrl_seg", ctrl_seg_size {
            ctrl_seg_opmod_idx_opcode => opmod_idx_opcode,
            ctrl_seg_qpn_ds => qpn_ds,
            ctrl_seg_signature => signature,
            ctrl_seg_dci_stream_channel_id => dci_stream_channel_id,
            ctrl_seg_fm_ce_se => fm_ce_se,
            ctrl_seg_imm => imm,
        }
        RaddrSeg = "mlx5_wqe_raddr_seg", raddr_seg_size {
            raddr_seg_raddr => raddr,
            raddr_seg_rkey => rkey,
            raddr_seg_reserved => reserved,
        }
        DataSeg = "mlx5_wqe_data_seg", data_seg_size {
            data_seg_byte_count => byte_count,
            data_seg_lkey => lkey,
            data_seg_addr => addr,
        }
        SrqNextSeg = "mlx5_wqe_srq_next_seg", srq_next_seg_size {
            srq_next_seg_rsvd0 => rsvd0,
            srq_next_seg_next_wqe_index => next_wqe_index,
            srq_next_seg_signature => signature,
            srq_next_seg_rsvd1 => rsvd1,
        }
        InlineHeader = "mlx5_wqe_inl_data_seg", inl_data_seg_size {
            inl_data_seg_byte_count => byte_count,
        }
        AtomicSeg = "mlx5_wqe_atomic_seg", atomic_seg_size {
            atomic_seg_swap_add => swap_add,
            atomic_seg_compare => compare,
        }
        UmrCtrlSeg = "mlx5_wqe_umr_ctrl_seg", umr_ctrl_seg_size {
            umr_ctrl_seg_flags => flags,
            umr_ctrl_seg_rsvd0 => rsvd0,
            umr_ctrl_seg_klm_octowords => klm_octowords,
            umr_ctrl_seg_translation_offset => translation_offset,
            umr_ctrl_seg_mkey_mask => mkey_mask,
            umr_ctrl_seg_rsvd1 => rsvd1,
        }
        MkeyContextSeg = "mlx5_wqe_mkey_context_seg", mkey_context_seg_size {
            mkey_context_seg_free => free,
            mkey_context_seg_reserved1 => reserved1,
            mkey_context_seg_access_flags => access_flags,
            mkey_context_seg_sf => sf,
            mkey_context_seg_qpn_mkey => qpn_mkey,
            mkey_context_seg_reserved2 => reserved2,
            mkey_context_seg_flags_pd => flags_pd,
            mkey_context_seg_start_addr => start_addr,
            mkey_context_seg_len => len,
            mkey_context_seg_bsf_octword_size => bsf_octword_size,
            mkey_context_seg_reserved3 => reserved3,
            mkey_context_seg_translations_octword_size => translations_octword_size,
            mkey_context_seg_reserved4 => reserved4,
            mkey_context_seg_log_page_size => log_page_size,
            mkey_context_seg_reserved => reserved,
        }
        KlmSeg = "mlx5_wqe_umr_klm_seg", umr_klm_seg_size {
            umr_klm_seg_byte_count => byte_count,
            umr_klm_seg_mkey => mkey,
            umr_klm_seg_address => address,
        }
        Cqe64 = "mlx5_cqe64", cqe64_size {
            cqe64_srqn_uidx => srqn_uidx,
            cqe64_imm_inval_pkey => imm_inval_pkey,
            cqe64_app => app,
            cqe64_app_op => app_op,
            cqe64_app_info => app_info,
            cqe64_byte_cnt => byte_cnt,
            cqe64_timestamp => timestamp,
            cqe64_sop_drop_qpn => sop_drop_qpn,
            cqe64_wqe_counter => wqe_counter,
            cqe64_signature => signature,
            cqe64_op_own => op_own,
        }
        ErrCqe = "mlx5_err_cqe", err_cqe_size {
            err_cqe_rsvd0 => rsvd0,
            err_cqe_srqn => srqn,
            err_cqe_vendor_err_synd => vendor_err_synd,
            err_cqe_syndrome => syndrome,
            err_cqe_s_wqe_opcode_qpn => s_wqe_opcode_qpn,
            err_cqe_wqe_counter => wqe_counter,
            err_cqe_signature => signature,
            err_cqe_op_own => op_own,
        }
    }

    fn err_cqe() -> ErrCqe {
        ErrCqe::default()
    }

    checks! {
        names: SPECIAL_NAMES;

        // The header keeps 18 reserved bytes after srqn; the crate splits them as the kernel
        // does (rsvd1[16], hw_err_synd, hw_synd_type). Same start, same total, same end.
        err_cqe_rsvd1_is_the_kernel_split(
            c_off = "offsetof(mlx5_err_cqe, rsvd1)",
            c_size = "sizeof(mlx5_err_cqe.rsvd1)",
            c_vendor = "offsetof(mlx5_err_cqe, vendor_err_synd)",
        ) {
            let e = err_cqe();
            let split = size_of_val(&e.rsvd1)
                + size_of_val(&e.hw_err_synd)
                + size_of_val(&e.hw_synd_type);
            assert_eq!(offset_of!(ErrCqe, rsvd1) as u64, c_off);
            assert_eq!(split as u64, c_size, "rsvd1 + hw_err_synd + hw_synd_type");
            assert_eq!(
                offset_of!(ErrCqe, hw_err_synd) as u64,
                c_off + size_of_val(&e.rsvd1) as u64
            );
            assert_eq!(
                offset_of!(ErrCqe, hw_synd_type) as u64,
                offset_of!(ErrCqe, hw_err_synd) as u64 + 1
            );
            assert_eq!(offset_of!(ErrCqe, hw_synd_type) as u64 + 1, c_vendor);
            // 32 + 4 + 16 + 2 == offsetof(vendor_err_synd)
            let prefix = size_of_val(&e.rsvd0) + size_of_val(&e.srqn) + split;
            assert_eq!(prefix as u64, c_vendor);
        }

        // The crate keeps the leading union (Ethernet / tag-matching / TMH) as raw bytes.
        cqe64_rsvd0_covers_the_leading_union(c_srqn = "offsetof(mlx5_cqe64, srqn_uidx)") {
            let c = Cqe64::default();
            assert_eq!(offset_of!(Cqe64, rsvd0), 0);
            assert_eq!(size_of_val(&c.rsvd0) as u64, c_srqn);
        }

        // translation_offset shares its two bytes with bsf_octowords in the header's union.
        umr_ctrl_seg_bsf_octowords_is_translation_offset(
            c_off = "offsetof(mlx5_wqe_umr_ctrl_seg, bsf_octowords)",
            c_size = "sizeof(mlx5_wqe_umr_ctrl_seg.bsf_octowords)",
        ) {
            let u = UmrCtrlSeg::default();
            assert_eq!(offset_of!(UmrCtrlSeg, translation_offset) as u64, c_off);
            assert_eq!(size_of_val(&u.translation_offset) as u64, c_size);
        }

        // Inline translations (KLMs) start right after the mkey context.
        mkey_context_seg_inseg_follows(c_off = "offsetof(mlx5_wqe_mkey_context_seg, inseg)") {
            assert_eq!(size_of::<MkeyContextSeg>() as u64, c_off);
        }

        // One DS is one data segment; the inline header is one mlx5_wqe_inl_data_seg.
        ds_bytes_is_one_data_seg(c = "sizeof(struct mlx5_wqe_data_seg)") {
            assert_eq!(mlx5::seg::DS_BYTES as u64, c);
        }
        inline_header_bytes_is_inl_data_seg(c = "sizeof(struct mlx5_wqe_inl_data_seg)") {
            assert_eq!(mlx5::seg::INLINE_HEADER_BYTES as u64, c);
        }

        // A bind's single KLM is padded to one basic block.
        bind_klm_octowords_fill_one_block(
            klm = "sizeof(struct mlx5_wqe_umr_klm_seg)",
            bb = "MLX5_SEND_WQE_BB",
        ) {
            assert_eq!(mlx5::umr::BIND_KLM_OCTOWORDS as u64 * klm, bb);
        }

        // A bind WQE: ctrl + UMR ctrl + mkey context + one padded KLM, 12 DS.
        bind_wqe_is_twelve_ds(
            ctrl = "sizeof(struct mlx5_wqe_ctrl_seg)",
            umr = "sizeof(struct mlx5_wqe_umr_ctrl_seg)",
            mkey = "sizeof(struct mlx5_wqe_mkey_context_seg)",
            bb = "MLX5_SEND_WQE_BB",
            ds = "sizeof(struct mlx5_wqe_data_seg)",
        ) {
            let bind = mlx5::Request::BindMw(mlx5::BindMw {
                mw_rkey: 0x100,
                new_rkey: 0x101,
                mw_type: mlx5::request::MwType::Two,
                mr_lkey: 1,
                addr: 0x1000,
                len: 0x1000,
                access: mlx5::Access::REMOTE_READ,
            });
            let lim = mlx5::wqe::Limits { max_sge: 4, max_inline: 64 };
            let got = mlx5::wqe::wqe_ds(&bind, &lim).unwrap() as u64;
            assert_eq!(got, (ctrl + umr + mkey + bb) / ds);
        }
    }
}

mod consts {
    use super::*;
    use mlx5::cqe::{op_own, CqeFormat, CqeOpcode, MiniCqeFormat, OWNER_MASK};
    use mlx5::ctrl::{CompletionMode, Fence, FmCeSe};
    use mlx5::doorbell as db;
    use mlx5::umr as u;
    use mlx5::{Access, Opcode, Syndrome, WcStatus};

    const fn fm(fence: Fence, completion: CompletionMode, solicited: bool) -> u8 {
        FmCeSe {
            fence,
            completion,
            solicited,
        }
        .to_u8()
    }

    consts! {
        names: NAMES, pairs: PAIRS;
        // send opcodes (mlx5::Opcode)
        opcode_nop: Opcode::Nop as u8 => "MLX5_OPCODE_NOP",
        opcode_send_inval: Opcode::SendInval as u8 => "MLX5_OPCODE_SEND_INVAL",
        opcode_rdma_write: Opcode::RdmaWrite as u8 => "MLX5_OPCODE_RDMA_WRITE",
        opcode_rdma_write_imm: Opcode::RdmaWriteImm as u8 => "MLX5_OPCODE_RDMA_WRITE_IMM",
        opcode_send: Opcode::Send as u8 => "MLX5_OPCODE_SEND",
        opcode_send_imm: Opcode::SendImm as u8 => "MLX5_OPCODE_SEND_IMM",
        opcode_rdma_read: Opcode::RdmaRead as u8 => "MLX5_OPCODE_RDMA_READ",
        opcode_atomic_cs: Opcode::AtomicCs as u8 => "MLX5_OPCODE_ATOMIC_CS",
        opcode_atomic_fa: Opcode::AtomicFa as u8 => "MLX5_OPCODE_ATOMIC_FA",
        opcode_atomic_masked_cs: Opcode::AtomicMaskedCs as u8 => "MLX5_OPCODE_ATOMIC_MASKED_CS",
        opcode_atomic_masked_fa: Opcode::AtomicMaskedFa as u8 => "MLX5_OPCODE_ATOMIC_MASKED_FA",
        opcode_local_inval: Opcode::LocalInval as u8 => "MLX5_OPCODE_LOCAL_INVAL",
        opcode_umr: Opcode::Umr as u8 => "MLX5_OPCODE_UMR",

        // error syndromes (mlx5::Syndrome)
        syndrome_local_length: Syndrome::LocalLength.to_u8() => "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR",
        syndrome_local_qp_op: Syndrome::LocalQpOp.to_u8() => "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR",
        syndrome_local_prot: Syndrome::LocalProt.to_u8() => "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR",
        syndrome_wr_flush: Syndrome::WrFlush.to_u8() => "MLX5_CQE_SYNDROME_WR_FLUSH_ERR",
        syndrome_mw_bind: Syndrome::MwBind.to_u8() => "MLX5_CQE_SYNDROME_MW_BIND_ERR",
        syndrome_bad_resp: Syndrome::BadResp.to_u8() => "MLX5_CQE_SYNDROME_BAD_RESP_ERR",
        syndrome_local_access: Syndrome::LocalAccess.to_u8() => "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR",
        syndrome_remote_inval_req: Syndrome::RemoteInvalReq.to_u8() => "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR",
        syndrome_remote_access: Syndrome::RemoteAccess.to_u8() => "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR",
        syndrome_remote_op: Syndrome::RemoteOp.to_u8() => "MLX5_CQE_SYNDROME_REMOTE_OP_ERR",
        syndrome_transport_retry_exc: Syndrome::TransportRetryExc.to_u8() => "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR",
        syndrome_rnr_retry_exc: Syndrome::RnrRetryExc.to_u8() => "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR",
        syndrome_remote_aborted: Syndrome::RemoteAborted.to_u8() => "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR",

        // CQE opcodes, owner bit, inline-scatter formats (mlx5::cqe)
        cqe_owner_mask: OWNER_MASK => "MLX5_CQE_OWNER_MASK",
        cqe_req: CqeOpcode::Req as u8 => "MLX5_CQE_REQ",
        cqe_resp_wr_imm: CqeOpcode::RespWrImm as u8 => "MLX5_CQE_RESP_WR_IMM",
        cqe_resp_send: CqeOpcode::RespSend as u8 => "MLX5_CQE_RESP_SEND",
        cqe_resp_send_imm: CqeOpcode::RespSendImm as u8 => "MLX5_CQE_RESP_SEND_IMM",
        cqe_resp_send_inv: CqeOpcode::RespSendInv as u8 => "MLX5_CQE_RESP_SEND_INV",
        cqe_resize_cq: CqeOpcode::ResizeCq as u8 => "MLX5_CQE_RESIZE_CQ",
        cqe_sig_err: CqeOpcode::SigErr as u8 => "MLX5_CQE_SIG_ERR",
        cqe_req_err: CqeOpcode::ReqErr as u8 => "MLX5_CQE_REQ_ERR",
        cqe_resp_err: CqeOpcode::RespErr as u8 => "MLX5_CQE_RESP_ERR",
        cqe_invalid: CqeOpcode::Invalid as u8 => "MLX5_CQE_INVALID",
        cqe_inline_scatter_32: op_own(CqeOpcode::Req, CqeFormat::InlineScatter32, false, false) => "MLX5_INLINE_SCATTER_32",
        cqe_inline_scatter_64: op_own(CqeOpcode::Req, CqeFormat::InlineScatter64, false, false) => "MLX5_INLINE_SCATTER_64",

        // CQE compression (mlx5::cqe)
        res_format_hash: MiniCqeFormat::Hash.bit() => "MLX5DV_CQE_RES_FORMAT_HASH",
        res_format_csum: MiniCqeFormat::Csum.bit() => "MLX5DV_CQE_RES_FORMAT_CSUM",
        res_format_csum_stridx: MiniCqeFormat::CsumStridx.bit() => "MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX",
        cq_init_attr_mask_compressed_cqe: mlx5::cqe::CQ_INIT_ATTR_MASK_COMPRESSED_CQE => "MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE",
        context_mask_cqe_compression: mlx5::cqe::CONTEXT_MASK_CQE_COMPRESSION => "MLX5DV_CONTEXT_MASK_CQE_COMPRESION",
        context_flags_cqe_128b_comp: mlx5::cqe::CONTEXT_FLAGS_CQE_128B_COMP => "MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP",

        // control-segment bits (mlx5::ctrl), as constants and as FmCeSe::to_u8
        ctrl_cq_update: mlx5::ctrl::CQ_UPDATE => "MLX5_WQE_CTRL_CQ_UPDATE",
        ctrl_solicited: mlx5::ctrl::SOLICITED => "MLX5_WQE_CTRL_SOLICITED",
        ctrl_fence: mlx5::ctrl::FENCE => "MLX5_WQE_CTRL_FENCE",
        ctrl_initiator_small_fence: mlx5::ctrl::INITIATOR_SMALL_FENCE => "MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE",
        fm_ce_se_completion_always: fm(Fence::None, CompletionMode::Always, false) => "MLX5_WQE_CTRL_CQ_UPDATE",
        fm_ce_se_solicited: fm(Fence::None, CompletionMode::OnError, true) => "MLX5_WQE_CTRL_SOLICITED",
        fm_ce_se_small_and_fence: fm(Fence::SmallAndFence, CompletionMode::OnError, false) => "MLX5_WQE_CTRL_FENCE",
        fm_ce_se_initiator_small: fm(Fence::InitiatorSmall, CompletionMode::OnError, false) => "MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE",

        // blocks, inline, receive (mlx5::doorbell, mlx5::seg, mlx5::recv)
        send_wqe_bb: db::SEND_WQE_BB => "MLX5_SEND_WQE_BB",
        send_wqe_shift: db::SEND_WQE_SHIFT => "MLX5_SEND_WQE_SHIFT",
        inline_seg: mlx5::seg::INLINE_SEG => "MLX5_INLINE_SEG",
        invalid_lkey: mlx5::recv::INVALID_LKEY => "MLX5_INVALID_LKEY",

        // doorbells (mlx5::doorbell)
        rcv_dbr: db::RCV_DBR => "MLX5_RCV_DBR",
        snd_dbr: db::SND_DBR => "MLX5_SND_DBR",
        cq_doorbell: db::CQ_DOORBELL => "MLX5_CQ_DOORBELL",
        cq_db_req_not: db::CQ_DB_REQ_NOT => "MLX5_CQ_DB_REQ_NOT",
        cq_db_req_not_sol: db::CQ_DB_REQ_NOT_SOL => "MLX5_CQ_DB_REQ_NOT_SOL",

        // UMR (mlx5::umr)
        umr_ctrl_flag_inline: u::UMR_CTRL_FLAG_INLINE => "MLX5_WQE_UMR_CTRL_FLAG_INLINE",
        umr_ctrl_flag_check_free: u::UMR_CTRL_FLAG_CHECK_FREE => "MLX5_WQE_UMR_CTRL_FLAG_CHECK_FREE",
        umr_ctrl_flag_translation_offset: u::UMR_CTRL_FLAG_TRANSLATION_OFFSET => "MLX5_WQE_UMR_CTRL_FLAG_TRNSLATION_OFFSET",
        umr_ctrl_flag_check_qpn: u::UMR_CTRL_FLAG_CHECK_QPN => "MLX5_WQE_UMR_CTRL_FLAG_CHECK_QPN",
        mkey_mask_len: u::MKEY_MASK_LEN => "MLX5_WQE_UMR_CTRL_MKEY_MASK_LEN",
        mkey_mask_start_addr: u::MKEY_MASK_START_ADDR => "MLX5_WQE_UMR_CTRL_MKEY_MASK_START_ADDR",
        mkey_mask_sig_err: u::MKEY_MASK_SIG_ERR => "MLX5_WQE_UMR_CTRL_MKEY_MASK_SIG_ERR",
        mkey_mask_bsf_enable: u::MKEY_MASK_BSF_ENABLE => "MLX5_WQE_UMR_CTRL_MKEY_MASK_BSF_ENABLE",
        mkey_mask_mkey: u::MKEY_MASK_MKEY => "MLX5_WQE_UMR_CTRL_MKEY_MASK_MKEY",
        mkey_mask_qpn: u::MKEY_MASK_QPN => "MLX5_WQE_UMR_CTRL_MKEY_MASK_QPN",
        mkey_mask_access_local_write: u::MKEY_MASK_ACCESS_LOCAL_WRITE => "MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_LOCAL_WRITE",
        mkey_mask_access_remote_read: u::MKEY_MASK_ACCESS_REMOTE_READ => "MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_READ",
        mkey_mask_access_remote_write: u::MKEY_MASK_ACCESS_REMOTE_WRITE => "MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_WRITE",
        mkey_mask_access_atomic: u::MKEY_MASK_ACCESS_ATOMIC => "MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_ATOMIC",
        mkey_mask_free: u::MKEY_MASK_FREE => "MLX5_WQE_UMR_CTRL_MKEY_MASK_FREE",
        mkey_context_free: u::MKEY_CONTEXT_FREE => "MLX5_WQE_MKEY_CONTEXT_FREE",
        mkey_access_atomic: u::MKEY_ACCESS_ATOMIC => "MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_ATOMIC",
        mkey_access_remote_write: u::MKEY_ACCESS_REMOTE_WRITE => "MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_WRITE",
        mkey_access_remote_read: u::MKEY_ACCESS_REMOTE_READ => "MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_READ",
        mkey_access_local_write: u::MKEY_ACCESS_LOCAL_WRITE => "MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_LOCAL_WRITE",
        mkey_access_local_read: u::MKEY_ACCESS_LOCAL_READ => "MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_LOCAL_READ",

        // verbs work-completion statuses (mlx5::WcStatus)
        wc_success: WcStatus::Success as u32 => "IBV_WC_SUCCESS",
        wc_loc_len_err: WcStatus::LocLenErr as u32 => "IBV_WC_LOC_LEN_ERR",
        wc_loc_qp_op_err: WcStatus::LocQpOpErr as u32 => "IBV_WC_LOC_QP_OP_ERR",
        wc_loc_eec_op_err: WcStatus::LocEecOpErr as u32 => "IBV_WC_LOC_EEC_OP_ERR",
        wc_loc_prot_err: WcStatus::LocProtErr as u32 => "IBV_WC_LOC_PROT_ERR",
        wc_wr_flush_err: WcStatus::WrFlushErr as u32 => "IBV_WC_WR_FLUSH_ERR",
        wc_mw_bind_err: WcStatus::MwBindErr as u32 => "IBV_WC_MW_BIND_ERR",
        wc_bad_resp_err: WcStatus::BadRespErr as u32 => "IBV_WC_BAD_RESP_ERR",
        wc_loc_access_err: WcStatus::LocAccessErr as u32 => "IBV_WC_LOC_ACCESS_ERR",
        wc_rem_inv_req_err: WcStatus::RemInvReqErr as u32 => "IBV_WC_REM_INV_REQ_ERR",
        wc_rem_access_err: WcStatus::RemAccessErr as u32 => "IBV_WC_REM_ACCESS_ERR",
        wc_rem_op_err: WcStatus::RemOpErr as u32 => "IBV_WC_REM_OP_ERR",
        wc_retry_exc_err: WcStatus::RetryExcErr as u32 => "IBV_WC_RETRY_EXC_ERR",
        wc_rnr_retry_exc_err: WcStatus::RnrRetryExcErr as u32 => "IBV_WC_RNR_RETRY_EXC_ERR",
        wc_loc_rdd_viol_err: WcStatus::LocRddViolErr as u32 => "IBV_WC_LOC_RDD_VIOL_ERR",
        wc_rem_inv_rd_req_err: WcStatus::RemInvRdReqErr as u32 => "IBV_WC_REM_INV_RD_REQ_ERR",
        wc_rem_abort_err: WcStatus::RemAbortErr as u32 => "IBV_WC_REM_ABORT_ERR",
        wc_inv_eecn_err: WcStatus::InvEecnErr as u32 => "IBV_WC_INV_EECN_ERR",
        wc_inv_eec_state_err: WcStatus::InvEecStateErr as u32 => "IBV_WC_INV_EEC_STATE_ERR",
        wc_fatal_err: WcStatus::FatalErr as u32 => "IBV_WC_FATAL_ERR",
        wc_resp_timeout_err: WcStatus::RespTimeoutErr as u32 => "IBV_WC_RESP_TIMEOUT_ERR",
        wc_general_err: WcStatus::GeneralErr as u32 => "IBV_WC_GENERAL_ERR",

        // verbs access flags (mlx5::Access)
        access_local_write: Access::LOCAL_WRITE.0 => "IBV_ACCESS_LOCAL_WRITE",
        access_remote_write: Access::REMOTE_WRITE.0 => "IBV_ACCESS_REMOTE_WRITE",
        access_remote_read: Access::REMOTE_READ.0 => "IBV_ACCESS_REMOTE_READ",
        access_remote_atomic: Access::REMOTE_ATOMIC.0 => "IBV_ACCESS_REMOTE_ATOMIC",
        access_mw_bind: Access::MW_BIND.0 => "IBV_ACCESS_MW_BIND",
        access_zero_based: Access::ZERO_BASED.0 => "IBV_ACCESS_ZERO_BASED",
        access_on_demand: Access::ON_DEMAND.0 => "IBV_ACCESS_ON_DEMAND",

        // on-demand paging and prefetch (blueflame's verbs module; the flag is declared by
        // hand there: rdma-sys has no binding for it)
        advise_flag_flush: blueflame::internals::IBV_ADVISE_MR_FLAG_FLUSH => "IBV_ADVISE_MR_FLAG_FLUSH",
        odp_support: blueflame::OdpCaps::SUPPORT => "IBV_ODP_SUPPORT",
        odp_support_implicit: blueflame::OdpCaps::IMPLICIT => "IBV_ODP_SUPPORT_IMPLICIT",
        odp_rc_atomic: blueflame::OdpCaps::RC_ATOMIC => "IBV_ODP_SUPPORT_ATOMIC",
        odp_rc_basic: blueflame::OdpCaps::RC_BASIC
            => "IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ",
    }

    checks! {
        names: SPECIAL_NAMES;

        // Opcodes the crate does not implement decode to None, never to another opcode.
        opcode_tso_is_unknown(v = "MLX5_OPCODE_TSO") {
            assert_eq!(Opcode::from_u8(v as u8), None);
        }
        opcode_fmr_is_unknown(v = "MLX5_OPCODE_FMR") {
            assert_eq!(Opcode::from_u8(v as u8), None);
        }
        opcode_config_cmd_is_unknown(v = "MLX5_OPCODE_CONFIG_CMD") {
            assert_eq!(Opcode::from_u8(v as u8), None);
        }
        opcode_set_psv_is_unknown(v = "MLX5_OPCODE_SET_PSV") {
            assert_eq!(Opcode::from_u8(v as u8), None);
        }
        opcode_tag_matching_is_unknown(v = "MLX5_OPCODE_TAG_MATCHING") {
            assert_eq!(Opcode::from_u8(v as u8), None);
        }
        opcode_flow_tbl_access_is_unknown(v = "MLX5_OPCODE_FLOW_TBL_ACCESS") {
            assert_eq!(Opcode::from_u8(v as u8), None);
        }
        opcode_mmo_is_unknown(v = "MLX5_OPCODE_MMO") {
            assert_eq!(Opcode::from_u8(v as u8), None);
        }
        // MLX5_CQE_NO_PACKET (striding RQ) is not mirrored: it must not alias a known opcode.
        cqe_no_packet_is_unknown(v = "MLX5_CQE_NO_PACKET") {
            assert_eq!(CqeOpcode::from_bits(v as u8), None);
        }
        // The header has no mini-CQE (rdma-core 44 declares none): a mini-CQE array fills a
        // 64-byte CQE slot, and mini-CQE 7's last byte is where `op_own` is, so an array
        // slot has no owner byte (the poller invalidates it after the session). A title's
        // session length is its `byte_cnt`.
        mini_cqe_array_overlays_a_cqe(
            size = "sizeof(struct mlx5_cqe64)",
            own = "offsetof(mlx5_cqe64, op_own)",
            cnt = "offsetof(mlx5_cqe64, byte_cnt)",
        ) {
            use mlx5::cqe::{Cqe64, MiniCqe8, MINI_CQES_PER_BLOCK};
            use zerocopy::FromBytes;
            assert_eq!((MINI_CQES_PER_BLOCK * size_of::<MiniCqe8>()) as u64, size);
            let last = (MINI_CQES_PER_BLOCK - 1) * size_of::<MiniCqe8>()
                + offset_of!(MiniCqe8, byte_cnt)
                + 3;
            assert_eq!(last as u64, own);
            let mut b = [0u8; 64];
            b[cnt as usize..cnt as usize + 4].copy_from_slice(&77u32.to_be_bytes());
            assert_eq!(Cqe64::read_from_bytes(&b).unwrap().session_len(), 77);
        }
        // SEND_WQE_BB == 1 << SEND_WQE_SHIFT on both sides.
        send_wqe_bb_is_one_shifted(bb = "MLX5_SEND_WQE_BB", shift = "MLX5_SEND_WQE_SHIFT") {
            assert_eq!(1u64 << shift, bb);
            assert_eq!(1usize << db::SEND_WQE_SHIFT, db::SEND_WQE_BB);
        }
    }

    fn c_values(prefix: &str) -> Vec<(&'static str, u64)> {
        PAIRS
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(n, _)| (*n, value(n)))
            .collect()
    }

    fn checked(prefix: &str, rust: u64) -> bool {
        PAIRS
            .iter()
            .any(|(n, f)| n.starts_with(prefix) && f() == rust)
    }

    #[test]
    fn opcode_every_variant_is_checked() {
        for op in Opcode::ALL {
            assert!(
                checked("MLX5_OPCODE_", op as u64),
                "{op:?} has no header test"
            );
        }
    }

    #[test]
    fn opcode_from_u8_decodes_header_values() {
        let vals = c_values("MLX5_OPCODE_");
        assert_eq!(vals.len(), Opcode::ALL.len());
        for (name, v) in vals {
            let op = Opcode::from_u8(v as u8).unwrap_or_else(|| panic!("{name} unknown"));
            assert_eq!(op as u64, v, "{name}");
        }
    }

    #[test]
    fn syndrome_every_variant_is_checked() {
        for s in Syndrome::ALL {
            assert!(
                checked("MLX5_CQE_SYNDROME_", s.to_u8() as u64),
                "{s:?} has no header test"
            );
        }
    }

    #[test]
    fn syndrome_from_u8_decodes_header_values() {
        let vals = c_values("MLX5_CQE_SYNDROME_");
        assert_eq!(vals.len(), Syndrome::ALL.len());
        for (name, v) in vals {
            let s = Syndrome::from_u8(v as u8);
            assert!(Syndrome::ALL.contains(&s), "{name} decodes to {s:?}");
            assert_eq!(s.to_u8() as u64, v, "{name}");
        }
    }

    #[test]
    fn wc_status_every_variant_is_checked() {
        for s in WcStatus::ALL {
            assert!(checked("IBV_WC_", s as u64), "{s:?} has no header test");
        }
    }

    #[test]
    fn wc_status_from_u32_decodes_header_values() {
        for (name, v) in c_values("IBV_WC_") {
            assert_eq!(WcStatus::from_u32(v as u32) as u64, v, "{name}");
        }
    }

    #[test]
    fn cqe_opcode_every_variant_is_checked() {
        for v in 0..16u8 {
            if let Some(op) = CqeOpcode::from_bits(v) {
                assert!(checked("MLX5_CQE_", op as u64), "{op:?} has no header test");
            }
        }
    }

    #[test]
    fn cqe_opcode_from_bits_decodes_header_values() {
        for name in [
            "MLX5_CQE_REQ",
            "MLX5_CQE_RESP_WR_IMM",
            "MLX5_CQE_RESP_SEND",
            "MLX5_CQE_RESP_SEND_IMM",
            "MLX5_CQE_RESP_SEND_INV",
            "MLX5_CQE_RESIZE_CQ",
            "MLX5_CQE_SIG_ERR",
            "MLX5_CQE_REQ_ERR",
            "MLX5_CQE_RESP_ERR",
            "MLX5_CQE_INVALID",
        ] {
            let v = value(name);
            let op = CqeOpcode::from_bits(v as u8).unwrap_or_else(|| panic!("{name} unknown"));
            assert_eq!(op as u64, v, "{name}");
        }
    }

    #[test]
    fn fm_ce_se_named_combination() {
        // A signaled, solicited, fenced WQE as rdma-core composes it from its constants.
        let c = value("MLX5_WQE_CTRL_CQ_UPDATE")
            | value("MLX5_WQE_CTRL_SOLICITED")
            | value("MLX5_WQE_CTRL_FENCE");
        assert_eq!(
            fm(Fence::SmallAndFence, CompletionMode::Always, true) as u64,
            c
        );
        assert_eq!(
            FmCeSe::from_u8(c as u8),
            Some(FmCeSe {
                fence: Fence::SmallAndFence,
                completion: CompletionMode::Always,
                solicited: true
            })
        );
    }
}

/// The mlx5dv structs `blueflame::dv` declares by hand (`mlx5dv_init_obj`'s in/out).
mod dv_layout {
    use super::*;
    use blueflame::internals::dv::ffi;

    macro_rules! dv_layout {
        ($( $rust:ty = $c:literal, $size_test:ident { $( $test:ident => $field:ident ),* $(,)? } )*) => {
            $(
                #[test]
                fn $size_test() {
                    assert_eq!(size_of::<$rust>() as u64, value(concat!("sizeof(struct ", $c, ")")));
                }
                $(
                    #[test]
                    fn $test() {
                        // SAFETY: plain C structs of integers and raw pointers: all-zero is valid.
                        let z: $rust = unsafe { std::mem::zeroed() };
                        assert_eq!(
                            offset_of!($rust, $field) as u64,
                            value(concat!("offsetof(", $c, ", ", stringify!($field), ")"))
                        );
                        assert_eq!(
                            size_of_val(&z.$field) as u64,
                            value(concat!("sizeof(", $c, ".", stringify!($field), ")"))
                        );
                    }
                )*
            )*
            pub const NAMES: &[&str] = &[
                $( concat!("sizeof(struct ", $c, ")"),
                   $( concat!("offsetof(", $c, ", ", stringify!($field), ")"),
                      concat!("sizeof(", $c, ".", stringify!($field), ")"), )* )*
                "offsetof(mlx5dv_qp, sq.wqe_cnt)", "offsetof(mlx5dv_qp, sq.stride)",
                "offsetof(mlx5dv_qp, bf.size)", "offsetof(mlx5dv_obj, cq.out)",
                "MLX5DV_OBJ_QP", "MLX5DV_OBJ_CQ", "MLX5DV_OBJ_SRQ", "MLX5DV_SRQ_MASK_SRQN",
                "sizeof(struct mlx5dv_context)",
                "offsetof(mlx5dv_context, version)", "sizeof(mlx5dv_context.version)",
                "offsetof(mlx5dv_context, flags)", "sizeof(mlx5dv_context.flags)",
                "offsetof(mlx5dv_context, comp_mask)", "sizeof(mlx5dv_context.comp_mask)",
                "offsetof(mlx5dv_context, cqe_comp_caps)", "sizeof(mlx5dv_context.cqe_comp_caps)",
                "offsetof(mlx5dv_context, dc_odp_caps)", "sizeof(mlx5dv_context.dc_odp_caps)",
                "MLX5DV_CONTEXT_MASK_DC_ODP_CAPS", "MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS",
            ];
        };
    }

    dv_layout! {
        ffi::mlx5dv_qp = "mlx5dv_qp", dv_qp_size {
            dv_qp_dbrec => dbrec, dv_qp_sq => sq, dv_qp_rq => rq, dv_qp_bf => bf,
            dv_qp_comp_mask => comp_mask, dv_qp_uar_mmap_offset => uar_mmap_offset,
            dv_qp_tirn => tirn, dv_qp_tisn => tisn, dv_qp_rqn => rqn, dv_qp_sqn => sqn,
            dv_qp_tir_icm_addr => tir_icm_addr,
        }
        ffi::mlx5dv_cq = "mlx5dv_cq", dv_cq_size {
            dv_cq_buf => buf, dv_cq_dbrec => dbrec, dv_cq_cqe_cnt => cqe_cnt,
            dv_cq_cqe_size => cqe_size, dv_cq_cq_uar => cq_uar, dv_cq_cqn => cqn,
            dv_cq_comp_mask => comp_mask,
        }
        ffi::mlx5dv_clock_info = "mlx5dv_clock_info", dv_clock_info_size {
            dv_clock_info_nsec => nsec, dv_clock_info_last_cycles => last_cycles,
            dv_clock_info_frac => frac, dv_clock_info_mult => mult,
            dv_clock_info_shift => shift, dv_clock_info_mask => mask,
        }
        ffi::mlx5dv_cqe_comp_caps = "mlx5dv_cqe_comp_caps", dv_cqe_comp_caps_size {
            dv_cqe_comp_caps_max_num => max_num,
            dv_cqe_comp_caps_supported_format => supported_format,
        }
        ffi::mlx5dv_cq_init_attr = "mlx5dv_cq_init_attr", dv_cq_init_attr_size {
            dv_cq_init_attr_comp_mask => comp_mask,
            dv_cq_init_attr_cqe_comp_res_format => cqe_comp_res_format,
            dv_cq_init_attr_flags => flags,
            dv_cq_init_attr_cqe_size => cqe_size,
        }
        ffi::mlx5dv_srq = "mlx5dv_srq", dv_srq_size {
            dv_srq_buf => buf, dv_srq_dbrec => dbrec, dv_srq_stride => stride,
            dv_srq_head => head, dv_srq_tail => tail, dv_srq_comp_mask => comp_mask,
            dv_srq_srqn => srqn,
        }
        ffi::mlx5dv_obj = "mlx5dv_obj", dv_obj_size {
            dv_obj_qp => qp, dv_obj_cq => cq, dv_obj_srq => srq, dv_obj_rwq => rwq,
            dv_obj_dm => dm, dv_obj_ah => ah, dv_obj_pd => pd,
        }
    }

    /// `blueflame::dv` declares only the head of `struct mlx5dv_context` (what
    /// `mlx5dv_query_device` writes for the CQE-compression mask) and passes a buffer of at
    /// least the whole struct's size.
    #[test]
    fn dv_context_head_and_size() {
        use std::mem::offset_of;
        // SAFETY: integers only: all-zero is valid.
        let z: ffi::mlx5dv_context = unsafe { std::mem::zeroed() };
        for (field, off, size) in [
            (
                "version",
                offset_of!(ffi::mlx5dv_context, version),
                size_of_val(&z.version),
            ),
            (
                "flags",
                offset_of!(ffi::mlx5dv_context, flags),
                size_of_val(&z.flags),
            ),
            (
                "comp_mask",
                offset_of!(ffi::mlx5dv_context, comp_mask),
                size_of_val(&z.comp_mask),
            ),
            (
                "cqe_comp_caps",
                offset_of!(ffi::mlx5dv_context, cqe_comp_caps),
                size_of_val(&z.cqe_comp_caps),
            ),
        ] {
            assert_eq!(
                off as u64,
                value(&format!("offsetof(mlx5dv_context, {field})")),
                "{field}"
            );
            assert_eq!(
                size as u64,
                value(&format!("sizeof(mlx5dv_context.{field})")),
                "{field}"
            );
        }
        assert_eq!(
            ffi::MLX5DV_CONTEXT_SIZE as u64,
            value("sizeof(struct mlx5dv_context)")
        );
        assert!(size_of::<ffi::mlx5dv_context>() <= ffi::MLX5DV_CONTEXT_SIZE);
        // `dc_odp_caps` is read at its offset (the members before it are not declared).
        assert_eq!(
            ffi::MLX5DV_CONTEXT_DC_ODP_CAPS_OFFSET as u64,
            value("offsetof(mlx5dv_context, dc_odp_caps)")
        );
        assert_eq!(4, value("sizeof(mlx5dv_context.dc_odp_caps)"));
        assert_eq!(
            ffi::MLX5DV_CONTEXT_MASK_DC_ODP_CAPS,
            value("MLX5DV_CONTEXT_MASK_DC_ODP_CAPS")
        );
        assert_eq!(
            ffi::MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS,
            value("MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS")
        );
    }

    #[test]
    fn dv_nested_fields_and_object_types() {
        use std::mem::offset_of;
        let sq = offset_of!(ffi::mlx5dv_qp, sq) as u64;
        assert_eq!(
            sq + offset_of!(ffi::mlx5dv_qp_ring, wqe_cnt) as u64,
            value("offsetof(mlx5dv_qp, sq.wqe_cnt)")
        );
        assert_eq!(
            sq + offset_of!(ffi::mlx5dv_qp_ring, stride) as u64,
            value("offsetof(mlx5dv_qp, sq.stride)")
        );
        let bf = offset_of!(ffi::mlx5dv_qp, bf) as u64;
        assert_eq!(
            bf + offset_of!(ffi::mlx5dv_qp_bf, size) as u64,
            value("offsetof(mlx5dv_qp, bf.size)")
        );
        let cq = offset_of!(ffi::mlx5dv_obj, cq) as u64;
        assert_eq!(
            cq + offset_of!(ffi::mlx5dv_obj_pair, out) as u64,
            value("offsetof(mlx5dv_obj, cq.out)")
        );
        assert_eq!(ffi::MLX5DV_OBJ_QP, value("MLX5DV_OBJ_QP"));
        assert_eq!(ffi::MLX5DV_OBJ_CQ, value("MLX5DV_OBJ_CQ"));
        assert_eq!(ffi::MLX5DV_OBJ_SRQ, value("MLX5DV_OBJ_SRQ"));
        assert_eq!(ffi::MLX5DV_SRQ_MASK_SRQN, value("MLX5DV_SRQ_MASK_SRQN"));
    }
}

/// UD and DC: the address vector, the datagram segment, the CQE's UD responder fields.
mod ud {
    use super::*;
    use mlx5::av::{Av, DatagramSeg};
    use mlx5::cqe;

    layout! {
        names: NAMES;
        Av = "mlx5_wqe_av", av_size {
            av_key => key,
            av_dqp_dct => dqp_dct,
            av_stat_rate_sl => stat_rate_sl,
            av_fl_mlid => fl_mlid,
            av_rlid => rlid,
            av_reserved0 => reserved0,
            av_rmac => rmac,
            av_tclass => tclass,
            av_hop_limit => hop_limit,
            av_grh_gid_fl => grh_gid_fl,
            av_rgid => rgid,
        }
        DatagramSeg = "mlx5_wqe_datagram_seg", datagram_seg_size {
            datagram_seg_av => av,
        }
    }

    checks! {
        names: SPECIAL_NAMES;

        // The key union: the Q_Key is its first four bytes, the DC key all eight; the crate
        // keeps the union as one Be64 with accessors for both.
        av_key_union_qkey_first_dc_key_whole(
            q_off = "offsetof(mlx5_wqe_av, key.qkey.qkey)",
            q_size = "sizeof(mlx5_wqe_av.key.qkey.qkey)",
            dc_off = "offsetof(mlx5_wqe_av, key.dc_key)",
            dc_size = "sizeof(mlx5_wqe_av.key.dc_key)",
        ) {
            assert_eq!((q_off, q_size), (0, 4));
            assert_eq!((dc_off, dc_size), (0, 8));
            let mut av = Av::default();
            av.set_qkey(0x1122_3344);
            let b = zerocopy::IntoBytes::as_bytes(&av);
            assert_eq!(b[q_off as usize..(q_off + q_size) as usize], [0x11, 0x22, 0x33, 0x44]);
            assert_eq!(av.qkey(), 0x1122_3344);
        }

        extended_ud_av(v = "MLX5_EXTENDED_UD_AV") {
            assert_eq!(mlx5::av::EXTENDED_UD_AV as u64, v);
        }

        // blueflame::dv's struct mlx5dv_ah and the object type that asks for it.
        dv_ah_layout(
            size = "sizeof(struct mlx5dv_ah)",
            av_off = "offsetof(mlx5dv_ah, av)",
            av_size = "sizeof(mlx5dv_ah.av)",
            mask_off = "offsetof(mlx5dv_ah, comp_mask)",
            mask_size = "sizeof(mlx5dv_ah.comp_mask)",
            obj = "MLX5DV_OBJ_AH",
        ) {
            use blueflame::internals::dv::ffi::{mlx5dv_ah, MLX5DV_OBJ_AH};
            let z = mlx5dv_ah { av: std::ptr::null_mut(), comp_mask: 0 };
            assert_eq!(size_of::<mlx5dv_ah>() as u64, size);
            assert_eq!(offset_of!(mlx5dv_ah, av) as u64, av_off);
            assert_eq!(size_of_val(&z.av) as u64, av_size);
            assert_eq!(offset_of!(mlx5dv_ah, comp_mask) as u64, mask_off);
            assert_eq!(size_of_val(&z.comp_mask) as u64, mask_size);
            assert_eq!(MLX5DV_OBJ_AH, obj);
        }

        // The datagram segment is three DS of the WQE.
        datagram_seg_is_three_ds(
            seg = "sizeof(struct mlx5_wqe_datagram_seg)",
            ds = "sizeof(struct mlx5_wqe_data_seg)",
        ) {
            assert_eq!(mlx5::av::DATAGRAM_SEG_DS as u64, seg / ds);
            assert_eq!(mlx5::av::AV_BYTES as u64, seg);
        }

        // The UD responder fields live in the leading union the crate keeps raw.
        cqe_ud_fields(
            ml = "offsetof(mlx5_cqe64, ml_path)",
            ml_size = "sizeof(mlx5_cqe64.ml_path)",
            slid = "offsetof(mlx5_cqe64, slid)",
            slid_size = "sizeof(mlx5_cqe64.slid)",
            fr = "offsetof(mlx5_cqe64, flags_rqpn)",
            fr_size = "sizeof(mlx5_cqe64.flags_rqpn)",
        ) {
            assert_eq!((cqe::ML_PATH_OFFSET as u64, 1), (ml, ml_size));
            assert_eq!((cqe::SLID_OFFSET as u64, 2), (slid, slid_size));
            assert_eq!((cqe::FLAGS_RQPN_OFFSET as u64, 4), (fr, fr_size));
            assert!(fr + fr_size <= value("offsetof(mlx5_cqe64, srqn_uidx)"));
        }
    }
}
#[path = "dc/header.rs"]
mod dc_header;

mod table {
    use super::*;
    use std::collections::HashSet;

    fn checked_names() -> HashSet<&'static str> {
        [
            layout::NAMES,
            layout::SPECIAL_NAMES,
            consts::NAMES,
            consts::SPECIAL_NAMES,
            dv_layout::NAMES,
            ud::NAMES,
            ud::SPECIAL_NAMES,
            dc_header::NAMES,
        ]
        .into_iter()
        .flatten()
        .copied()
        .collect()
    }

    #[test]
    fn no_orphan_entries() {
        let checked = checked_names();
        let orphans: Vec<_> = table()
            .iter()
            .filter(|(n, _)| !checked.contains(n))
            .collect();
        assert!(
            orphans.is_empty(),
            "C table entries no Rust test compares: {orphans:?}"
        );
    }

    #[test]
    fn every_checked_name_is_in_the_table() {
        let missing: Vec<_> = checked_names()
            .into_iter()
            .filter(|n| mlx5_hdrcheck::lookup(n).is_none())
            .collect();
        assert!(missing.is_empty(), "not in the C table: {missing:?}");
    }

    #[test]
    fn no_duplicate_names() {
        let mut seen = HashSet::new();
        for (n, _) in table() {
            assert!(seen.insert(*n), "{n} twice in the C table");
        }
    }

    #[test]
    fn size() {
        // Report how many values the C compiler produced.
        println!("{} values compiled from the headers", table().len());
        assert!(table().len() > 150);
    }

    #[test]
    #[should_panic(expected = "is not in the C table")]
    fn a_missing_name_fails() {
        value("MLX5_NO_SUCH_CONSTANT");
    }
}
