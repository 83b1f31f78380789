#!/bin/bash
# Optional: builds UCX v1.13.1 (the same version as Debian's libucx0) with upstream's release
# flags (ucx.spec.in / contrib/configure-release: no assertions, no parameter checks, no
# logging) into ./ucx-release, and the probe against it (./probe-release).
# One change: uct_ib_fill_cq_attr() must not ask for IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, which a
# build without assertions requests when creating the rc_mlx5/ud_mlx5/dc_mlx5 CQs
# (extended CREATE_CQ with flags) and which the kernel model refuses with EOPNOTSUPP. The flag
# only changes the CQ context in the device; UCX's polling code is the same.
set -euo pipefail
SRC=$(cd "$(dirname "$0")" && pwd)
HERE=$(cd "$SRC/../.." && pwd)/target/ucx-probe
mkdir -p "$HERE"
cd "$HERE"
UCX_GIT=${UCX_GIT:-/work/.mirror/openucx+ucx/repo}   # a clone of github.com/openucx/ucx
apt-get install -y autoconf automake libtool pkg-config make libibverbs-dev >/dev/null
rm -rf ucx-build ucx-release
mkdir ucx-build
git --git-dir="$UCX_GIT" archive v1.13.1 | tar -x -C ucx-build
cd ucx-build
patch -p1 < "$SRC/ucx-release-cq-overrun.patch" >/dev/null
./autogen.sh >"$HERE/autogen.log" 2>&1
./configure --prefix="$HERE/ucx-release" --disable-optimizations --disable-logging \
    --disable-debug --disable-assertions --disable-params-check --enable-mt --with-verbs \
    --without-cuda --without-rocm --without-knem --without-xpmem --without-ugni \
    --without-java --without-go --disable-doxygen-doc --enable-cma >"$HERE/configure.log" 2>&1
make -j"$(nproc)" >"$HERE/make.log" 2>&1
make install >"$HERE/install.log" 2>&1
cd "$HERE"
R=$HERE/ucx-release
gcc -O2 -g -Wall -I"$R/include" -o probe-release "$SRC/probe.c" -L"$R/lib" -Wl,-rpath,"$R/lib" -lucs -luct
