/* The oracle's C interface (oracle.c), mirrored by src/lib.rs. */
#ifndef MLX5_ORACLE_H
#define MLX5_ORACLE_H

#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>

enum {
	ORACLE_QP_RC = 0,
	ORACLE_QP_UD = 1,
	ORACLE_QP_DCI = 2,
};

struct oracle_qp;
struct oracle_srq;

/* One request of the classic API (struct ibv_send_wr, flattened): mlx5_post_send. */
struct oracle_send_wr {
	uint64_t wr_id;
	uint32_t opcode;	/* enum ibv_wr_opcode */
	uint32_t send_flags;	/* IBV_SEND_* */
	uint32_t imm_host;
	uint32_t rkey;		/* rdma / atomic rkey, or the rkey to invalidate */
	uint64_t raddr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t mw_rkey;
	uint32_t mw_type;	/* IBV_MW_TYPE_1 / _2 */
	uint32_t new_rkey;
	uint32_t mr_lkey;
	uint64_t bind_addr;
	uint64_t bind_len;
	uint32_t bind_access;
	int32_t num_sge;
	const struct ibv_sge *sgl;
	const uint8_t *av;	/* UD: the AH's 48-byte mlx5_wqe_av, or NULL */
	uint32_t remote_qpn;
	uint32_t remote_qkey;
};

struct oracle_srq_geometry {
	int max, max_gs, wqe_shift, head, tail;
	uint32_t nwqes;
	uint16_t counter;
	uint32_t dbrec;
};

/* The fields of struct ibv_ah_attr mlx5_create_ah reads, and the port it is created on. */
struct oracle_ah_attr {
	uint8_t ethernet, roce_v2, is_global, sl, src_path_bits, static_rate;
	uint16_t dlid;
	uint8_t dgid[16];
	uint32_t flow_label;
	uint8_t sgid_index, hop_limit, traffic_class;
	uint8_t rmac[6];
};

/* rdma-core's verbs.c mlx5_create_ah on a one-port context: 0 and the AH's 48-byte
 * mlx5_wqe_av, or the errno. */
int oracle_create_ah(const struct oracle_ah_attr *a, uint8_t av_out[48]);

struct oracle_qp *oracle_qp_new(int kind, uint32_t qpn, unsigned wqe_cnt, int max_inline,
				int max_gs);
void oracle_qp_free(struct oracle_qp *q);
uint8_t *oracle_qp_ring(struct oracle_qp *q);
const uint8_t *oracle_qp_bf_reg(const struct oracle_qp *q);
void oracle_qp_set_cur_post(struct oracle_qp *q, unsigned cur_post);
void oracle_qp_retire_all(struct oracle_qp *q);
unsigned oracle_qp_cur_post(const struct oracle_qp *q);
uint32_t oracle_qp_sq_dbrec(const struct oracle_qp *q);
unsigned oracle_qp_bf_offset(const struct oracle_qp *q);

/* A receive queue for the QP (mlx5_calc_rq_size's geometry, no WQE signatures) and
 * mlx5_post_recv into it. */
int oracle_qp_rq_setup(struct oracle_qp *q, unsigned wqe_cnt, int max_gs);
uint8_t *oracle_qp_rq_buf(struct oracle_qp *q);
int oracle_qp_post_recv(struct oracle_qp *q, uint64_t wr_id, const struct ibv_sge *sgl,
			int num_sge);
unsigned oracle_qp_rq_head(const struct oracle_qp *q);
uint32_t oracle_qp_rq_dbrec(const struct oracle_qp *q);

/* rdma-core's mlx5_post_send of one request (the queue emptied first): 0 or its errno. */
int oracle_post_send(struct oracle_qp *q, const struct oracle_send_wr *w);

void oracle_wr_start(struct oracle_qp *q);
int oracle_wr_complete(struct oracle_qp *q);
void oracle_wr_next(struct oracle_qp *q, uint64_t wr_id, unsigned wr_flags);
void oracle_wr_rdma_write(struct oracle_qp *q, uint32_t rkey, uint64_t raddr);
void oracle_wr_rdma_write_imm(struct oracle_qp *q, uint32_t rkey, uint64_t raddr,
			      uint32_t imm_host);
void oracle_wr_rdma_read(struct oracle_qp *q, uint32_t rkey, uint64_t raddr);
void oracle_wr_send(struct oracle_qp *q);
void oracle_wr_send_imm(struct oracle_qp *q, uint32_t imm_host);
void oracle_wr_send_inv(struct oracle_qp *q, uint32_t invalidate_rkey);
void oracle_wr_atomic_cmp_swp(struct oracle_qp *q, uint32_t rkey, uint64_t raddr,
			      uint64_t compare, uint64_t swap);
void oracle_wr_atomic_fetch_add(struct oracle_qp *q, uint32_t rkey, uint64_t raddr,
				uint64_t add);
void oracle_wr_bind_mw(struct oracle_qp *q, uint32_t mw_rkey, uint32_t new_rkey,
		       uint32_t mr_lkey, uint64_t addr, uint64_t length, unsigned access);
void oracle_wr_local_inv(struct oracle_qp *q, uint32_t invalidate_rkey);
void oracle_wr_set_sge(struct oracle_qp *q, uint32_t lkey, uint64_t addr, uint32_t length);
void oracle_wr_set_sge_list(struct oracle_qp *q, size_t num_sge, const struct ibv_sge *sgl);
void oracle_wr_set_inline_data(struct oracle_qp *q, const void *addr, size_t length);
void oracle_wr_set_inline_data_list(struct oracle_qp *q, size_t num_buf,
				    const struct ibv_data_buf *bufs);
void oracle_wr_set_ud_addr(struct oracle_qp *q, const uint8_t av[48], uint32_t remote_qpn,
			   uint32_t remote_qkey);
void oracle_wr_set_dc_addr(struct oracle_qp *q, const uint8_t av[48], uint32_t remote_dctn,
			   uint64_t remote_dc_key);

struct oracle_srq *oracle_srq_new(uint32_t max_wr, int max_gs);
void oracle_srq_free(struct oracle_srq *s);
const uint8_t *oracle_srq_buf(const struct oracle_srq *s);
size_t oracle_srq_buf_len(const struct oracle_srq *s);
void oracle_srq_geometry(const struct oracle_srq *s, struct oracle_srq_geometry *g);
int oracle_srq_post_recv(struct oracle_srq *s, uint64_t wr_id, const struct ibv_sge *sgl,
			 int num_sge);

#endif
