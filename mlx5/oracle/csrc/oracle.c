/*
 * A memory-backed mlx5 QP and SRQ driven through rdma-core's own provider code.
 *
 * rdma-core's providers/mlx5/qp.c and srq.c are compiled unchanged next to this file. A QP
 * here is a `struct mlx5_qp` in plain memory, set up the way mlx5_create_qp / mlx5_calc_sq_size
 * leave it for the send path (ring start and end, wqe_cnt, max_post, max_gs, max_inline_data,
 * the doorbell record, a BlueFlame register), with its ibv_qp_ex / mlx5dv_qp_ex function
 * pointers filled by rdma-core's mlx5_qp_fill_wr_pfns. Posting then runs rdma-core's real
 * ibv_wr_* builders and setters, and ibv_wr_complete its real doorbell sequence
 * (post_send_db: doorbell record, then BlueFlame copy or 8-byte doorbell); the BlueFlame
 * "register" is plain memory too. No device, no kernel, no libibverbs.
 *
 * An SRQ is a `struct mlx5_srq` whose buffer rdma-core's own mlx5_alloc_srq_buf sizes, links
 * and zeroes (through the buffer stubs of stubs.c, which allocate plain memory), posted to
 * with rdma-core's mlx5_post_srq_recv.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "mlx5.h"
#include "wqe.h"

#include "oracle.h"

/* Room for two BlueFlame buffers (bf->offset alternates between 0 and buf_size). */
#define ORACLE_BF_SIZE 256

struct oracle_qp {
	struct mlx5_device dev;
	struct mlx5_context ctx;
	struct mlx5_cq cq;
	struct mlx5_bf bf;
	struct mlx5_qp qp;
	struct mlx5_ah ah;
	__be32 dbrec[2];
	uint8_t bf_reg[2 * ORACLE_BF_SIZE] __attribute__((aligned(64)));
	uint64_t *wrid;
	unsigned *wqe_head;
	uint32_t *wr_data;
	void *ring;
	uint64_t *rq_wrid;
};

static struct ibv_ah *oracle_ah(struct oracle_qp *q, const uint8_t av[48]);

static struct ibv_qp_ex *qpx(struct oracle_qp *q)
{
	return &q->qp.verbs_qp.qp_ex;
}

