#include <rdma/ib_user_verbs.h>
#include <rdma/mlx5-abi.h>
