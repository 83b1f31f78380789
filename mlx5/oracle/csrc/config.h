/*
 * The config.h rdma-core's CMake writes from buildlib/config.h.in, reduced to what
 * providers/mlx5/{qp.c,srq.c} and the headers they include read. Written by hand because the
 * oracle builds two files of rdma-core, not rdma-core (no CMake run).
 *
 * - The compiler features are the ones CMake finds in gcc and clang (both have them).
 * - SIZEOF_LONG: x86_64 and aarch64 (LP64), the targets this workspace builds the oracle for.
 * - VERBS_IOCTL_ONLY / VERBS_WRITE_ONLY 0: rdma-core's default (both command channels); it
 *   only changes inline helpers of libibverbs that the send path never calls.
 * - No HAVE_VALGRIND_MEMCHECK_H, no LTTNG_ENABLED, no MLX5_DEBUG: rdma-core's default build
 *   (no valgrind annotations, no trace points, WQE dumps off).
 */
#ifndef ORACLE_CONFIG_H
#define ORACLE_CONFIG_H

#define HAVE_STATEMENT_EXPR 1
#define HAVE_BUILTIN_TYPES_COMPATIBLE_P 1
#define HAVE_TYPEOF 1
#define HAVE_ISBLANK 1
#define HAVE_BUILTIN_CLZ 1
#define HAVE_BUILTIN_CLZL 1
#define HAVE_FUNC_ATTRIBUTE_ALWAYS_INLINE 1

#define PACKAGE_VERSION "55.0"
#define STREAM_CLOEXEC "e"
#define RDMA_CDEV_DIR "/dev/infiniband"

#if !defined(__LP64__)
#error "the rdma-core oracle is built for LP64 targets only"
#endif
#define SIZEOF_LONG 8

#define VERBS_IOCTL_ONLY 0
#define VERBS_WRITE_ONLY 0

#endif
