/* The work list of a grouped product (not a public header): group z owns
 * rows off[z] .. off[z+1] (device memory, data-dependent), cut into tiles
 * of bm rows. The persistent kernels (cuda_gemm_grouped.cu,
 * cuda_gemm_grouped_wg.cu) first scan the groups' tile counts into shared
 * memory, then walk items ordered by group, then output tile, then row tile
 * (fastest, so that blocks running together read one weight tile). */
#ifndef DI_BACKEND_CUDA_GROUP_TILES_CUH
#define DI_BACKEND_CUDA_GROUP_TILES_CUH

#include <stdint.h>

/* cum[z] = tiles of groups 0 .. z-1, for z = 0 .. G (cum[G]: all of them):
 * thread t counts groups PER t .. PER t + PER - 1 (blockDim.x * PER must
 * reach G), a warp scan, then the warps' totals (wtot, one a warp). Ends
 * with a block barrier: cum is ready. */
template <int PER>
__device__ __forceinline__ void group_tiles_scan(const int32_t *__restrict__ off, int G, int bm, int *cum,
                                                 int *wtot) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int loc[PER], s = 0;
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int z = tid * PER + u;
        const int c = z < G ? off[z + 1] - off[z] : 0;
        loc[u] = c > 0 ? (c + bm - 1) / bm : 0;
        s += loc[u];
    }
    int x = s;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) wtot[warp] = x;
    __syncthreads();
    int e = x - s;
    for (int i = 0; i < warp; i++) e += wtot[i];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int z = tid * PER + u;
        if (z <= G) cum[z] = e;
        e += loc[u];
    }
    if (tid == (int)blockDim.x - 1 && G >= (int)blockDim.x * PER) cum[G] = e; /* G past the threads' groups */
    __syncthreads();
}

/* The group of item `it` (nx output tiles a row tile): the last group whose
 * first item is <= it, which is never an empty one. */
__device__ __forceinline__ int group_of_item(const int *cum, int G, int64_t nx, int64_t it) {
    int lo = 0, hi = G - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if ((int64_t)cum[mid] * nx <= it) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Item `it` (nx output tiles a row tile) as its group z, its output tile
 * nt (0 .. nx-1) and its row tile rt within the group. */
struct group_tile {
    int z;
    int64_t nt, rt;
};
__device__ __forceinline__ group_tile group_tile_of(const int *cum, int G, int64_t nx, int64_t it) {
    const int z = group_of_item(cum, G, nx, it), tz = cum[z + 1] - cum[z];
    const int64_t local = it - (int64_t)cum[z] * nx;
    return group_tile{z, local / tz, local % tz};
}

#endif
