/* The MXFP4 prefill on AMX tiles (kernels.h, "MXFP4"), for CPUs with
 * AMX-BF16 (di_cpu_kernels_amx). kernels.h sums each 32-code block of an
 * output exactly, in two sums (activation codes at or above 2^-3, and the
 * rest), and adds each sum to one of two chains (even and odd blocks). An
 * exact sum is the same whatever adds it, so the sums may come from the
 * tile unit: a weight value w·sw (E2M1 times a power of two) and an
 * activation value qa·sa (E4M3 times a power of two) are both exact in
 * bf16, their product exact in fp32, and every partial sum of a block is a
 * multiple of its smallest product's unit below 2^24 of them, so exact in
 * fp32 too, in whatever order and with whatever rounding the unit uses
 * inside one TDPBF16PS (its accumulation is not a sequence of rounded
 * fp32 adds: only exact sums may go through it). What the unit does differ
 * in is that it flushes subnormal inputs and results to zero, so a call
 * takes this route only where no operand, product or partial sum can be
 * one: activation scales of at least 2^-117 (the smallest code, 2^-9,
 * times it is normal) and, per panel of weight rows, weight scales of at
 * least 2^-125 (0.5·sw normal) and 2^-10·sa·sw >= 2^-126 for every pair
 * of scales (the unit of the small codes' products); other panels run the
 * scalar code, other calls the AVX-512 tiles.
 *
 * Layout. One tile is 16 rows of 64 bytes. The weights are the A operand:
 * 16 weight rows × one block's 32 codes as bf16 w·sw (a row's 16 bytes
 * decoded by one table lookup of 32 words, the scale added to the
 * exponents of the nonzero ones), decoded per k-chunk of 8 blocks for the
 * panels (32 rows: two tiles) a thread owns. The activations are the B
 * operand, packed once a call: for 16 activation rows and one block, the
 * 32-bit pair (k = 2p, 2p + 1) of row j at (p, j), the pairs of a row put
 * in place by a scatter; blocks where some row has small codes get a
 * second tile holding only those (the first has them zeroed). A step is
 * a block for 32 weight rows × 32 activation rows: four products into four
 * zeroed result tiles, stored, and each result added to its chain (fp32,
 * rounded as the scalar code's fma(B, s, C): the product inside is exact);
 * where a row tile has small codes there, their products come from their
 * tile first, and each chain then adds its two results in kernels.h's
 * order in one pass. The results are [weight row][activation row], so the
 * chains are too, and the two chains of an output are added and written
 * out at the end. */
#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS

#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#define AMX_INLINE                                                                                        \
    static inline __attribute__((always_inline,                                                          \
                                 target("amx-tile,amx-bf16,avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))

/* TR rows a tile (and activation rows a B tile), TP weight rows a panel
 * (two A tiles), CB blocks a k-chunk (a panel's decoded chunk: 16 KB),
 * PPAN panels a thread's piece at most, TB floats a result tile. */
enum { TR = 16, TP = 32, CB = 8, PPAN = 8, TB = TR * TR };

static atomic_long amx_units;
long di_cpu_kernels_amx_units(void) { return atomic_load(&amx_units); }

/* Every tile 16 rows of 64 bytes: tmm0-3 the results, tmm4-5 the weights,
 * tmm6-7 the activations. The configuration is per thread; each piece of
 * work loads it and releases the tiles at its end. */
AMX_INLINE void tiles_begin(void) {
    _Alignas(64) uint8_t cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1; /* palette 1 */
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 64; /* bytes a row (little-endian 16 bits) */
        cfg[48 + t] = TR;     /* rows */
    }
    _tile_loadconfig(cfg);
}

typedef struct amx_job {
    const uint8_t *qa;
    const float *sa;
    const uint8_t *w, *ws;
    int64_t M, K, KB, N, RT; /* RT row tiles of TR activation rows */
    int ea_min, ea_max;      /* the activation scales' exponents */
    uint16_t *xb;            /* [RT][KB][TR pairs][TR rows][2]: the B tiles, small codes zeroed */
    uint16_t *xs;            /* the same layout: the small codes alone, where has_small */
    uint8_t *has_small;      /* [RT][KB] */
    atomic_int nan;          /* a NaN activation code: the call is not taken */
    float *out;
    float *scratch;          /* [threads][sf] */
    int64_t sf;
    int64_t panels, pieces;  /* weight panels of TP rows, dealt in `pieces` runs */
} amx_job;

/* ---- the activations ---- */

/* Row tile rt, block kb into its B tile (and small-code tile). Each code
 * goes to fp16 by shifts (as dec_half: value·2^-8, subnormal codes
 * included) and exactly to fp32 by F16C, times sa·2^8 (exact: the result
 * is normal by the scale checks); the top halves of those fp32 values are
 * the bf16 values, and two neighbours make a pair. */
AMX_INLINE void pack_block(amx_job *j, int64_t rt, int64_t kb) {
    const int64_t M = j->M, K = j->K, KB = j->KB;
    static const uint16_t odd_words[32] __attribute__((aligned(64))) = {
        1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
        33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
    const __m512i odd = _mm512_load_si512(odd_words); /* the top halves of lo's then hi's values */
    const __m512i col = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    const __m256i low7 = _mm256_set1_epi8(0x7f), small_code = _mm256_set1_epi8(0x20);
    uint32_t *big = (uint32_t *)(j->xb + (rt * KB + kb) * (2 * TB));
    uint32_t *sml = (uint32_t *)(j->xs + (rt * KB + kb) * (2 * TB));
    __m512i sv[TR];
    int any = 0;
    for (int r = 0; r < TR; r++) {
        const int64_t m = rt * TR + r;
        if (m >= M) {
            sv[r] = _mm512_setzero_si512();
            _mm512_i32scatter_epi32(big, _mm512_add_epi32(col, _mm512_set1_epi32(r)), sv[r], 4);
            continue;
        }
        const __m256i c = _mm256_loadu_si256((const __m256i *)(j->qa + m * K + kb * 32));
        const __m256i mag = _mm256_and_si256(c, low7);
        if (_mm256_cmpeq_epi8_mask(mag, low7)) atomic_store_explicit(&j->nan, 1, memory_order_relaxed);
        const __mmask32 sm = _mm256_cmplt_epu8_mask(mag, small_code) & _mm256_test_epi8_mask(c, low7);
        const __m512i h = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(_mm512_cvtepu8_epi16(c), 8), 1),
                                           _mm512_set1_epi16((short)0xbf80));
        const __m512 f = _mm512_set1_ps(j->sa[m * KB + kb] * 0x1p8f);
        const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), f);
        const __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), f);
        const __m512i v = _mm512_permutex2var_epi16(_mm512_castps_si512(lo), odd, _mm512_castps_si512(hi));
        _mm512_i32scatter_epi32(big, _mm512_add_epi32(col, _mm512_set1_epi32(r)), _mm512_maskz_mov_epi16(~sm, v),
                                4);
        sv[r] = _mm512_maskz_mov_epi16(sm, v);
        any |= sm != 0;
    }
    j->has_small[rt * KB + kb] = (uint8_t)any;
    if (any)
        for (int r = 0; r < TR; r++) _mm512_i32scatter_epi32(sml, _mm512_add_epi32(col, _mm512_set1_epi32(r)), sv[r], 4);
}

static AMX void pack_tiles(void *ctx, int64_t t0, int64_t t1, int thread) {
    amx_job *j = ctx;
    for (int64_t i = t0; i < t1; i++) pack_block(j, i / j->KB, i % j->KB);
}

/* ---- the weights ---- */

/* Weight row n (or zeros past N), blocks kb0 .. kb0 + nb - 1 -> row r of
 * the A tiles at dst (one tile per block, `step` uint16 apart): each block's
 * 16 bytes spread to 32 words (low nibble, high nibble: the codes in k
 * order), looked up as bf16 E2M1 values and the block's scale added to the
 * exponent of the nonzero ones (w·sw: normal by the scale checks). A row's
 * chunk is 128 contiguous bytes; the next chunk's two lines are fetched
 * meanwhile (a panel's 32 rows are 32 streams 2.5 KB apart or more, which
 * the hardware prefetchers follow poorly from DRAM). */
