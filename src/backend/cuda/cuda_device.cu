/* CUDA devices and device buffers (the plain C interface of cuda_backend.h). */
#include <cuda_profiler_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"

extern "C" di_status di_cuda_device_count(int *count, di_err *err) {
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError(); /* the runtime keeps the error sticky otherwise */
        const char *why = e == cudaSuccess || e == cudaErrorNoDevice ? "no GPU found"
                          : e == cudaErrorInsufficientDriver
                              ? "no NVIDIA driver loaded, or one older than this CUDA runtime"
                              : cudaGetErrorString(e);
        return di_err_set(err, DI_ERR_BACKEND, "no CUDA device visible (%s)", why);
    }
    *count = n;
    return DI_OK;
}

extern "C" di_status di_cuda_device_info_get(int dev, di_cuda_device_info *info, di_err *err) {
    memset(info, 0, sizeof *info);
    cudaDeviceProp p;
    di_status st = cuda_check(cudaGetDeviceProperties(&p, dev), err, "cudaGetDeviceProperties");
    if (st) return di_err_prefix(err, "device %d: ", dev);
    info->index = dev;
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->total_mem = p.totalGlobalMem;
    info->l2_bytes = (size_t)p.l2CacheSize;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    int clk = 0;
    if (cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev) == cudaSuccess)
        info->clock_khz = clk;
    (void)cudaGetLastError();
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cudaSetDevice(dev) == cudaSuccess) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) info->free_mem = fr;
        if (cur >= 0) cudaSetDevice(cur);
    }
    (void)cudaGetLastError();
    return DI_OK;
}

extern "C" di_status di_cuda_init(int dev, di_err *err) {
    int n = 0;
    di_status st = di_cuda_device_count(&n, err);
    if (st) return st;
    if (dev < 0 || dev >= n)
        return di_err_set(err, DI_ERR_INVALID_ARG, "CUDA device %d does not exist (%d visible)",
                          dev, n);
    st = cuda_check(cudaSetDevice(dev), err, "cudaSetDevice");
    if (st) return st;
    /* cudaFree(0) forces context creation now rather than inside the first op. */
    return cuda_check(cudaFree(0), err, "creating the CUDA context");
}

extern "C" di_status di_cuda_synchronize(di_err *err) {
    return cuda_check(cudaDeviceSynchronize(), err, "cudaDeviceSynchronize");
}

extern "C" di_status di_cuda_alloc(void **dev_ptr, size_t bytes, di_err *err) {
    *dev_ptr = NULL;
    cudaError_t e = cudaMalloc(dev_ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *dev_ptr = NULL;
        (void)cudaGetLastError();
        return di_err_set(err, e == cudaErrorMemoryAllocation ? DI_ERR_NOMEM : DI_ERR_BACKEND,
                          "cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return DI_OK;
}

extern "C" void di_cuda_free(void *dev_ptr) {
    if (dev_ptr) cudaFree(dev_ptr);
}

extern "C" di_status di_cuda_upload(void *dev_dst, const void *host_src, size_t bytes,
                                    di_err *err) {
    return cuda_check(cudaMemcpy(dev_dst, host_src, bytes, cudaMemcpyHostToDevice), err,
                      "upload (host to device copy)");
}

extern "C" di_status di_cuda_download(void *host_dst, const void *dev_src, size_t bytes,
                                      di_err *err) {
    return cuda_check(cudaMemcpy(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost), err,
                      "download (device to host copy)");
}

/* A download into pageable memory goes through the driver's own staging
 * buffers, one piece at a time (on an H200 host ~6.6 GB/s: a batch of 64
 * rows of logits, 33 MB, took 5 ms of a 22 ms decode step); into page-locked
 * memory it is one transfer at the bus's speed. */
extern "C" void *di_cuda_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) == cudaSuccess) return p;
    (void)cudaGetLastError(); /* locking failed (limits, no device): ordinary memory still works */
    return malloc(bytes ? bytes : 1);
}

