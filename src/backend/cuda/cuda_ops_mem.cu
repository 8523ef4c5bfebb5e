/* Memory helpers the C side of the CUDA backend needs beyond cuda_device.cu:
 * telling device buffers from host pointers, and an overlap-safe copy. */
#include "backend/cuda/cuda_ops_common.cuh"

extern "C" int cuda_mem_is_device(const void *p) {
    cudaPointerAttributes a;
    if (!p) return 0;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* an unknown host pointer is not an error here */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* Disjoint, 16-byte aligned: a streaming copy on the SMs (the copy engine
 * behind cudaMemcpy moves ~2.8 TB/s here, the SMs ~3.9; docs/gpu-notes.md). */
__global__ void k_copy16(uint4 *d, const uint4 *s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = s[i];
}

extern "C" di_status cuda_mem_move(void *dst, const void *src, size_t bytes, di_err *err) {
    if (!bytes || dst == src) return DI_OK;
    const char *d = (const char *)dst, *s = (const char *)src;
    if ((d + bytes <= s || s + bytes <= d) && (((uintptr_t)d | (uintptr_t)s | bytes) & 15) == 0) {
        size_t n = bytes / 16;
        unsigned blocks = (unsigned)(n / 256 + 1 < 132 * 16 ? n / 256 + 1 : 132 * 16);
        k_copy16<<<blocks, 256>>>((uint4 *)dst, (const uint4 *)src, n);
        return cuda_check_launch(err, "copy");
    }
    if (d + bytes <= s || s + bytes <= d)
        return cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), err, "copy");
    /* overlapping ranges: cudaMemcpy leaves the result undefined, go through a temporary */
    void *tmp = NULL;
    di_status st = cuda_check(cudaMalloc(&tmp, bytes), err, "copy: temporary");
    if (st) return st;
    st = cuda_check(cudaMemcpy(tmp, src, bytes, cudaMemcpyDeviceToDevice), err, "copy");
    if (!st) st = cuda_check(cudaMemcpy(dst, tmp, bytes, cudaMemcpyDeviceToDevice), err, "copy");
    cudaFree(tmp);
    return st;
}

extern "C" di_status cuda_mem_fill_async(void *p, int byte, size_t bytes, di_err *err) {
    return cuda_check(cudaMemsetAsync(p, byte, bytes, 0), err, "cudaMemsetAsync");
}

extern "C" di_status cuda_mem_upload_async(void *dst, const void *src, size_t bytes, di_err *err) {
    return cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, 0), err, "cudaMemcpyAsync (upload)");
}

/* One block per copy: 16-byte moves when both ends and the size allow
 * (rows of floats always do), bytes otherwise. A queued copy's ranges never
 * overlap (cu_copy runs such a copy at once), so a thread's 4 loads are
 * issued before its stores: one round trip per 4 moves, not one per move
 * (an 80 KB mHC row took 20 in series). */
__global__ void k_copy_batch(const cuda_copy_batch b) {
    pdl_enter();
    cuda_copy_desc d = b.d[blockIdx.x];
    if ((((uintptr_t)d.dst | (uintptr_t)d.src | d.bytes) & 15) == 0) {
        uint4 *o = (uint4 *)d.dst;
        const uint4 *i = (const uint4 *)d.src;
        const size_t n = d.bytes / 16, bs = blockDim.x;
        for (size_t k0 = threadIdx.x; k0 < n; k0 += 4 * bs) {
            uint4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (k0 + u * bs < n) v[u] = __ldcg(i + k0 + u * bs);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (k0 + u * bs < n) o[k0 + u * bs] = v[u];
        }
    } else {
        for (size_t k = threadIdx.x; k < d.bytes; k += blockDim.x) d.dst[k] = d.src[k];
    }
}

extern "C" di_status cuda_mem_copy_batch(const cuda_copy_batch *b, di_err *err) {
    if (b->n <= 0) return DI_OK;
    cuda_launch_pdl(k_copy_batch, b->n, 256, 0, 0, *b);
    return cuda_check_launch(err, "batched copy");
}

/* Host-to-device staging: a pinned buffer in two halves. An upload copies
 * its bytes into the current half and queues an asynchronous copy from
 * there, so the host does not wait for the device; when a half is full an
 * event is recorded and the other half is taken once its own event (all
 * copies queued from it) has completed. */
struct cuda_stage {
    char *buf;
    size_t half, used;
    int cur;
    cudaEvent_t ev[2];
    int ev_set[2];
};

