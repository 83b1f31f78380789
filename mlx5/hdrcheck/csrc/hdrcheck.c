/*
 * Values compiled from rdma-core's installed headers, for the Rust tests of the `mlx5` crate.
 *
 * Nothing here is typed by hand: every number in the table below is produced by the C
 * compiler from <infiniband/mlx5dv.h> and <infiniband/verbs.h> (sizeof, offsetof, enum
 * constants), and the byte writers are rdma-core's own static inline helpers, called
 * unchanged. The only logic of our own is the syndrome -> status switch at the end, which is
 * rdma-core's providers/mlx5/cq.c mlx5_handle_error_cqe written with the headers' names.
 */
#include <endian.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

struct hdrcheck_entry {
	const char *name;
	uint64_t value;
};

/* sizeof a whole struct: "sizeof(struct mlx5_wqe_ctrl_seg)" */
#define HC_SIZEOF(s) { "sizeof(struct " #s ")", (uint64_t)sizeof(struct s) }
/* offset and size of a member: "offsetof(s, f)" and "sizeof(s.f)" */
#define HC_FIELD(s, f)                                                   \
	{ "offsetof(" #s ", " #f ")", (uint64_t)offsetof(struct s, f) }, \
	{ "sizeof(" #s "." #f ")", (uint64_t)sizeof(((struct s *)0)->f) }
/* only the offset (flexible / zero-length members) */
#define HC_OFFSET(s, f) { "offsetof(" #s ", " #f ")", (uint64_t)offsetof(struct s, f) }
/* an enum constant or macro; (uint64_t) of a non-negative value keeps it exact */
#define HC_CONST(c) { #c, (uint64_t)(c) }

static const struct hdrcheck_entry hdrcheck_table[] = {
	/* ---- mlx5dv objects that blueflame::dv declares by hand ---- */
	HC_SIZEOF(mlx5dv_qp),
	HC_FIELD(mlx5dv_qp, dbrec),
	HC_FIELD(mlx5dv_qp, sq),
	HC_FIELD(mlx5dv_qp, rq),
	HC_FIELD(mlx5dv_qp, bf),
	HC_FIELD(mlx5dv_qp, comp_mask),
	HC_FIELD(mlx5dv_qp, uar_mmap_offset),
	HC_FIELD(mlx5dv_qp, tirn),
	HC_FIELD(mlx5dv_qp, tisn),
	HC_FIELD(mlx5dv_qp, rqn),
	HC_FIELD(mlx5dv_qp, sqn),
	HC_FIELD(mlx5dv_qp, tir_icm_addr),
	HC_SIZEOF(mlx5dv_cq),
	HC_FIELD(mlx5dv_cq, buf),
	HC_FIELD(mlx5dv_cq, dbrec),
	HC_FIELD(mlx5dv_cq, cqe_cnt),
	HC_FIELD(mlx5dv_cq, cqe_size),
	HC_FIELD(mlx5dv_cq, cq_uar),
	HC_FIELD(mlx5dv_cq, cqn),
	HC_FIELD(mlx5dv_cq, comp_mask),
	/* CQE compression: mlx5dv_query_device's caps, mlx5dv_create_cq's attributes */
	HC_SIZEOF(mlx5dv_cqe_comp_caps),
	HC_FIELD(mlx5dv_cqe_comp_caps, max_num),
	HC_FIELD(mlx5dv_cqe_comp_caps, supported_format),
	HC_SIZEOF(mlx5dv_cq_init_attr),
	HC_FIELD(mlx5dv_cq_init_attr, comp_mask),
	HC_FIELD(mlx5dv_cq_init_attr, cqe_comp_res_format),
	HC_FIELD(mlx5dv_cq_init_attr, flags),
	HC_FIELD(mlx5dv_cq_init_attr, cqe_size),
	HC_SIZEOF(mlx5dv_clock_info),
	HC_FIELD(mlx5dv_clock_info, nsec),
	HC_FIELD(mlx5dv_clock_info, last_cycles),
	HC_FIELD(mlx5dv_clock_info, frac),
	HC_FIELD(mlx5dv_clock_info, mult),
	HC_FIELD(mlx5dv_clock_info, shift),
	HC_FIELD(mlx5dv_clock_info, mask),
	HC_CONST(MLX5DV_CONTEXT_FLAGS_REAL_TIME_TS),
	HC_SIZEOF(mlx5dv_context),
	HC_FIELD(mlx5dv_context, version),
	HC_FIELD(mlx5dv_context, flags),
	HC_FIELD(mlx5dv_context, comp_mask),
	HC_FIELD(mlx5dv_context, cqe_comp_caps),
	HC_FIELD(mlx5dv_context, dc_odp_caps),
	HC_SIZEOF(mlx5dv_obj),
	HC_FIELD(mlx5dv_obj, qp),
	HC_FIELD(mlx5dv_obj, cq),
	HC_FIELD(mlx5dv_obj, srq),
	HC_FIELD(mlx5dv_obj, rwq),
	HC_FIELD(mlx5dv_obj, dm),
	HC_FIELD(mlx5dv_obj, ah),
	HC_FIELD(mlx5dv_obj, pd),
	{ "offsetof(mlx5dv_qp, sq.wqe_cnt)", (uint64_t)offsetof(struct mlx5dv_qp, sq.wqe_cnt) },
	{ "offsetof(mlx5dv_qp, sq.stride)", (uint64_t)offsetof(struct mlx5dv_qp, sq.stride) },
	{ "offsetof(mlx5dv_qp, bf.size)", (uint64_t)offsetof(struct mlx5dv_qp, bf.size) },
	{ "offsetof(mlx5dv_obj, cq.out)", (uint64_t)offsetof(struct mlx5dv_obj, cq.out) },
	HC_CONST(MLX5DV_OBJ_QP),
	HC_CONST(MLX5DV_OBJ_CQ),
	HC_CONST(MLX5DV_OBJ_SRQ),
	HC_CONST(MLX5DV_SRQ_MASK_SRQN),
	HC_CONST(MLX5DV_CONTEXT_MASK_DC_ODP_CAPS),
	HC_SIZEOF(mlx5dv_srq),
	HC_FIELD(mlx5dv_srq, buf),
	HC_FIELD(mlx5dv_srq, dbrec),
	HC_FIELD(mlx5dv_srq, stride),
	HC_FIELD(mlx5dv_srq, head),
	HC_FIELD(mlx5dv_srq, tail),
	HC_FIELD(mlx5dv_srq, comp_mask),
	HC_FIELD(mlx5dv_srq, srqn),
	/* ---- send WQE segments ---- */
	HC_SIZEOF(mlx5_wqe_ctrl_seg),
	HC_FIELD(mlx5_wqe_ctrl_seg, opmod_idx_opcode),
	HC_FIELD(mlx5_wqe_ctrl_seg, qpn_ds),
	HC_FIELD(mlx5_wqe_ctrl_seg, signature),
	HC_FIELD(mlx5_wqe_ctrl_seg, dci_stream_channel_id),
	HC_FIELD(mlx5_wqe_ctrl_seg, fm_ce_se),
	HC_FIELD(mlx5_wqe_ctrl_seg, imm),

	HC_SIZEOF(mlx5_wqe_raddr_seg),
	HC_FIELD(mlx5_wqe_raddr_seg, raddr),
	HC_FIELD(mlx5_wqe_raddr_seg, rkey),
	HC_FIELD(mlx5_wqe_raddr_seg, reserved),

	HC_SIZEOF(mlx5_wqe_data_seg),
	HC_FIELD(mlx5_wqe_data_seg, byte_count),
	HC_FIELD(mlx5_wqe_data_seg, lkey),
	HC_FIELD(mlx5_wqe_data_seg, addr),

	HC_SIZEOF(mlx5_wqe_srq_next_seg),
	HC_FIELD(mlx5_wqe_srq_next_seg, rsvd0),
	HC_FIELD(mlx5_wqe_srq_next_seg, next_wqe_index),
	HC_FIELD(mlx5_wqe_srq_next_seg, signature),
	HC_FIELD(mlx5_wqe_srq_next_seg, rsvd1),

	HC_SIZEOF(mlx5_wqe_inl_data_seg),
	HC_FIELD(mlx5_wqe_inl_data_seg, byte_count),

	HC_SIZEOF(mlx5_wqe_atomic_seg),
	HC_FIELD(mlx5_wqe_atomic_seg, swap_add),
	HC_FIELD(mlx5_wqe_atomic_seg, compare),

	HC_SIZEOF(mlx5_wqe_umr_ctrl_seg),
	HC_FIELD(mlx5_wqe_umr_ctrl_seg, flags),
	HC_FIELD(mlx5_wqe_umr_ctrl_seg, rsvd0),
	HC_FIELD(mlx5_wqe_umr_ctrl_seg, klm_octowords),
	HC_FIELD(mlx5_wqe_umr_ctrl_seg, translation_offset),
	HC_FIELD(mlx5_wqe_umr_ctrl_seg, bsf_octowords),
	HC_FIELD(mlx5_wqe_umr_ctrl_seg, mkey_mask),
	HC_FIELD(mlx5_wqe_umr_ctrl_seg, rsvd1),

	HC_SIZEOF(mlx5_wqe_mkey_context_seg),
	HC_FIELD(mlx5_wqe_mkey_context_seg, free),
	HC_FIELD(mlx5_wqe_mkey_context_seg, reserved1),
	HC_FIELD(mlx5_wqe_mkey_context_seg, access_flags),
	HC_FIELD(mlx5_wqe_mkey_context_seg, sf),
	HC_FIELD(mlx5_wqe_mkey_context_seg, qpn_mkey),
	HC_FIELD(mlx5_wqe_mkey_context_seg, reserved2),
	HC_FIELD(mlx5_wqe_mkey_context_seg, flags_pd),
	HC_FIELD(mlx5_wqe_mkey_context_seg, start_addr),
	HC_FIELD(mlx5_wqe_mkey_context_seg, len),
	HC_FIELD(mlx5_wqe_mkey_context_seg, bsf_octword_size),
	HC_FIELD(mlx5_wqe_mkey_context_seg, reserved3),
	HC_FIELD(mlx5_wqe_mkey_context_seg, translations_octword_size),
	HC_FIELD(mlx5_wqe_mkey_context_seg, reserved4),
	HC_FIELD(mlx5_wqe_mkey_context_seg, log_page_size),
	HC_FIELD(mlx5_wqe_mkey_context_seg, reserved),
	HC_OFFSET(mlx5_wqe_mkey_context_seg, inseg),

	HC_SIZEOF(mlx5_wqe_umr_klm_seg),
	HC_FIELD(mlx5_wqe_umr_klm_seg, byte_count),
	HC_FIELD(mlx5_wqe_umr_klm_seg, mkey),
	HC_FIELD(mlx5_wqe_umr_klm_seg, address),

	/* ---- UD / DC: the address vector and the datagram segment ---- */
	HC_SIZEOF(mlx5_wqe_av),
	HC_FIELD(mlx5_wqe_av, key),
	HC_FIELD(mlx5_wqe_av, dqp_dct),
	HC_FIELD(mlx5_wqe_av, stat_rate_sl),
	HC_FIELD(mlx5_wqe_av, fl_mlid),
	HC_FIELD(mlx5_wqe_av, rlid),
	HC_FIELD(mlx5_wqe_av, reserved0),
	HC_FIELD(mlx5_wqe_av, rmac),
	HC_FIELD(mlx5_wqe_av, tclass),
	HC_FIELD(mlx5_wqe_av, hop_limit),
	HC_FIELD(mlx5_wqe_av, grh_gid_fl),
	HC_FIELD(mlx5_wqe_av, rgid),
	{ "offsetof(mlx5_wqe_av, key.qkey.qkey)", (uint64_t)offsetof(struct mlx5_wqe_av, key.qkey.qkey) },
	{ "sizeof(mlx5_wqe_av.key.qkey.qkey)", (uint64_t)sizeof(((struct mlx5_wqe_av *)0)->key.qkey.qkey) },
	{ "offsetof(mlx5_wqe_av, key.dc_key)", (uint64_t)offsetof(struct mlx5_wqe_av, key.dc_key) },
	{ "sizeof(mlx5_wqe_av.key.dc_key)", (uint64_t)sizeof(((struct mlx5_wqe_av *)0)->key.dc_key) },
	HC_SIZEOF(mlx5_wqe_datagram_seg),
	HC_FIELD(mlx5_wqe_datagram_seg, av),
	HC_CONST(MLX5_EXTENDED_UD_AV),
	HC_SIZEOF(mlx5dv_ah),
	HC_FIELD(mlx5dv_ah, av),
	HC_FIELD(mlx5dv_ah, comp_mask),
	HC_CONST(MLX5DV_OBJ_AH),

	/* ---- completion entries ---- */
	HC_SIZEOF(mlx5_cqe64),
	HC_FIELD(mlx5_cqe64, ml_path),
	HC_FIELD(mlx5_cqe64, slid),
	HC_FIELD(mlx5_cqe64, flags_rqpn),
	HC_FIELD(mlx5_cqe64, srqn_uidx),
	HC_FIELD(mlx5_cqe64, imm_inval_pkey),
	HC_FIELD(mlx5_cqe64, app),
	HC_FIELD(mlx5_cqe64, app_op),
	HC_FIELD(mlx5_cqe64, app_info),
	HC_FIELD(mlx5_cqe64, byte_cnt),
	HC_FIELD(mlx5_cqe64, timestamp),
	HC_FIELD(mlx5_cqe64, sop_drop_qpn),
	HC_FIELD(mlx5_cqe64, wqe_counter),
	HC_FIELD(mlx5_cqe64, signature),
	HC_FIELD(mlx5_cqe64, op_own),

	HC_SIZEOF(mlx5_err_cqe),
	HC_FIELD(mlx5_err_cqe, rsvd0),
	HC_FIELD(mlx5_err_cqe, srqn),
	HC_FIELD(mlx5_err_cqe, rsvd1),
	HC_FIELD(mlx5_err_cqe, vendor_err_synd),
	HC_FIELD(mlx5_err_cqe, syndrome),
	HC_FIELD(mlx5_err_cqe, s_wqe_opcode_qpn),
	HC_FIELD(mlx5_err_cqe, wqe_counter),
	HC_FIELD(mlx5_err_cqe, signature),
	HC_FIELD(mlx5_err_cqe, op_own),

	/* ---- send opcodes ---- */
	HC_CONST(MLX5_OPCODE_NOP),
	HC_CONST(MLX5_OPCODE_SEND_INVAL),
	HC_CONST(MLX5_OPCODE_RDMA_WRITE),
	HC_CONST(MLX5_OPCODE_RDMA_WRITE_IMM),
	HC_CONST(MLX5_OPCODE_SEND),
	HC_CONST(MLX5_OPCODE_SEND_IMM),
	HC_CONST(MLX5_OPCODE_RDMA_READ),
	HC_CONST(MLX5_OPCODE_ATOMIC_CS),
	HC_CONST(MLX5_OPCODE_ATOMIC_FA),
	HC_CONST(MLX5_OPCODE_ATOMIC_MASKED_CS),
	HC_CONST(MLX5_OPCODE_ATOMIC_MASKED_FA),
	HC_CONST(MLX5_OPCODE_LOCAL_INVAL),
	HC_CONST(MLX5_OPCODE_UMR),
	/* opcodes the crate does not implement: it must not mistake them for others */
	HC_CONST(MLX5_OPCODE_TSO),
	HC_CONST(MLX5_OPCODE_FMR),
	HC_CONST(MLX5_OPCODE_CONFIG_CMD),
	HC_CONST(MLX5_OPCODE_SET_PSV),
	HC_CONST(MLX5_OPCODE_TAG_MATCHING),
	HC_CONST(MLX5_OPCODE_FLOW_TBL_ACCESS),
	HC_CONST(MLX5_OPCODE_MMO),

	/* ---- error syndromes ---- */
	HC_CONST(MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_LOCAL_PROT_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_WR_FLUSH_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_MW_BIND_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_BAD_RESP_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_REMOTE_OP_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR),
	HC_CONST(MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR),

	/* ---- CQE opcodes, owner, format ---- */
	HC_CONST(MLX5_CQE_OWNER_MASK),
	HC_CONST(MLX5_CQE_REQ),
	HC_CONST(MLX5_CQE_RESP_WR_IMM),
	HC_CONST(MLX5_CQE_RESP_SEND),
	HC_CONST(MLX5_CQE_RESP_SEND_IMM),
	HC_CONST(MLX5_CQE_RESP_SEND_INV),
	HC_CONST(MLX5_CQE_RESIZE_CQ),
	HC_CONST(MLX5_CQE_NO_PACKET),
	HC_CONST(MLX5_CQE_SIG_ERR),
	HC_CONST(MLX5_CQE_REQ_ERR),
	HC_CONST(MLX5_CQE_RESP_ERR),
	HC_CONST(MLX5_CQE_INVALID),
	HC_CONST(MLX5_INLINE_SCATTER_32),
	HC_CONST(MLX5_INLINE_SCATTER_64),
	HC_CONST(MLX5DV_CQE_RES_FORMAT_HASH),
	HC_CONST(MLX5DV_CQE_RES_FORMAT_CSUM),
	HC_CONST(MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX),
	HC_CONST(MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE),
	HC_CONST(MLX5DV_CONTEXT_MASK_CQE_COMPRESION),
	HC_CONST(MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP),

	/* ---- control segment bits, blocks, inline, receive ---- */
	HC_CONST(MLX5_WQE_CTRL_CQ_UPDATE),
	HC_CONST(MLX5_WQE_CTRL_SOLICITED),
	HC_CONST(MLX5_WQE_CTRL_FENCE),
	HC_CONST(MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE),
	HC_CONST(MLX5_SEND_WQE_BB),
	HC_CONST(MLX5_SEND_WQE_SHIFT),
	HC_CONST(MLX5_INLINE_SEG),
	HC_CONST(MLX5_INVALID_LKEY),

	/* ---- doorbells ---- */
	HC_CONST(MLX5_RCV_DBR),
	HC_CONST(MLX5_SND_DBR),
	HC_CONST(MLX5_CQ_DOORBELL),
	HC_CONST(MLX5_CQ_DB_REQ_NOT),
	HC_CONST(MLX5_CQ_DB_REQ_NOT_SOL),

	/* ---- UMR (memory-window bind) ---- */
	HC_CONST(MLX5_WQE_UMR_CTRL_FLAG_INLINE),
	HC_CONST(MLX5_WQE_UMR_CTRL_FLAG_CHECK_FREE),
	HC_CONST(MLX5_WQE_UMR_CTRL_FLAG_TRNSLATION_OFFSET),
	HC_CONST(MLX5_WQE_UMR_CTRL_FLAG_CHECK_QPN),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_LEN),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_START_ADDR),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_SIG_ERR),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_BSF_ENABLE),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_MKEY),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_QPN),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_LOCAL_WRITE),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_READ),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_REMOTE_WRITE),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_ACCESS_ATOMIC),
	HC_CONST(MLX5_WQE_UMR_CTRL_MKEY_MASK_FREE),
	HC_CONST(MLX5_WQE_MKEY_CONTEXT_FREE),
	HC_CONST(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_ATOMIC),
	HC_CONST(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_WRITE),
	HC_CONST(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_REMOTE_READ),
	HC_CONST(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_LOCAL_WRITE),
	HC_CONST(MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_LOCAL_READ),

	/* ---- verbs: work-completion statuses ---- */
	HC_CONST(IBV_WC_SUCCESS),
	HC_CONST(IBV_WC_LOC_LEN_ERR),
	HC_CONST(IBV_WC_LOC_QP_OP_ERR),
	HC_CONST(IBV_WC_LOC_EEC_OP_ERR),
	HC_CONST(IBV_WC_LOC_PROT_ERR),
	HC_CONST(IBV_WC_WR_FLUSH_ERR),
	HC_CONST(IBV_WC_MW_BIND_ERR),
	HC_CONST(IBV_WC_BAD_RESP_ERR),
	HC_CONST(IBV_WC_LOC_ACCESS_ERR),
	HC_CONST(IBV_WC_REM_INV_REQ_ERR),
	HC_CONST(IBV_WC_REM_ACCESS_ERR),
	HC_CONST(IBV_WC_REM_OP_ERR),
	HC_CONST(IBV_WC_RETRY_EXC_ERR),
	HC_CONST(IBV_WC_RNR_RETRY_EXC_ERR),
	HC_CONST(IBV_WC_LOC_RDD_VIOL_ERR),
	HC_CONST(IBV_WC_REM_INV_RD_REQ_ERR),
	HC_CONST(IBV_WC_REM_ABORT_ERR),
	HC_CONST(IBV_WC_INV_EECN_ERR),
	HC_CONST(IBV_WC_INV_EEC_STATE_ERR),
	HC_CONST(IBV_WC_FATAL_ERR),
	HC_CONST(IBV_WC_RESP_TIMEOUT_ERR),
	HC_CONST(IBV_WC_GENERAL_ERR),

	/* ---- verbs: access flags ---- */
	HC_CONST(IBV_ACCESS_LOCAL_WRITE),
	HC_CONST(IBV_ACCESS_REMOTE_WRITE),
	HC_CONST(IBV_ACCESS_REMOTE_READ),
	HC_CONST(IBV_ACCESS_REMOTE_ATOMIC),
	HC_CONST(IBV_ACCESS_MW_BIND),
	HC_CONST(IBV_ACCESS_ZERO_BASED),
	HC_CONST(IBV_ACCESS_ON_DEMAND),
	HC_CONST(IBV_ADVISE_MR_FLAG_FLUSH),
	HC_CONST(IBV_ODP_SUPPORT),
	HC_CONST(IBV_ODP_SUPPORT_IMPLICIT),
	HC_CONST(IBV_ODP_SUPPORT_ATOMIC),
	HC_CONST(IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ),
	/* ---- DC: the address segment's DC fields (mlx5::dc) and mlx5dv_create_qp's DC
	 * attributes (blueflame::dv::dc). Names start with "dc " where the UD side checks the
	 * same struct under its own names. ---- */
	{ "dc sizeof(struct mlx5_wqe_av)", (uint64_t)sizeof(struct mlx5_wqe_av) },
	{ "dc sizeof(struct mlx5_wqe_datagram_seg)", (uint64_t)sizeof(struct mlx5_wqe_datagram_seg) },
	{ "dc offsetof(mlx5_wqe_av, key.dc_key)", (uint64_t)offsetof(struct mlx5_wqe_av, key.dc_key) },
	{ "dc sizeof(mlx5_wqe_av.key.dc_key)", (uint64_t)sizeof(((struct mlx5_wqe_av *)0)->key.dc_key) },
	{ "dc offsetof(mlx5_wqe_av, dqp_dct)", (uint64_t)offsetof(struct mlx5_wqe_av, dqp_dct) },
	{ "dc sizeof(mlx5_wqe_av.dqp_dct)", (uint64_t)sizeof(((struct mlx5_wqe_av *)0)->dqp_dct) },
	{ "dc MLX5_EXTENDED_UD_AV", (uint64_t)MLX5_EXTENDED_UD_AV },
	HC_SIZEOF(mlx5dv_dc_init_attr),
	HC_FIELD(mlx5dv_dc_init_attr, dc_type),
	HC_FIELD(mlx5dv_dc_init_attr, dct_access_key),
	HC_SIZEOF(mlx5dv_qp_init_attr),
	HC_FIELD(mlx5dv_qp_init_attr, comp_mask),
	HC_FIELD(mlx5dv_qp_init_attr, create_flags),
	HC_FIELD(mlx5dv_qp_init_attr, dc_init_attr),
	HC_FIELD(mlx5dv_qp_init_attr, send_ops_flags),
	HC_CONST(MLX5DV_QP_INIT_ATTR_MASK_DC),
	HC_CONST(MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS),
	HC_CONST(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE),
	HC_CONST(MLX5DV_DCTYPE_DCT),
	HC_CONST(MLX5DV_DCTYPE_DCI),
	HC_CONST(IBV_QPT_DRIVER),
	HC_CONST(IBV_QP_INIT_ATTR_PD),
};