extern "C" int di_cuda_host_pinned(const void *host_ptr) {
    cudaPointerAttributes a;
    if (host_ptr && cudaPointerGetAttributes(&a, host_ptr) == cudaSuccess) return a.type == cudaMemoryTypeHost;
    (void)cudaGetLastError();
    return 0;
}

extern "C" void di_cuda_host_free(void *host_ptr) {
    if (!host_ptr) return;
    if (di_cuda_host_pinned(host_ptr)) cudaFreeHost(host_ptr);
    else free(host_ptr);
}

extern "C" di_status di_cuda_fill(void *dev_ptr, int byte, size_t bytes, di_err *err) {
    return cuda_check(cudaMemset(dev_ptr, byte, bytes), err, "cudaMemset");
}

/* ------------------------------------------------------------ measuring aids */

extern "C" void di_cuda_profiler_range(int on) {
    if (on) cudaProfilerStart();
    else cudaProfilerStop();
    (void)cudaGetLastError();
}

static int pdl_state = -1; /* -1: DI_CUDA_PDL not read yet */
extern "C" int cuda_pdl_on(void) { return cuda_env_switch("DI_CUDA_PDL", &pdl_state); }
extern "C" void cuda_pdl_refused(void) { pdl_state = 0; }

/* Per host thread: a process may hold backends in both modes, each op
 * entered on its caller's thread. */
static thread_local int batch_invariant_mode = 0;
extern "C" void di_cuda_set_batch_invariant(int on) { batch_invariant_mode = on != 0; }
extern "C" int cuda_batch_invariant(void) { return batch_invariant_mode; }

/* An empty kernel whose grid size is the tag: in a per-kernel profile it
 * marks where a part of a pass begins (the grid size column gives the tag). */
__global__ void k_mark(int tag) {
    if (tag < 0 && threadIdx.x == 0) asm volatile("trap;");
}

extern "C" void di_cuda_mark(int tag) {
    k_mark<<<tag > 0 ? tag : 1, 32>>>(tag);
    (void)cudaGetLastError();
}

/* Events recorded in stream order without waiting; read back at the end
 * of a pass. Lazily created, kept for the timeline's lifetime. */
struct di_cuda_timeline {
    cudaEvent_t *ev;
    int cap, n, made;
};

extern "C" di_status di_cuda_timeline_create(di_cuda_timeline **out, int cap, di_err *err) {
    *out = NULL;
    di_cuda_timeline *t = (di_cuda_timeline *)calloc(1, sizeof *t);
    cudaEvent_t *ev = (cudaEvent_t *)calloc((size_t)cap, sizeof *ev);
    if (!t || !ev) {
        free(t);
        free(ev);
        return di_err_set(err, DI_ERR_NOMEM, "event timeline of %d events: out of memory", cap);
    }
    t->ev = ev;
    t->cap = cap;
    *out = t;
    return DI_OK;
}

extern "C" void di_cuda_timeline_reset(di_cuda_timeline *t) { t->n = 0; }

extern "C" int di_cuda_timeline_mark(di_cuda_timeline *t) {
    if (t->n >= t->cap) return -1;
    if (t->n == t->made) {
        if (cudaEventCreate(&t->ev[t->n]) != cudaSuccess) {
            (void)cudaGetLastError();
            return -1;
        }
        t->made++;
    }
    if (cudaEventRecord(t->ev[t->n], 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return t->n++;
}

extern "C" di_status di_cuda_timeline_read(di_cuda_timeline *t, float *ms, di_err *err) {
    if (t->n == 0) return DI_OK;
    di_status st = cuda_check(cudaEventSynchronize(t->ev[t->n - 1]), err, "cudaEventSynchronize");
    for (int i = 0; !st && i + 1 < t->n; i++)
        st = cuda_check(cudaEventElapsedTime(&ms[i], t->ev[i], t->ev[i + 1]), err, "cudaEventElapsedTime");
    return st;
}

extern "C" void di_cuda_timeline_free(di_cuda_timeline *t) {
    if (!t) return;
    for (int i = 0; i < t->made; i++) cudaEventDestroy(t->ev[i]);
    free(t->ev);
    free(t);
}