extern "C" di_status cuda_stage_init(cuda_stage **out, size_t bytes, di_err *err) {
    *out = NULL;
    cuda_stage *st = (cuda_stage *)calloc(1, sizeof *st);
    if (!st) return di_err_set(err, DI_ERR_NOMEM, "staging: out of memory");
    di_status rc = cuda_check(cudaHostAlloc((void **)&st->buf, bytes, cudaHostAllocDefault), err,
                              "cudaHostAlloc (upload staging)");
    if (!rc) rc = cuda_check(cudaEventCreateWithFlags(&st->ev[0], cudaEventDisableTiming), err, "event");
    if (!rc) rc = cuda_check(cudaEventCreateWithFlags(&st->ev[1], cudaEventDisableTiming), err, "event");
    if (rc) {
        cuda_stage_free(st);
        return rc;
    }
    st->half = bytes / 2;
    *out = st;
    return DI_OK;
}

extern "C" void cuda_stage_free(cuda_stage *st) {
    if (!st) return;
    if (st->buf) cudaFreeHost(st->buf);
    if (st->ev[0]) cudaEventDestroy(st->ev[0]);
    if (st->ev[1]) cudaEventDestroy(st->ev[1]);
    free(st);
}

extern "C" di_status cuda_stage_upload(cuda_stage *st, void *dst, const void *src, size_t bytes,
                                       di_err *err) {
    if (!bytes) return DI_OK;
    size_t need = (bytes + 255) & ~(size_t)255;
    if (need > st->half) /* too big to stage: a plain (waiting) copy */
        return cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), err, "upload");
    if (st->used + need > st->half) {
        di_status rc = cuda_check(cudaEventRecord(st->ev[st->cur], 0), err, "event record");
        if (rc) return rc;
        st->ev_set[st->cur] = 1;
        st->cur ^= 1;
        st->used = 0;
        if (st->ev_set[st->cur] &&
            (rc = cuda_check(cudaEventSynchronize(st->ev[st->cur]), err, "staging wait")))
            return rc;
    }
    char *h = st->buf + (size_t)st->cur * st->half + st->used;
    memcpy(h, src, bytes);
    st->used += need;
    return cuda_check(cudaMemcpyAsync(dst, h, bytes, cudaMemcpyHostToDevice, 0), err, "upload (staged)");
}

/* A growing pinned buffer filled in place and uploaded from asynchronously
 * (the Engram rows of a prefill: tens of MB, more than a staging half, and
 * before this a waiting copy from pageable memory that drained the stream).
 * Taking it waits for the last upload from it only. */
struct cuda_pinned {
    void *buf;
    size_t cap;
    cudaEvent_t ev;
    int ev_set;
};

extern "C" di_status cuda_pinned_take(cuda_pinned **pp, size_t bytes, void **host, di_err *err) {
    *host = NULL;
    cuda_pinned *p = *pp;
    if (!p) {
        p = (cuda_pinned *)calloc(1, sizeof *p);
        if (!p) return di_err_set(err, DI_ERR_NOMEM, "pinned upload buffer: out of memory");
        di_status rc = cuda_check(cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming), err, "event");
        if (rc) {
            free(p);
            return rc;
        }
        *pp = p;
    }
    if (p->ev_set) {
        di_status rc = cuda_check(cudaEventSynchronize(p->ev), err, "pinned upload wait");
        if (rc) return rc;
        p->ev_set = 0;
    }
    if (p->cap < bytes) {
        if (p->buf) cudaFreeHost(p->buf);
        p->buf = NULL;
        p->cap = 0;
        const size_t want = bytes + bytes / 4; /* room to grow a little */
        di_status rc = cuda_check(cudaHostAlloc(&p->buf, want, cudaHostAllocDefault), err,
                                  "cudaHostAlloc (pinned upload buffer)");
        if (rc) return rc;
        p->cap = want;
    }
    *host = p->buf;
    return DI_OK;
}

extern "C" di_status cuda_pinned_upload(cuda_pinned *p, void *dst, size_t bytes, di_err *err) {
    if (!bytes) return DI_OK;
    di_status rc = cuda_check(cudaMemcpyAsync(dst, p->buf, bytes, cudaMemcpyHostToDevice, 0), err,
                              "upload (pinned)");
    if (!rc) rc = cuda_check(cudaEventRecord(p->ev, 0), err, "event record");
    if (!rc) p->ev_set = 1;
    return rc;
}

extern "C" void cuda_pinned_free(cuda_pinned *p) {
    if (!p) return;
    if (p->ev_set) cudaEventSynchronize(p->ev);
    if (p->buf) cudaFreeHost(p->buf);
    if (p->ev) cudaEventDestroy(p->ev);
    free(p);
}