struct oracle_qp *oracle_qp_new(int kind, uint32_t qpn, unsigned wqe_cnt, int max_inline,
				int max_gs)
{
	struct ibv_qp_init_attr_ex attr = {};
	struct mlx5dv_qp_init_attr dv_attr = {};
	struct oracle_qp *q;
	struct mlx5_qp *mqp;

	if (wqe_cnt == 0 || (wqe_cnt & (wqe_cnt - 1)) != 0)
		return NULL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->ring = aligned_alloc(4096, (size_t)wqe_cnt << MLX5_SEND_WQE_SHIFT);
	q->wrid = calloc(wqe_cnt, sizeof(*q->wrid));
	q->wqe_head = calloc(wqe_cnt, sizeof(*q->wqe_head));
	q->wr_data = calloc(wqe_cnt, sizeof(*q->wr_data));
	if (!q->ring || !q->wrid || !q->wqe_head || !q->wr_data) {
		oracle_qp_free(q);
		return NULL;
	}
	memset(q->ring, 0, (size_t)wqe_cnt << MLX5_SEND_WQE_SHIFT);

	q->dev.page_size = 4096;
	q->ctx.ibv_ctx.context.device = &q->dev.verbs_dev.device;
	q->ctx.dbg_fp = stderr;
	/* BlueFlame as mlx5_init_context leaves it by default (MLX5_SHUT_UP_BF and
	 * MLX5_POST_SEND_PREFER_BF unset: get_shut_up_bf() returns 0, get_always_bf() 1). */
	q->ctx.shut_up_bf = 0;
	q->ctx.prefer_bf = 1;
	q->ctx.max_srq_recv_wr = 1 << 15;
	q->ctx.max_recv_wr = 1 << 15;

	/* A dedicated BlueFlame register (uuarn != 0, no lock), as the first QPs of a context
	 * get from mlx5_get_qp_uar. */
	q->bf.reg = q->bf_reg;
	q->bf.buf_size = ORACLE_BF_SIZE;
	q->bf.uuarn = 1;
	q->bf.need_lock = 0;

	mqp = &q->qp;
	mqp->ibv_qp = &mqp->verbs_qp.qp;
	mqp->verbs_qp.comp_mask = VERBS_QP_EX;
	mqp->verbs_qp.qp.context = &q->ctx.ibv_ctx.context;
	mqp->verbs_qp.qp.qp_num = qpn;
	mqp->verbs_qp.qp.send_cq = &q->cq.verbs_cq.cq;
	mqp->verbs_qp.qp.recv_cq = &q->cq.verbs_cq.cq;
	mqp->verbs_qp.qp.state = IBV_QPS_RTS;
	mqp->bf = &q->bf;
	mqp->db = q->dbrec;
	mqp->max_inline_data = max_inline;
	mqp->sq_signal_bits = 0; /* sq_sig_all = 0: completions as each request asks */
	mqp->fm_cache = 0;
	mqp->wq_sig = 0;
	mqp->atomics_enabled = 1;
	mqp->sq_start = q->ring;
	mqp->sq.wqe_cnt = wqe_cnt;
	mqp->sq.wqe_shift = MLX5_SEND_WQE_SHIFT;
	mqp->sq.max_post = wqe_cnt;
	mqp->sq.max_gs = max_gs;
	mqp->sq.qp_state_max_gs = max_gs;
	mqp->sq.qend = (uint8_t *)q->ring + ((size_t)wqe_cnt << MLX5_SEND_WQE_SHIFT);
	mqp->sq.wrid = q->wrid;
	mqp->sq.wqe_head = q->wqe_head;
	mqp->sq.wr_data = q->wr_data;

	attr.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	switch (kind) {
	case ORACLE_QP_RC:
		attr.qp_type = IBV_QPT_RC;
		attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV |
				      IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
				      IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				      IBV_QP_EX_WITH_RDMA_READ |
				      IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				      IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				      IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
		break;
	case ORACLE_QP_UD:
		attr.qp_type = IBV_QPT_UD;
		attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
		break;
	case ORACLE_QP_DCI:
		attr.qp_type = IBV_QPT_DRIVER;
		attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				      IBV_QP_EX_WITH_RDMA_WRITE |
				      IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				      IBV_QP_EX_WITH_RDMA_READ |
				      IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				      IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
		dv_attr.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
		dv_attr.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
		mqp->dc_type = MLX5DV_DCTYPE_DCI;
		break;
	default:
		oracle_qp_free(q);
		return NULL;
	}
	mqp->verbs_qp.qp.qp_type = attr.qp_type;
	if (mlx5_qp_fill_wr_pfns(mqp, &attr, &dv_attr) != 0) {
		oracle_qp_free(q);
		return NULL;
	}
	return q;
}

void oracle_qp_free(struct oracle_qp *q)
{
	if (!q)
		return;
	free(q->ring);
	free(q->wrid);
	free(q->wqe_head);
	free(q->wr_data);
	free(q->rq_wrid);
	free(q->qp.buf.buf);
	free(q);
}

int oracle_qp_rq_setup(struct oracle_qp *q, unsigned wqe_cnt, int max_gs)
{
	/* mlx5_calc_rq_size without WQE signatures: a stride of max_gs data segments rounded
	 * up to a power of two, max_gs then what the stride holds. */
	unsigned stride = 16;
	struct mlx5_qp *mqp = &q->qp;

	if (wqe_cnt == 0 || (wqe_cnt & (wqe_cnt - 1)) != 0 || max_gs < 1 || max_gs > 64 ||
	    mqp->buf.buf)
		return EINVAL;
	while (stride < (unsigned)max_gs * 16)
		stride <<= 1;
	mqp->buf.buf = aligned_alloc(4096, ((size_t)wqe_cnt * stride + 4095) & ~(size_t)4095);
	q->rq_wrid = calloc(wqe_cnt, sizeof(*q->rq_wrid));
	if (!mqp->buf.buf || !q->rq_wrid)
		return ENOMEM;
	memset(mqp->buf.buf, 0, (size_t)wqe_cnt * stride);
	mqp->rq.offset = 0;
	mqp->rq.wqe_cnt = wqe_cnt;
	mqp->rq.wqe_shift = __builtin_ctz(stride);
	mqp->rq.max_gs = stride / 16;
	mqp->rq.qp_state_max_gs = stride / 16;
	mqp->rq.max_post = wqe_cnt;
	mqp->rq.wrid = q->rq_wrid;
	return 0;
}

uint8_t *oracle_qp_rq_buf(struct oracle_qp *q)
{
	return q->qp.buf.buf;
}