/* The table and its length. */
const struct hdrcheck_entry *hdrcheck_entries(size_t *len)
{
	*len = sizeof(hdrcheck_table) / sizeof(hdrcheck_table[0]);
	return hdrcheck_table;
}

/* ---- rdma-core's own inline helpers, called unchanged ---- */

/* mlx5dv_set_ctrl_seg into out[16]. `imm` is stored as given (raw), as rdma-core does. */
void hdrcheck_set_ctrl_seg(uint8_t *out, uint16_t pi, uint8_t opcode, uint8_t opmod,
			   uint32_t qp_num, uint8_t fm_ce_se, uint8_t ds, uint8_t signature,
			   uint32_t imm)
{
	struct mlx5_wqe_ctrl_seg seg;

	/* the helper leaves dci_stream_channel_id alone: start from zero as the Rust side does */
	memset(&seg, 0, sizeof(seg));
	mlx5dv_set_ctrl_seg(&seg, pi, opcode, opmod, qp_num, fm_ce_se, ds, signature, imm);
	memcpy(out, &seg, sizeof(seg));
}

/* mlx5dv_set_data_seg into out[16]. */
void hdrcheck_set_data_seg(uint8_t *out, uint32_t length, uint32_t lkey, uintptr_t address)
{
	struct mlx5_wqe_data_seg seg;

	memset(&seg, 0, sizeof(seg));
	mlx5dv_set_data_seg(&seg, length, lkey, address);
	memcpy(out, &seg, sizeof(seg));
}