AMX_INLINE void decode_row(const amx_job *j, int64_t n, int64_t kb0, int64_t nb, int r, uint16_t *dst,
                           int64_t step) {
    static const uint16_t e2m1_bf16[32] __attribute__((aligned(64))) = {
        0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0,
        0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0}; /* 0, ±0.5, .., ±6 */
    const __m512i tab = _mm512_load_si512(e2m1_bf16);
    const __m512i lo4 = _mm512_set1_epi32(0xf), hi4 = _mm512_set1_epi32(0xf0), mag = _mm512_set1_epi16(0x7fff);
    if (n >= j->N) {
        for (int64_t b = 0; b < nb; b++) _mm512_store_si512(dst + b * step + r * 32, _mm512_setzero_si512());
        return;
    }
    const uint8_t *row = j->w + n * (j->K / 2), *sc = j->ws + n * j->KB;
    if (kb0 + CB < j->KB) {
        _mm_prefetch((const char *)(row + (kb0 + CB) * 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(row + (kb0 + CB) * 16 + 64), _MM_HINT_T0);
    }
    for (int64_t b = 0; b < nb; b++) {
        const int64_t kb = kb0 + b;
        const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + kb * 16)));
        const __m512i idx = _mm512_or_si512(_mm512_and_si512(d, lo4), _mm512_slli_epi32(_mm512_and_si512(d, hi4), 12));
        const __m512i v = _mm512_permutexvar_epi16(idx, tab);
        const short off = (short)(((int)sc[kb] - 127) * 128);
        _mm512_store_si512(dst + b * step + r * 32,
                           _mm512_mask_add_epi16(v, _mm512_test_epi16_mask(v, mag), v, _mm512_set1_epi16(off)));
    }
}

/* Weight rows [n0, n1) stay off the tiles unless every weight scale sw =
 * 2^(e-127) gives normal operands (0.5·sw >= 2^-126: e >= 2; below, the
 * exponent add of decode_row would also borrow from the sign) and
 * products (2^-10·sa·sw >= 2^-126 for the smallest sa), and finite ones
 * (sw <= 2^100, sa·sw <= 2^100: as the AVX-512 tiles' pf4_scales_ok). */
static int panel_ok(const amx_job *j, int64_t n0, int64_t n1) {
    int lo, hi;
    di_cpu_byte_range(j->ws + n0 * j->KB, (n1 - n0) * j->KB, &lo, &hi);
    return lo >= 2 && lo - 127 + j->ea_min >= -116 && hi <= 227 && hi - 127 + j->ea_max <= 100;
}

/* ---- the products ---- */

/* chain += result tile (both [TR][TR]) */
AMX_INLINE void chain_add(float *ch, const float *res) {
#pragma GCC unroll 16
    for (int r = 0; r < TR; r++)
        _mm512_store_ps(ch + r * TR, _mm512_add_ps(_mm512_load_ps(ch + r * TR), _mm512_load_ps(res + r * TR)));
}
/* chain = (chain + big) + small: the block's two sums in kernels.h's order,
 * each add rounded, the chain read and written once */
AMX_INLINE void chain_add2(float *ch, const float *big, const float *small) {
#pragma GCC unroll 16
    for (int r = 0; r < TR; r++)
        _mm512_store_ps(ch + r * TR, _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(ch + r * TR), _mm512_load_ps(big + r * TR)),
                                                   _mm512_load_ps(small + r * TR)));
}

/* The products of one step (tmm4-5: weights, tmm6-7: activations) into
 * res [4][TB]: (A0, B0), (A0, B1), (A1, B0), (A1, B1); with one row tile
 * (two = 0) only the first and third. */