int oracle_qp_post_recv(struct oracle_qp *q, uint64_t wr_id, const struct ibv_sge *sgl,
			int num_sge)
{
	struct ibv_recv_wr wr = {
		.wr_id = wr_id,
		.sg_list = (struct ibv_sge *)sgl,
		.num_sge = num_sge,
	};
	struct ibv_recv_wr *bad = NULL;

	/* As if every receive had completed (what polling does to rq.tail). */
	q->qp.rq.tail = q->qp.rq.head;
	/* mlx5_post_recv only reads the list. */
	return mlx5_post_recv(&q->qp.verbs_qp.qp, &wr, &bad);
}

unsigned oracle_qp_rq_head(const struct oracle_qp *q)
{
	return q->qp.rq.head;
}

uint32_t oracle_qp_rq_dbrec(const struct oracle_qp *q)
{
	return be32toh(q->dbrec[MLX5_RCV_DBR]);
}

uint8_t *oracle_qp_ring(struct oracle_qp *q)
{
	return q->ring;
}

const uint8_t *oracle_qp_bf_reg(const struct oracle_qp *q)
{
	return q->bf_reg;
}

void oracle_qp_set_cur_post(struct oracle_qp *q, unsigned cur_post)
{
	/* An empty queue whose producer index is `cur_post` (head/tail count requests, the
	 * overflow check compares their difference only). */
	q->qp.sq.cur_post = cur_post;
	q->qp.sq.head = 0;
	q->qp.sq.tail = 0;
}

void oracle_qp_retire_all(struct oracle_qp *q)
{
	/* As if every posted request had completed (what polling the CQ does to sq.tail). */
	q->qp.sq.tail = q->qp.sq.head;
}

unsigned oracle_qp_cur_post(const struct oracle_qp *q)
{
	return q->qp.sq.cur_post;
}

uint32_t oracle_qp_sq_dbrec(const struct oracle_qp *q)
{
	return be32toh(q->dbrec[MLX5_SND_DBR]);
}

unsigned oracle_qp_bf_offset(const struct oracle_qp *q)
{
	return q->bf.offset;
}

void oracle_wr_start(struct oracle_qp *q)
{
	ibv_wr_start(qpx(q));
}

int oracle_wr_complete(struct oracle_qp *q)
{
	return ibv_wr_complete(qpx(q));
}


void oracle_wr_next(struct oracle_qp *q, uint64_t wr_id, unsigned wr_flags)
{
	qpx(q)->wr_id = wr_id;
	qpx(q)->wr_flags = wr_flags;
}

void oracle_wr_rdma_write(struct oracle_qp *q, uint32_t rkey, uint64_t raddr)
{
	ibv_wr_rdma_write(qpx(q), rkey, raddr);
}

void oracle_wr_rdma_write_imm(struct oracle_qp *q, uint32_t rkey, uint64_t raddr,
			      uint32_t imm_host)
{
	/* verbs takes the immediate already big-endian (__be32). */
	ibv_wr_rdma_write_imm(qpx(q), rkey, raddr, htobe32(imm_host));
}

void oracle_wr_rdma_read(struct oracle_qp *q, uint32_t rkey, uint64_t raddr)
{
	ibv_wr_rdma_read(qpx(q), rkey, raddr);
}

void oracle_wr_send(struct oracle_qp *q)
{
	ibv_wr_send(qpx(q));
}

void oracle_wr_send_imm(struct oracle_qp *q, uint32_t imm_host)
{
	ibv_wr_send_imm(qpx(q), htobe32(imm_host));
}

void oracle_wr_send_inv(struct oracle_qp *q, uint32_t invalidate_rkey)
{
	ibv_wr_send_inv(qpx(q), invalidate_rkey);
}

void oracle_wr_atomic_cmp_swp(struct oracle_qp *q, uint32_t rkey, uint64_t raddr,
			      uint64_t compare, uint64_t swap)
{
	ibv_wr_atomic_cmp_swp(qpx(q), rkey, raddr, compare, swap);
}

void oracle_wr_atomic_fetch_add(struct oracle_qp *q, uint32_t rkey, uint64_t raddr,
				uint64_t add)
{
	ibv_wr_atomic_fetch_add(qpx(q), rkey, raddr, add);
}

void oracle_wr_bind_mw(struct oracle_qp *q, uint32_t mw_rkey, uint32_t new_rkey,
		       uint32_t mr_lkey, uint64_t addr, uint64_t length, unsigned access)
{
	struct ibv_mw mw = { .rkey = mw_rkey, .type = IBV_MW_TYPE_2 };
	struct ibv_mr mr = { .lkey = mr_lkey };
	struct ibv_mw_bind_info info = {
		.mr = &mr,
		.addr = addr,
		.length = length,
		.mw_access_flags = access,
	};

	/* The builder reads mw, mr and info before it returns. */
	ibv_wr_bind_mw(qpx(q), &mw, new_rkey, &info);
}