/* mlx5dv_get_cqe_{owner,se,format,opcode} of the 64-byte CQE in cqe[64]. */
void hdrcheck_cqe_fields(const uint8_t *cqe, uint8_t *owner, uint8_t *se, uint8_t *format,
			 uint8_t *opcode)
{
	struct mlx5_cqe64 c;

	memcpy(&c, cqe, sizeof(c));
	*owner = mlx5dv_get_cqe_owner(&c);
	*se = mlx5dv_get_cqe_se(&c);
	*format = mlx5dv_get_cqe_format(&c);
	*opcode = mlx5dv_get_cqe_opcode(&c);
}

uint64_t hdrcheck_ts_to_ns(uint64_t nsec, uint64_t last_cycles, uint64_t frac, uint32_t mult,
			   uint32_t shift, uint64_t mask, uint64_t ts)
{
	struct mlx5dv_clock_info c = {
		.nsec = nsec, .last_cycles = last_cycles, .frac = frac,
		.mult = mult, .shift = shift, .mask = mask,
	};

	return mlx5dv_ts_to_ns(&c, ts);
}

/* ---- the header's structs filled by member name (no helper exists in the header) ---- */

/* The datagram segment of a DCI WQE as rdma-core's qp.c mlx5_send_wr_set_dc_addr fills it:
 * the address handle's AV copied, the DCT number with MLX5_EXTENDED_UD_AV OR-ed into
 * dqp_dct, the DC key in key.dc_key. */
