/*
 * The functions qp.c and srq.c call that live in other files of rdma-core (libibverbs,
 * providers/mlx5/{verbs.c,buf.c,mlx5.c}). The oracle links only qp.c and srq.c, so the
 * linker needs a definition of each; `nm -u` of the two objects lists exactly these.
 *
 * Three kinds:
 * - ibv_qp_to_qp_ex and mlx5dv_qp_ex_from_ibv_qp_ex do what libibverbs' verbs.c and
 *   providers/mlx5/verbs.c do (pointer arithmetic on the verbs_qp / mlx5_qp).
 * - The SRQ buffer functions give plain memory, as MLX5_ALLOC_TYPE_ANON does.
 * - mlx5dv_devx_qp_query and mlx5_get_cmd_status_err belong to a path the oracle never
 *   takes (querying a QP through DevX): they fail with EOPNOTSUPP and say so on stderr, so a
 *   test that reached one would fail loudly, never pass on a fake.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

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

int mlx5dv_devx_qp_query(struct ibv_qp *qp, const void *in, size_t inlen, void *out,
			 size_t outlen)
{
	(void)qp; (void)in; (void)inlen; (void)out; (void)outlen;
	oracle_unreached(__func__);
	return EOPNOTSUPP;
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

/* What providers/mlx5/verbs.c does: the mlx5dv_qp_ex lives next to the ibv_qp_ex. */
struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *qp)
{
	return &(container_of(qp, struct mlx5_qp, verbs_qp.qp_ex))->dv_qp;
}