void oracle_wr_local_inv(struct oracle_qp *q, uint32_t invalidate_rkey)
{
	ibv_wr_local_inv(qpx(q), invalidate_rkey);
}

void oracle_wr_set_sge(struct oracle_qp *q, uint32_t lkey, uint64_t addr, uint32_t length)
{
	ibv_wr_set_sge(qpx(q), lkey, addr, length);
}

void oracle_wr_set_sge_list(struct oracle_qp *q, size_t num_sge, const struct ibv_sge *sgl)
{
	ibv_wr_set_sge_list(qpx(q), num_sge, sgl);
}

void oracle_wr_set_inline_data(struct oracle_qp *q, const void *addr, size_t length)
{
	/* verbs' prototype takes a non-const pointer; rdma-core only reads it (memcpy source). */
	ibv_wr_set_inline_data(qpx(q), (void *)addr, length);
}

void oracle_wr_set_inline_data_list(struct oracle_qp *q, size_t num_buf,
				    const struct ibv_data_buf *bufs)
{
	ibv_wr_set_inline_data_list(qpx(q), num_buf, bufs);
}

int oracle_post_send(struct oracle_qp *q, const struct oracle_send_wr *w)
{
	struct ibv_mw mw = { .rkey = w->mw_rkey, .type = w->mw_type };
	struct ibv_mr mr = { .lkey = w->mr_lkey };
	struct ibv_send_wr wr = {
		.wr_id = w->wr_id,
		.sg_list = (struct ibv_sge *)w->sgl,
		.num_sge = w->num_sge,
		.opcode = w->opcode,
		.send_flags = w->send_flags,
		.imm_data = htobe32(w->imm_host),
	};
	struct ibv_send_wr *bad = NULL;

	switch (w->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		wr.wr.rdma.remote_addr = w->raddr;
		wr.wr.rdma.rkey = w->rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		wr.wr.atomic.remote_addr = w->raddr;
		wr.wr.atomic.rkey = w->rkey;
		wr.wr.atomic.compare_add = w->compare_add;
		wr.wr.atomic.swap = w->swap;
		break;
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_LOCAL_INV:
		wr.invalidate_rkey = w->rkey;
		break;
	case IBV_WR_BIND_MW:
		wr.bind_mw.mw = &mw;
		wr.bind_mw.rkey = w->new_rkey;
		wr.bind_mw.bind_info.mr = &mr;
		wr.bind_mw.bind_info.addr = w->bind_addr;
		wr.bind_mw.bind_info.length = w->bind_len;
		wr.bind_mw.bind_info.mw_access_flags = w->bind_access;
		break;
	default:
		break;
	}
	if (w->av) {
		wr.wr.ud.ah = oracle_ah(q, w->av);
		wr.wr.ud.remote_qpn = w->remote_qpn;
		wr.wr.ud.remote_qkey = w->remote_qkey;
	}
	/* As if every earlier request had completed. mlx5_post_send reads wr, the list and
	 * (inline) the bytes the list points at, and writes the ring. */
	q->qp.sq.tail = q->qp.sq.head;
	return mlx5_post_send(&q->qp.verbs_qp.qp, &wr, &bad);
}

static struct ibv_ah *oracle_ah(struct oracle_qp *q, const uint8_t av[48])
{
	/* An address handle as mlx5_create_ah leaves it: the 48-byte mlx5_wqe_av the datagram
	 * segment copies. The AV bytes come from the caller. */
	memcpy(&q->ah.av, av, sizeof(q->ah.av));
	q->ah.ibv_ah.context = &q->ctx.ibv_ctx.context;
	return &q->ah.ibv_ah;
}

void oracle_wr_set_ud_addr(struct oracle_qp *q, const uint8_t av[48], uint32_t remote_qpn,
			   uint32_t remote_qkey)
{
	ibv_wr_set_ud_addr(qpx(q), oracle_ah(q, av), remote_qpn, remote_qkey);
}

void oracle_wr_set_dc_addr(struct oracle_qp *q, const uint8_t av[48], uint32_t remote_dctn,
			   uint64_t remote_dc_key)
{
	struct mlx5dv_qp_ex *dv = mlx5dv_qp_ex_from_ibv_qp_ex(qpx(q));

	mlx5dv_wr_set_dc_addr(dv, oracle_ah(q, av), remote_dctn, remote_dc_key);
}

/* ---- Address handles ---- */

struct oracle_port {
	uint32_t gid_type;
	uint8_t rmac[6];
};
extern struct oracle_port oracle_port;