void hdrcheck_set_dc_addr(uint8_t *out, const uint8_t *ah_av, uint32_t remote_dctn,
			  uint64_t remote_dc_key)
{
	struct mlx5_wqe_datagram_seg dseg;
	struct mlx5_wqe_av av;

	memcpy(&av, ah_av, sizeof(av));
	memcpy(&dseg.av, &av, sizeof(dseg.av));
	dseg.av.dqp_dct |= htobe32(remote_dctn | MLX5_EXTENDED_UD_AV);
	dseg.av.key.dc_key = htobe64(remote_dc_key);
	memcpy(out, &dseg, sizeof(dseg));
}

/* struct mlx5_wqe_raddr_seg as rdma-core's qp.c set_raddr_seg fills it. */
void hdrcheck_set_raddr_seg(uint8_t *out, uint64_t raddr, uint32_t rkey)
{
	struct mlx5_wqe_raddr_seg seg;

	memset(&seg, 0, sizeof(seg));
	seg.raddr = htobe64(raddr);
	seg.rkey = htobe32(rkey);
	seg.reserved = 0;
	memcpy(out, &seg, sizeof(seg));
}

/* struct mlx5_wqe_datagram_seg of a UD send as rdma-core's qp.c _set_datagram_seg makes it:
 * the AH's AV (here built by member name as verbs.c mlx5_create_ah fills it on InfiniBand)
 * copied, then dqp_dct = remote_qpn | MLX5_EXTENDED_UD_AV and key.qkey.qkey = qkey. */
