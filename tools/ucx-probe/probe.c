/*
 * Counts (under callgrind) what UCX's UCT spends on one 8-byte uct_ep_put_short and on the
 * uct_worker_progress call that reaps its send completion.
 *
 * One iface (rc_mlx5 or rc_verbs on mlx5_0:1), two endpoints A and B connected to each other
 * (in-memory address exchange). Each iteration:
 *   measured_put()            uct_ep_put_short(A, 8 bytes -> B's registered buffer)
 *   wait until the 8 bytes arrived in the target buffer (plain memory reads, not measured),
 *   then nap so the software NIC also writes the CQE, then
 *   measured_progress()       one uct_worker_progress(); expected to find the completion
 *   measured_retry()          further uct_worker_progress() calls, only if the first found
 *                             nothing (counted separately, reported)
 * Afterwards measured_empty() calls uct_worker_progress() with nothing outstanding.
 *
 * Mode "poll" (default) is the above. Mode "put-only" runs the same loop but replaces
 * measured_progress/measured_retry by unmeasured uct_worker_progress calls, so that the put
 * can be counted with the transport's default CQ moderation (only every N-th WQE signaled).
 *
 * Usage: probe <tl_name> <iterations> [poll|put-only]
 */
#include <uct/api/uct.h>
#include <ucs/async/async_fwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define CHECK(_s, _what) do { ucs_status_t __s = (_s); if (__s != UCS_OK) { \
    fprintf(stderr, "%s failed: %s\n", _what, ucs_status_string(__s)); exit(1); } } while (0)

__attribute__((noinline, noipa)) ucs_status_t
measured_put(uct_ep_h ep, const uint64_t *val, uint64_t raddr, uct_rkey_t rkey)
{
    return uct_ep_put_short(ep, val, sizeof(*val), raddr, rkey);
}

__attribute__((noinline, noipa)) unsigned measured_progress(uct_worker_h w)
{
    return uct_worker_progress(w);
}

__attribute__((noinline, noipa)) unsigned measured_retry(uct_worker_h w)
{
    return uct_worker_progress(w);
}

__attribute__((noinline, noipa)) unsigned measured_empty(uct_worker_h w)
{
    return uct_worker_progress(w);
}