int oracle_create_ah(const struct oracle_ah_attr *a, uint8_t av_out[48])
{
	struct mlx5_device dev = {};
	struct mlx5_context *ctx = calloc(1, sizeof(*ctx));
	struct ibv_pd pd = {};
	struct ibv_ah_attr attr = {};
	struct ibv_ah *ah;

	if (!ctx)
		return ENOMEM;
	dev.page_size = 4096;
	ctx->ibv_ctx.context.device = &dev.verbs_dev.device;
	ctx->dbg_fp = stderr;
	/* One port whose link layer mlx5_query_port cached at context creation; no
	 * MLX5_USER_CMDS_SUPP_UHW_CREATE_AH, so the MAC comes from ibv_resolve_eth_l2_from_gid. */
	ctx->num_ports = 1;
	ctx->cached_link_layer[0] = a->ethernet ? IBV_LINK_LAYER_ETHERNET :
						   IBV_LINK_LAYER_INFINIBAND;
	ctx->cached_port_flags[0] = 0;
	ctx->cmds_supp_uhw = 0;
	oracle_port.gid_type = a->roce_v2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 :
					    IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
	memcpy(oracle_port.rmac, a->rmac, 6);
	pd.context = &ctx->ibv_ctx.context;

	attr.dlid = a->dlid;
	attr.sl = a->sl;
	attr.src_path_bits = a->src_path_bits;
	attr.static_rate = a->static_rate;
	attr.is_global = a->is_global;
	attr.port_num = 1;
	memcpy(attr.grh.dgid.raw, a->dgid, 16);
	attr.grh.flow_label = a->flow_label;
	attr.grh.sgid_index = a->sgid_index;
	attr.grh.hop_limit = a->hop_limit;
	attr.grh.traffic_class = a->traffic_class;

	ah = mlx5_create_ah(&pd, &attr);
	if (!ah) {
		int err = errno ? errno : EINVAL;

		free(ctx);
		return err;
	}
	memcpy(av_out, &to_mah(ah)->av, 48);
	free(to_mah(ah));
	free(ctx);
	return 0;
}

/* ---- SRQ ---- */

struct oracle_srq {
	struct mlx5_device dev;
	struct mlx5_context ctx;
	struct mlx5_srq srq;
	__be32 dbrec[2];
};

struct oracle_srq *oracle_srq_new(uint32_t max_wr, int max_gs)
{
	struct oracle_srq *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->dev.page_size = 4096;
	s->ctx.ibv_ctx.context.device = &s->dev.verbs_dev.device;
	s->ctx.dbg_fp = stderr;
	s->ctx.max_srq_recv_wr = 1 << 15;
	s->ctx.max_recv_wr = 1 << 15;
	s->srq.max_gs = max_gs;
	s->srq.db = s->dbrec;
	s->srq.vsrq.srq.context = &s->ctx.ibv_ctx.context;
	/* mlx5_create_srq's own sizing and free-list set-up. */
	if (mlx5_alloc_srq_buf(&s->ctx.ibv_ctx.context, &s->srq, max_wr, NULL) != 0) {
		free(s);
		return NULL;
	}
	return s;
}

void oracle_srq_free(struct oracle_srq *s)
{
	if (!s)
		return;
	free(s->srq.wrid);
	free(s->srq.free_wqe_bitmap);
	free(s->srq.buf.buf);
	free(s);
}

const uint8_t *oracle_srq_buf(const struct oracle_srq *s)
{
	return s->srq.buf.buf;
}

size_t oracle_srq_buf_len(const struct oracle_srq *s)
{
	return (size_t)s->srq.max << s->srq.wqe_shift;
}

void oracle_srq_geometry(const struct oracle_srq *s, struct oracle_srq_geometry *g)
{
	g->max = s->srq.max;
	g->max_gs = s->srq.max_gs;
	g->wqe_shift = s->srq.wqe_shift;
	g->head = s->srq.head;
	g->tail = s->srq.tail;
	g->nwqes = s->srq.nwqes;
	g->counter = s->srq.counter;
	g->dbrec = be32toh(s->dbrec[0]);
}

int oracle_srq_post_recv(struct oracle_srq *s, uint64_t wr_id, const struct ibv_sge *sgl,
			 int num_sge)
{
	struct ibv_recv_wr wr = {
		.wr_id = wr_id,
		.sg_list = (struct ibv_sge *)sgl,
		.num_sge = num_sge,
	};
	struct ibv_recv_wr *bad = NULL;

	/* mlx5_post_srq_recv only reads the list. */
	return mlx5_post_srq_recv(&s->srq.vsrq.srq, &wr, &bad);
}