void hdrcheck_set_ud_datagram_seg(uint8_t *out, uint32_t remote_qpn, uint32_t qkey,
				  uint8_t stat_rate_sl, uint8_t fl_mlid, uint16_t rlid,
				  uint8_t tclass, uint8_t hop_limit, uint32_t grh_gid_fl,
				  const uint8_t *rgid, const uint8_t *rmac)
{
	struct mlx5_wqe_av av;
	struct mlx5_wqe_datagram_seg seg;

	memset(&av, 0, sizeof(av));
	av.stat_rate_sl = stat_rate_sl;
	av.fl_mlid = fl_mlid;
	av.rlid = htobe16(rlid);
	memcpy(av.rmac, rmac, sizeof(av.rmac));
	av.tclass = tclass;
	av.hop_limit = hop_limit;
	av.grh_gid_fl = htobe32(grh_gid_fl);
	memcpy(av.rgid, rgid, sizeof(av.rgid));

	memset(&seg, 0, sizeof(seg));
	memcpy(&seg.av, &av, sizeof(seg.av));
	seg.av.dqp_dct = htobe32(remote_qpn | MLX5_EXTENDED_UD_AV);
	seg.av.key.qkey.qkey = htobe32(qkey);
	memcpy(out, &seg, sizeof(seg));
}