/* the same wrapper shape with nothing inside: the cost of the call itself */
__attribute__((noinline, noipa)) unsigned measured_nothing(uct_worker_h w)
{
    __asm__ volatile("" ::"r"(w) : "memory");
    return 0;
}

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    const char *tl  = argc > 1 ? argv[1] : "rc_mlx5";
    int iters       = argc > 2 ? atoi(argv[2]) : 2000;
    int put_only    = argc > 3 && !strcmp(argv[3], "put-only");
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *dev = "mlx5_0:1";
    uct_component_h *comps, ib = NULL;
    unsigned ncomps, i;

    CHECK(uct_query_components(&comps, &ncomps), "uct_query_components");
    for (i = 0; i < ncomps; i++) {
        uct_component_attr_t ca = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
        CHECK(uct_component_query(comps[i], &ca), "uct_component_query");
        if (!strcmp(ca.name, "ib")) ib = comps[i];
    }
    if (!ib) { fprintf(stderr, "no ib component\n"); return 1; }

    ucs_async_context_t *async;
    uct_worker_h worker;
    CHECK(ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async), "async");
    CHECK(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker), "worker");

    uct_md_config_t *mdc;
    uct_md_h md;
    CHECK(uct_md_config_read(ib, NULL, NULL, &mdc), "md_config_read");
    CHECK(uct_md_open(ib, "mlx5_0", mdc, &md), "md_open");
    uct_config_release(mdc);

    uct_iface_config_t *ifc;
    CHECK(uct_md_iface_config_read(md, tl, NULL, NULL, &ifc), "iface_config_read");
    uct_iface_params_t ip = {0};
    ip.field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
                    UCT_IFACE_PARAM_FIELD_STATS_ROOT | UCT_IFACE_PARAM_FIELD_RX_HEADROOM;
    ip.open_mode            = UCT_IFACE_OPEN_MODE_DEVICE;
    ip.mode.device.tl_name  = tl;
    ip.mode.device.dev_name = dev;
    ip.stats_root           = NULL;
    ip.rx_headroom          = 0;
    uct_iface_h iface;
    CHECK(uct_iface_open(md, worker, &ip, ifc, &iface), "iface_open");
    uct_config_release(ifc);

    uct_iface_attr_t ia;
    CHECK(uct_iface_query(iface, &ia), "iface_query");
    printf("transport %s device %s: put_short max %zu, cap.flags 0x%lx, connect-to-ep %s\n",
           tl, dev, ia.cap.put.max_short, (unsigned long)ia.cap.flags,
           (ia.cap.flags & UCT_IFACE_FLAG_CONNECT_TO_EP) ? "yes" : "no");
    if (!(ia.cap.flags & UCT_IFACE_FLAG_PUT_SHORT)) { fprintf(stderr, "no put_short\n"); return 1; }

    uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);

    /* two endpoints on the one iface, connected to each other */
    uct_ep_params_t ep_params = {.field_mask = UCT_EP_PARAM_FIELD_IFACE, .iface = iface};
    uct_ep_h ep_a, ep_b;
    CHECK(uct_ep_create(&ep_params, &ep_a), "ep_create A");
    CHECK(uct_ep_create(&ep_params, &ep_b), "ep_create B");
    uct_device_addr_t *daddr = calloc(1, ia.device_addr_len);
    uct_ep_addr_t *aaddr = calloc(1, ia.ep_addr_len), *baddr = calloc(1, ia.ep_addr_len);
    CHECK(uct_iface_get_device_address(iface, daddr), "get_device_address");
    CHECK(uct_ep_get_address(ep_a, aaddr), "ep_get_address A");
    CHECK(uct_ep_get_address(ep_b, baddr), "ep_get_address B");
    CHECK(uct_ep_connect_to_ep(ep_a, daddr, baddr), "connect A->B");
    CHECK(uct_ep_connect_to_ep(ep_b, daddr, aaddr), "connect B->A");

    /* the target buffer, registered; its rkey packed and unpacked as a peer would */
    size_t len = 4096;
    uint64_t *target;
    if (posix_memalign((void **)&target, 4096, len)) return 1;
    memset(target, 0, len);
    uct_mem_h memh;
    CHECK(uct_md_mem_reg(md, target, len, UCT_MD_MEM_ACCESS_ALL, &memh), "mem_reg");
    uct_md_attr_t mda;
    CHECK(uct_md_query(md, &mda), "md_query");
    void *rkey_buf = calloc(1, mda.rkey_packed_size);
    CHECK(uct_md_mkey_pack(md, memh, rkey_buf), "mkey_pack");
    uct_rkey_bundle_t rkb;
    CHECK(uct_rkey_unpack(ib, rkey_buf, &rkb), "rkey_unpack");

    long hits = 0, first_misses = 0, retries = 0, retry_hits = 0, bad = 0, busy = 0;
    for (int it = 0; it < iters; it++) {
        uint64_t val = 0x1122334455660000ull + (uint64_t)it + 1;
        volatile uint64_t *slot = &target[it % (len / 8)];
        ucs_status_t s;
        while ((s = measured_put(ep_a, &val, (uint64_t)(uintptr_t)slot, rkb.rkey)) ==
               UCS_ERR_NO_RESOURCE) {
            busy++;
            uct_worker_progress(worker);
        }
        CHECK(s, "put_short");
        /* wait for the data (the software NIC executes the WQE) */
        for (long spins = 0; *slot != val; spins++) {
            if (spins > 2000000) { fprintf(stderr, "data never arrived (it %d)\n", it); return 1; }
            sched_yield();
        }
        nap(20000); /* let the NIC also write the CQE */
        if (put_only) {
            while (uct_worker_progress(worker)) {}
            continue;
        }
        unsigned n = measured_progress(worker);
        if (n) {
            hits++;
        } else {
            first_misses++;
            for (;;) {
                nap(20000);
                retries++;
                if (measured_retry(worker)) { retry_hits++; break; }
                if (retries > 1000000) { fprintf(stderr, "completion never found (it %d)\n", it); return 1; }
            }
        }
        if (memcmp((void *)slot, &val, 8)) bad++;
    }
    long empties = 1000;
    unsigned found = 0;
    for (long k = 0; k < empties; k++) found += measured_empty(worker);
    for (long k = 0; k < empties; k++) found += measured_nothing(worker);

    printf("mode %s, iterations %d: measured_progress hits %ld misses %ld; retries %ld (hits %ld); "
           "put NO_RESOURCE %ld; bad data %ld; empty calls %ld found %u\n",
           put_only ? "put-only" : "poll", iters, hits, first_misses, retries, retry_hits, busy, bad, empties, found);

    uct_rkey_release(ib, &rkb);
    uct_md_mem_dereg(md, memh);
    uct_ep_destroy(ep_a);
    uct_ep_destroy(ep_b);
    uct_iface_close(iface);
    uct_md_close(md);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    free(target);
    return (bad || busy) ? 2 : 0;
}
