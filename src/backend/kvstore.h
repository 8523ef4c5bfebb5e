/* Packed storage formats of the per-sequence caches (architecture.md §2,
 * §5.2–§5.4, §13.2). Every value the forward pass caches has been through a
 * quantize-dequantize step, so the cache may hold the quantized codes and
 * scales instead of fp32 copies; decoding a packed row gives back the very
 * fp32 bits the QDQ step produced (tests/unit/test_kvstore.c).
 *
 * One packed row of n values (n a multiple of the format's block) is the
 * codes of all n values followed by one scale byte per block:
 *
 *   DI_KVQ_FP8       window KV (FP8-QDQ(32)):        n E4M3 bytes, n/32 E8M0
 *   DI_KVQ_FP4_E4M3  compressed KV (FP4-QDQ(16)):     n/2 bytes of E2M1 pairs
 *                                                     (low nibble = even
 *                                                     index), n/16 E4M3
 *   DI_KVQ_FP4_E8M0  index keys (FP4-QDQ(32, e8m0)):  n/2 bytes of E2M1 pairs,
 *                                                     n/32 E8M0
 *
 * Rows are packed from the values before QDQ, as the QDQ steps quantize
 * them: re-quantizing decoded values is lossless for the power-of-two
 * scales but not for E4M3 scales in E4M3's subnormal range, where the scale
 * of a decoded block can round differently.
 *
 * value = code · scale, exact in fp32 (and in bf16). At the real shapes a
 * window row is 528 bytes (Dh 512), a compressed-KV row 288, an index key 68:
 * 890 bytes per token over the 2.5 entries per token of V4.1.
 *
 * The formats are part of the backend interface (backend.h): backends write
 * them with kv_pack and read them in sparse_attn_kv / index_scores_kv. The
 * host functions below are the CPU's implementation and the reference the
 * other backends are tested against. */
#ifndef DI_BACKEND_KVSTORE_H
#define DI_BACKEND_KVSTORE_H

#include <stddef.h>
#include <stdint.h>

typedef enum di_kvq {
    DI_KVQ_FP8 = 0,      /* E4M3 per value, E8M0 per 32 */
    DI_KVQ_FP4_E4M3 = 1, /* E2M1 per value, E4M3 per 16 */
    DI_KVQ_FP4_E8M0 = 2, /* E2M1 per value, E8M0 per 32 */
    DI_KVQ_COUNT
} di_kvq;

/* Values per scale byte. */
static inline int64_t di_kvq_block(di_kvq f) { return f == DI_KVQ_FP4_E4M3 ? 16 : 32; }

/* Bytes of one packed row of n values (n a multiple of di_kvq_block). */
static inline size_t di_kvq_row_bytes(di_kvq f, int64_t n) {
    int64_t codes = f == DI_KVQ_FP8 ? n : n / 2;
    return (size_t)(codes + n / di_kvq_block(f));
}

/* Quantizes n fp32 values into one packed row: the codes and scales of the
 * QDQ step of the format (the CPU backend's qdq_fp8 / qdq_fp4_e4m3 /
 * qdq_fp4_e8m0 give the decoded values). */
void di_kvq_pack(di_kvq f, const float *x, int64_t n, uint8_t *row);
/* Decodes one packed row of n values into fp32. */
void di_kvq_unpack(di_kvq f, const uint8_t *row, int64_t n, float *x);

#endif