/* mlx5dv_set_dgram_seg (the header's own helper; it writes the 64-bit key, the DC form). */
void hdrcheck_dv_set_dgram_seg(uint8_t *out, uint64_t key, uint32_t dqp_dct, uint8_t ext,
			       uint8_t stat_rate_sl, uint8_t fl_mlid, uint16_t rlid,
			       const uint8_t *rmac, uint8_t tclass, uint8_t hop_limit,
			       uint32_t grh_gid_fl, const uint8_t *rgid)
{
	struct mlx5_wqe_datagram_seg seg;
	uint8_t mac[6], gid[16];

	memcpy(mac, rmac, sizeof(mac));
	memcpy(gid, rgid, sizeof(gid));
	memset(&seg, 0, sizeof(seg));
	mlx5dv_set_dgram_seg(&seg, key, dqp_dct, ext, stat_rate_sl, fl_mlid, rlid, mac, tclass,
			     hop_limit, grh_gid_fl, gid);
	memcpy(out, &seg, sizeof(seg));
}

/* The UD responder fields of a struct mlx5_cqe64 set by member name (big-endian, as the NIC
 * writes them); cq.c handle_responder reads them back. */
void hdrcheck_set_ud_cqe(uint8_t *out, uint32_t flags_rqpn, uint16_t slid, uint8_t ml_path)
{
	struct mlx5_cqe64 c;

	memset(&c, 0, sizeof(c));
	c.flags_rqpn = htobe32(flags_rqpn);
	c.slid = htobe16(slid);
	c.ml_path = ml_path;
	memcpy(out, &c, sizeof(c));
}