AMX_INLINE void step_products(float *res, int two) {
    _tile_zero(0);
    _tile_zero(2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (two) {
        _tile_zero(1);
        _tile_zero(3);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
        _tile_stored(1, res + TB, 64);
        _tile_stored(3, res + 3 * TB, 64);
    }
    _tile_stored(0, res, 64);
    _tile_stored(2, res + 2 * TB, 64);
}

/* Panels [p0, p1) of TP weight rows (at most PPAN): every activation row,
 * all of K, k-chunk by k-chunk. */
static AMX void amx_panels(amx_job *j, int64_t p0, int64_t p1, int thread) {
    const int64_t M = j->M, N = j->N, KB = j->KB, RT = j->RT, np = p1 - p0;
    float *res = j->scratch + thread * j->sf;          /* [2][4][TB]: a step's products, its small codes' */
    uint16_t *wt = (uint16_t *)(res + 8 * TB);        /* [np][CB][2][TR][32] */
    float *chains = res + 8 * TB + 2 * PPAN * CB * TB; /* [2][np][RT][2][TB] */
    const int64_t cs = RT * 2 * TB;                    /* one panel's chain of one parity */
    int ok[PPAN];
    for (int64_t p = 0; p < np; p++) {
        const int64_t n0 = (p0 + p) * TP, n1 = n0 + TP < N ? n0 + TP : N;
        ok[p] = panel_ok(j, n0, n1);
        if (!ok[p]) di_gemm_block_rows_scalar(1, j->qa, j->sa, M, j->K, j->w, j->ws, N, n0, n1, j->out);
    }
    memset(chains, 0, sizeof(float) * (size_t)(2 * np * cs));
    tiles_begin();
    for (int64_t kb0 = 0; kb0 < KB; kb0 += CB) {
        const int64_t nb = KB - kb0 < CB ? KB - kb0 : CB;
        /* wt: [np][CB][2][TR][32]; row r of the panel to tile r / TR, row r % TR */
        for (int64_t p = 0; p < np; p++)
            if (ok[p])
                for (int r = 0; r < TP; r++)
                    decode_row(j, (p0 + p) * TP + r, kb0, nb, r % TR, wt + (p * CB * 2 + r / TR) * TB * 2, 4 * TB);
        for (int64_t rt = 0; rt < RT; rt += 2) {
            const int64_t rt1 = rt + 1 < RT ? rt + 1 : rt; /* an odd last row tile pairs with itself */
            for (int64_t p = 0; p < np; p++) {
                if (!ok[p]) continue;
                for (int64_t b = 0; b < nb; b++) {
                    const int64_t kb = kb0 + b;
                    float *ch = chains + ((kb & 1) * np + p) * cs;
                    float *c00 = ch + (rt * 2 + 0) * TB, *c01 = ch + (rt1 * 2 + 0) * TB;
                    float *c10 = ch + (rt * 2 + 1) * TB, *c11 = ch + (rt1 * 2 + 1) * TB;
                    const uint16_t *a = wt + (p * CB + b) * 2 * TB * 2;
                    _tile_loadd(4, a, 64);
                    _tile_loadd(5, a + TB * 2, 64);
                    const int two = rt1 != rt;
                    _tile_loadd(6, j->xb + (rt * KB + kb) * (2 * TB), 64);
                    if (two) _tile_loadd(7, j->xb + (rt1 * KB + kb) * (2 * TB), 64);
                    step_products(res, two);
                    const int s0 = j->has_small[rt * KB + kb], s1 = two && j->has_small[rt1 * KB + kb];
                    /* kernels.h: the small codes' sum after the block's other
                     * sum; their products from the row tiles that have any
                     * (one B tile where only one has), added with the
                     * other's in one pass over the chain */
                    float *sr = res + 4 * TB; /* [4][TB] as res; with one B tile, its products at 0 and 2·TB */
                    if (s0 && s1) {
                        _tile_loadd(6, j->xs + (rt * KB + kb) * (2 * TB), 64);
                        _tile_loadd(7, j->xs + (rt1 * KB + kb) * (2 * TB), 64);
                        step_products(sr, 1);
                    } else if (s0 || s1) {
                        _tile_loadd(6, j->xs + ((s0 ? rt : rt1) * KB + kb) * (2 * TB), 64);
                        step_products(sr, 0);
                    }
                    if (s0) chain_add2(c00, res, sr), chain_add2(c10, res + 2 * TB, sr + 2 * TB);
                    else chain_add(c00, res), chain_add(c10, res + 2 * TB);
                    if (s1)
                        chain_add2(c01, res + TB, s0 ? sr + TB : sr),
                            chain_add2(c11, res + 3 * TB, s0 ? sr + 3 * TB : sr + 2 * TB);
                    else if (two) chain_add(c01, res + TB), chain_add(c11, res + 3 * TB);
                }
            }
        }
    }
    _tile_release();
    /* out[m][n] = even chain + odd chain: a tile's sums [n][m] (in res),
     * then each activation row's 16 outputs gathered from its column */
    const __m512i colv = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    for (int64_t p = 0; p < np; p++) {
        if (!ok[p]) continue;
        const float *e = chains + p * cs, *o = chains + (np + p) * cs;
        for (int64_t rt = 0; rt < RT; rt++)
            for (int i = 0; i < 2; i++) {
                const int64_t n0 = (p0 + p) * TP + i * TR;
                if (n0 >= N) continue;
                const float *et = e + (rt * 2 + i) * TB, *ot = o + (rt * 2 + i) * TB;
                for (int r = 0; r < TR; r++)
                    _mm512_store_ps(res + r * TR, _mm512_add_ps(_mm512_load_ps(et + r * TR), _mm512_load_ps(ot + r * TR)));
                const __mmask16 cols = N - n0 >= TR ? 0xffff : (__mmask16)((1u << (N - n0)) - 1);
                for (int c = 0; c < TR && rt * TR + c < M; c++)
                    _mm512_mask_storeu_ps(j->out + (rt * TR + c) * N + n0, cols,
                                          _mm512_i32gather_ps(_mm512_add_epi32(colv, _mm512_set1_epi32(c)), res, 4));
            }
    }
    atomic_fetch_add_explicit(&amx_units, np, memory_order_relaxed);
}

/* Pieces [c0, c1): piece c is panels [c·P/C, (c+1)·P/C), at most PPAN. */
static void amx_pieces(void *ctx, int64_t c0, int64_t c1, int thread) {
    amx_job *j = ctx;
    for (int64_t c = c0; c < c1; c++)
        amx_panels(j, c * j->panels / j->pieces, (c + 1) * j->panels / j->pieces, thread);
}

int di_gemm_mxfp4_amx(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                      const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    const int64_t KB = K / 32;
    int ea_min, ea_max;
    /* qa·sa normal (2^-9·sa >= 2^-126) and finite (sa <= 2^100) */
    if (M <= 0 || N <= 0 || K % 32 || !di_cpu_scale_exps(sa, M * KB, &ea_min, &ea_max) || ea_min < -117 ||
        ea_max > 100)
        return 0;
    const int threads = di_threadpool_size(tp);
    const int64_t RT = (M + TR - 1) / TR, tiles = RT * KB;
    /* per thread: the results, the decoded weights, the chains */
    const int64_t sf = 8 * TB + 2 * PPAN * CB * TB + 2 * PPAN * RT * 2 * TB;
    /* one buffer the calling thread keeps (kernels.h): the B tiles, the
     * small codes' tiles, the threads' scratch, the small-code flags */
    const int64_t nx = tiles * TB; /* floats: a B tile is TB·4 bytes */
    int own = 0;
    float *buf = di_cpu_kept_buffer(sizeof(float) * (size_t)(2 * nx + threads * sf) + (size_t)tiles, &own);
    if (!buf) return 0;
    amx_job j = {.qa = qa, .sa = sa, .w = w, .ws = ws, .M = M, .K = K, .KB = KB, .N = N, .RT = RT,
                 .ea_min = ea_min, .ea_max = ea_max, .xb = (uint16_t *)buf, .xs = (uint16_t *)(buf + nx),
                 .has_small = (uint8_t *)(buf + 2 * nx + threads * sf), .out = out, .scratch = buf + 2 * nx,
                 .sf = sf};
    atomic_init(&j.nan, 0);
    di_threadpool_for(M * K >= (1 << 16) ? tp : NULL, tiles, 16, pack_tiles, &j);
    if (atomic_load(&j.nan)) {
        if (own) free(buf);
        return 0;
    }
    j.panels = (N + TP - 1) / TP;
    j.pieces = di_cpu_panel_pieces(j.panels, PPAN, threads);
    di_threadpool_for(tp, j.pieces, 1, amx_pieces, &j);
    if (own) free(buf);
    return 1;
}

#endif
