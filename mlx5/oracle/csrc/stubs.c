/*
 * Functions of other rdma-core files (libibverbs, util/, providers/mlx5/{buf.c,mlx5.c}) that
 * the oracle's three rdma-core objects reach. qp.c and srq.c are small in that respect
 * (`nm -u` lists ibv_qp_to_qp_ex, mlx5_get_cmd_status_err and the SRQ buffer functions);
 * verbs.c references some 120 functions of libibverbs and the rest of the provider, but the
 * oracle only calls its mlx5_create_ah, and the test executables are linked with
 * --gc-sections (Rust's default), which drops every verbs.c function nothing reaches with its
 * references. What is left to define is here. (A build with `-C link-dead-code`, as some
 * coverage tools make, keeps them all and does not link.)
 *
 * Three kinds:
 * - ibv_qp_to_qp_ex does what libibverbs' verbs.c does (pointer arithmetic on the verbs_qp).
 * - The SRQ buffer functions give plain memory, as MLX5_ALLOC_TYPE_ANON does; the port's GID
 *   type and the next hop's MAC are what the test sets (a kernel's answers on a device).
 * - The others belong to paths the oracle never takes (querying a port whose link layer is
 *   cached, the kernel's CREATE_AH, DevX status, a random RoCE v2 source port): they say so on
 *   stderr and fail, so a test that reached one would fail loudly, never pass on a fake.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlx5.h"

static void oracle_unreached(const char *fn)
{
	fprintf(stderr, "mlx5-oracle: %s is not part of the oracle (stub reached)\n", fn);
}

struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct verbs_qp *vqp = (struct verbs_qp *)qp;

	return (vqp->comp_mask & VERBS_QP_EX) ? &vqp->qp_ex : NULL;
}

int mlx5_get_cmd_status_err(int err, void *out)
{
	(void)out;
	oracle_unreached(__func__);
	return err;
}

/* SRQ buffers (srq.c mlx5_alloc_srq_buf): plain page-aligned memory, as rdma-core's
 * MLX5_ALLOC_TYPE_ANON path gives (buf.c mlx5_alloc_buf: page-aligned, then srq.c zeroes it). */
void mlx5_get_alloc_type(struct mlx5_context *context, struct ibv_pd *pd,
			 const char *component, enum mlx5_alloc_type *alloc_type,
			 enum mlx5_alloc_type default_alloc_type)
{
	(void)context; (void)pd; (void)component; (void)default_alloc_type;
	*alloc_type = MLX5_ALLOC_TYPE_ANON;
}

int mlx5_alloc_prefered_buf(struct mlx5_context *mctx, struct mlx5_buf *buf, size_t size,
			    int page_size, enum mlx5_alloc_type alloc_type,
			    const char *component)
{
	size_t len = (size + page_size - 1) & ~((size_t)page_size - 1);

	(void)mctx; (void)component;
	if (alloc_type != MLX5_ALLOC_TYPE_ANON)
		return EOPNOTSUPP;
	buf->buf = aligned_alloc(page_size, len);
	if (!buf->buf)
		return ENOMEM;
	buf->length = len;
	buf->type = MLX5_ALLOC_TYPE_ANON;
	return 0;
}

int mlx5_free_actual_buf(struct mlx5_context *ctx, struct mlx5_buf *buf)
{
	(void)ctx;
	free(buf->buf);
	buf->buf = NULL;
	return 0;
}

/* Address handles (verbs.c mlx5_create_ah): the port's GID type and the next hop's MAC are
 * the kernel's answers on a real device; here the test sets them (oracle_ah_port). */
struct oracle_port {
	uint32_t gid_type;
	uint8_t rmac[6];
};
extern struct oracle_port oracle_port;
struct oracle_port oracle_port;

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type)
{
	(void)context; (void)port_num; (void)index;
	*type = oracle_port.gid_type;
	return 0;
}

int ibv_resolve_eth_l2_from_gid(struct ibv_context *context, struct ibv_ah_attr *attr,
				uint8_t eth_mac[ETHERNET_LL_SIZE], uint16_t *vid)
{
	(void)context; (void)attr;
	memcpy(eth_mac, oracle_port.rmac, ETHERNET_LL_SIZE);
	if (vid)
		*vid = 0;
	return 0;
}

/* libibverbs: mlx5_create_ah queries the port only when the context has no cached link layer;
 * the oracle's context has one. (The name in parentheses: verbs.h defines a macro of it.) */
int (ibv_query_port)(struct ibv_context *context, uint8_t port_num,
		   struct _compat_ibv_port_attr *port_attr)
{
	(void)context; (void)port_num; (void)port_attr;
	oracle_unreached(__func__);
	return EOPNOTSUPP;
}

/* libibverbs: the kernel's CREATE_AH, which mlx5_create_ah uses on RoCE only when the
 * context has MLX5_USER_CMDS_SUPP_UHW_CREATE_AH; the oracle's has not (the MAC then comes from
 * ibv_resolve_eth_l2_from_gid above). */
int ibv_cmd_create_ah(struct ibv_pd *pd, struct ibv_ah *ah, struct ibv_ah_attr *attr,
		      struct ib_uverbs_create_ah_resp *resp, size_t resp_size)
{
	(void)pd; (void)ah; (void)attr; (void)resp; (void)resp_size;
	oracle_unreached(__func__);
	return EOPNOTSUPP;
}

/* util/random.c: only reached for a RoCE v2 address with flow label 0 (a random UDP source
 * port); the tests give a flow label, so it is never called. */
unsigned int get_random(void)
{
	oracle_unreached(__func__);
	abort();
}