/* The CQ arm request as rdma-core's cq.c mlx5_arm_cq builds it from the header's
 * MLX5_CQ_DB_REQ_NOT(_SOL): the doorbell-record arm word (big-endian) into rec[0..4], the
 * 64-bit doorbell (htobe64, as written to cq_uar + MLX5_CQ_DOORBELL) into db[0..8]. */
void hdrcheck_cq_arm(uint8_t *rec, uint8_t *db, uint32_t arm_sn, int solicited,
		     uint32_t cons_index, uint32_t cqn)
{
	uint32_t sn = arm_sn & 3;
	uint32_t ci = cons_index & 0xffffff;
	uint32_t cmd = solicited ? MLX5_CQ_DB_REQ_NOT_SOL : MLX5_CQ_DB_REQ_NOT;
	uint64_t doorbell = sn << 28 | cmd | ci;
	__be32 word = htobe32(sn << 28 | cmd | ci);
	__be64 be;

	doorbell <<= 32;
	doorbell |= cqn;
	be = htobe64(doorbell);
	memcpy(rec, &word, 4);
	memcpy(db, &be, 8);
}

/* struct mlx5_wqe_atomic_seg. */
void hdrcheck_set_atomic_seg(uint8_t *out, uint64_t swap_add, uint64_t compare)
{
	struct mlx5_wqe_atomic_seg seg;

	memset(&seg, 0, sizeof(seg));
	seg.swap_add = htobe64(swap_add);
	seg.compare = htobe64(compare);
	memcpy(out, &seg, sizeof(seg));
}

