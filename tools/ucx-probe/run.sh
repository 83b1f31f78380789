#!/bin/bash
# Counts UCX 1.13.1's (Debian bookworm) user-space instructions for one 8-byte
# uct_ep_put_short and for the uct_worker_progress that reaps its send completion, on rc_mlx5
# and rc_verbs over the blueflame kernel model (a software ConnectX-6 "mlx5_0").
# Reproduces everything from scratch: packages, build, valgrind/callgrind, figures.
# Usage: tools/ucx-probe/run.sh (RELEASE=1 to add a UCX built with upstream's release flags);
# outputs in target/ucx-probe. Not a CI stage: the figures are recorded in docs/benchmarks.md
# and printed by `cargo xtask icount`.
set -euo pipefail
SRC=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$SRC/../.." && pwd)
HERE=$ROOT/target/ucx-probe
mkdir -p "$HERE"
cd "$HERE"
MODEL=${MODEL:-$ROOT/target/debug/libkernel_model.so}
N1=${N1:-1000}
N2=${N2:-2000}

# 1. packages
if ! dpkg -s libucx-dev ucx-utils valgrind gcc python3 >/dev/null 2>&1; then
    apt-get update && apt-get install -y libucx-dev ucx-utils valgrind gcc python3
fi
[ -f "$MODEL" ] || (cd "$ROOT" && cargo build -q -p kernel-model --locked)

# 2. build: the probe and a 20-line access() shim
gcc -O2 -shared -fPIC -o libaccess_shim.so "$SRC/access_shim.c" -ldl
gcc -O2 -g -Wall -o probe "$SRC/probe.c" -lucs -luct

# 3. what the kernel model's sysfs tree lacks for UCX (the model writes the tree, and sets
#    SYSFS_PATH, when it is loaded; run something once so that it exists, then add to it):
#    - PCI vendor/device ids: UCX (ib_device.c uct_ib_device_get_sysfs_path/set_pci_id) takes
#      realpath(ibdev_path)/../../{device,vendor}; without 0x15b3:0x101b the device is not in
#      its built-in table, has no MLX5_PRM flag and the mlx5 MD (so rc_mlx5) is refused.
#    - the P_Key table: libibverbs' ibv_query_pkey reads ports/1/pkeys/<i>; uct_ib_iface_init
#      fails with "there is no valid pkey to use" without it.
env LD_PRELOAD="$MODEL" true
TREE=${TMPDIR:-/tmp}/blueflame-kernel-model-$(id -u)
echo 0x15b3 > "$TREE/class/vendor"
echo 0x101b > "$TREE/class/device"
mkdir -p "$TREE/class/infiniband/mlx5_0/ports/1/pkeys"
echo 0xffff > "$TREE/class/infiniband/mlx5_0/ports/1/pkeys/0"

# 4. environment common to all runs
export LD_PRELOAD="$MODEL:$HERE/libaccess_shim.so"
export UCX_MEM_EVENTS=n            # UCM's bistro mmap hook would bypass the model's mmap
RC_MLX5_ENV="UCX_RC_MLX5_TX_INLINE_RESP=0"   # else ALLOW_SCATTER_TO_CQE, refused by the model

echo "== ucx_info -d (IB part)"
# (tolerated: ud_verbs' iface open can fail on the model's refused QUERY_QP, and UCX 1.13's
#  error path then sometimes segfaults in ucs_conn_match_cleanup; not on the measured path)
{ ucx_info -d 2>/dev/null || true; } | grep -E "Memory domain|Transport|Device:" | sed -n '/mlx5_0/,/cma/p' || true

PROBE=./probe
run() { # name tl mode env...
    local name=$1 tl=$2 mode=$3; shift 3
    echo
    echo "== $name: env $* $PROBE $tl N $mode"
    env "$@" UCX_LOG_LEVEL=debug $PROBE "$tl" 20 "$mode" 2>&1 \
        | grep -E "mmio_mode|^transport|^mode" || true
    for n in $N1 $N2; do
        env "$@" valgrind --tool=callgrind --toggle-collect='measured_*' \
            --callgrind-out-file="$HERE/cg.$name.$n.out" $PROBE "$tl" "$n" "$mode" \
            2>"$HERE/valgrind.$name.$n.log" | grep -E "^mode"
    done
    "$SRC/analyze.py" "$HERE/cg.$name.$N2.out" "$HERE/cg.$name.$N1.out"
}

run rc_mlx5_signaled   rc_mlx5  poll     $RC_MLX5_ENV UCX_RC_MLX5_TX_CQ_MODERATION=0
run rc_mlx5_moderated  rc_mlx5  put-only $RC_MLX5_ENV
run rc_verbs_signaled  rc_verbs poll     UCX_RC_VERBS_TX_CQ_MODERATION=0
run rc_verbs_moderated rc_verbs put-only

# 5. optional (RELEASE=1): the same with UCX 1.13.1 built with upstream's release flags
if [ "${RELEASE:-0}" = 1 ]; then
    [ -x ./probe-release ] || "$SRC/build-release.sh"
    PROBE=./probe-release
    run rel_rc_mlx5_signaled   rc_mlx5  poll     $RC_MLX5_ENV UCX_RC_MLX5_TX_CQ_MODERATION=0
    run rel_rc_mlx5_moderated  rc_mlx5  put-only $RC_MLX5_ENV
    run rel_rc_verbs_signaled  rc_verbs poll     UCX_RC_VERBS_TX_CQ_MODERATION=0
    run rel_rc_verbs_moderated rc_verbs put-only
fi