/* struct mlx5_wqe_umr_klm_seg. */
void hdrcheck_set_klm_seg(uint8_t *out, uint32_t byte_count, uint32_t mkey, uint64_t address)
{
	struct mlx5_wqe_umr_klm_seg seg;

	memset(&seg, 0, sizeof(seg));
	seg.byte_count = htobe32(byte_count);
	seg.mkey = htobe32(mkey);
	seg.address = htobe64(address);
	memcpy(out, &seg, sizeof(seg));
}

/*
 * struct mlx5_err_cqe with the members the error path reads; the header declares them as
 * plain integers but the NIC writes them big-endian (rdma-core reads them with be32toh /
 * be16toh).
 */
void hdrcheck_set_err_cqe(uint8_t *out, uint32_t srqn, uint8_t vendor_err_synd,
			  uint8_t syndrome, uint32_t s_wqe_opcode_qpn, uint16_t wqe_counter,
			  uint8_t signature, uint8_t op_own)
{
	struct mlx5_err_cqe c;

	memset(&c, 0, sizeof(c));
	c.srqn = htobe32(srqn);
	c.vendor_err_synd = vendor_err_synd;
	c.syndrome = syndrome;
	c.s_wqe_opcode_qpn = htobe32(s_wqe_opcode_qpn);
	c.wqe_counter = htobe16(wqe_counter);
	c.signature = signature;
	c.op_own = op_own;
	memcpy(out, &c, sizeof(c));
}

/*
 * rdma-core providers/mlx5/cq.c mlx5_handle_error_cqe (not exported by any header), with the
 * headers' own names on both sides of every case.
 */
uint32_t hdrcheck_wc_status_of_syndrome(uint8_t syndrome)
{
	switch (syndrome) {
	case MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR:
		return IBV_WC_LOC_LEN_ERR;
	case MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR:
		return IBV_WC_LOC_QP_OP_ERR;
	case MLX5_CQE_SYNDROME_LOCAL_PROT_ERR:
		return IBV_WC_LOC_PROT_ERR;
	case MLX5_CQE_SYNDROME_WR_FLUSH_ERR:
		return IBV_WC_WR_FLUSH_ERR;
	case MLX5_CQE_SYNDROME_MW_BIND_ERR:
		return IBV_WC_MW_BIND_ERR;
	case MLX5_CQE_SYNDROME_BAD_RESP_ERR:
		return IBV_WC_BAD_RESP_ERR;
	case MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR:
		return IBV_WC_LOC_ACCESS_ERR;
	case MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR:
		return IBV_WC_REM_INV_REQ_ERR;
	case MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR:
		return IBV_WC_REM_ACCESS_ERR;
	case MLX5_CQE_SYNDROME_REMOTE_OP_ERR:
		return IBV_WC_REM_OP_ERR;
	case MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR:
		return IBV_WC_RETRY_EXC_ERR;
	case MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR:
		return IBV_WC_RNR_RETRY_EXC_ERR;
	case MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR:
		return IBV_WC_REM_ABORT_ERR;
	default:
		return IBV_WC_GENERAL_ERR;
	}
}
