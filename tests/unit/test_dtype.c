/* Exhaustive tests of the scalar dtype conversions (architecture.md §8.3). */
#include "test.h"
#include "core/dtype.h"

static void test_bf16_roundtrip_all(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = di_bf16_to_f32((uint16_t)h);
        uint16_t back = di_f32_to_bf16(f);
        if (isnan(f)) { if (!isnan(di_bf16_to_f32(back))) bad++; continue; }
        if (back != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_bf16_rounding(void) {
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1. */
    CHECK_EQ_INT(di_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even). */
    CHECK_EQ_INT(di_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    CHECK_EQ_INT(di_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CHECK_EQ_INT(di_f32_to_bf16(INFINITY), 0x7f80);
    CHECK(isnan(di_bf16_to_f32(di_f32_to_bf16(NAN))));
}

static void test_f16_roundtrip_all(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = di_f16_to_f32((uint16_t)h);
        uint16_t back = di_f32_to_f16(f);
        if (isnan(f)) { if (!isnan(di_f16_to_f32(back))) bad++; continue; }
        if (back != h) bad++;
    }
    CHECK_EQ_INT(di_f16_to_f32(0x3c00), 1);
    CHECK(di_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(di_f16_to_f32(0x7bff) == 65504.0f);
    CHECK_EQ_INT(bad, 0);
}

/* f32 -> f16 rounding checked against the midpoints of every adjacent pair. */
static void test_f16_midpoints(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float lo = di_f16_to_f32((uint16_t)h), hi = di_f16_to_f32((uint16_t)(h + 1));
        double mid = ((double)lo + (double)hi) / 2;
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (di_f32_to_f16((float)mid) != want) bad++;
        if (di_f32_to_f16(nextafterf((float)mid, 0)) != h) bad++;
        if (di_f32_to_f16(nextafterf((float)mid, INFINITY)) != h + 1) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(di_f32_to_f16(65520.0f), 0x7c00);
    CHECK_EQ_INT(di_f32_to_f16(65519.0f), 0x7bff);
}

static void test_e4m3_decode(void) {
    CHECK(di_e4m3_to_f32(0x00) == 0.0f);
    CHECK(di_e4m3_to_f32(0x01) == 0x1p-9f);          /* smallest subnormal */
    CHECK(di_e4m3_to_f32(0x08) == 0x1p-6f);          /* smallest normal */
    CHECK(di_e4m3_to_f32(0x38) == 1.0f);
    CHECK(di_e4m3_to_f32(0x7e) == 448.0f);
    CHECK(di_e4m3_to_f32(0xfe) == -448.0f);
    CHECK(isnan(di_e4m3_to_f32(0x7f)));
    CHECK(isnan(di_e4m3_to_f32(0xff)));
    int nans = 0;
    for (int b = 0; b < 256; b++) nans += isnan(di_e4m3_to_f32((uint8_t)b)) ? 1 : 0;
    CHECK_EQ_INT(nans, 2); /* E4M3FN has no infinities and only two NaNs */
}

static void test_e4m3_roundtrip_and_midpoints(void) {
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        float f = di_e4m3_to_f32((uint8_t)b);
        if (isnan(f)) continue;
        uint8_t back = di_f32_to_e4m3(f);
        if (back != b && !(f == 0.0f && (back & 0x7f) == 0)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* Midpoints between positive neighbours round to the even code. */
    bad = 0;
    for (int b = 0; b < 0x7e; b++) {
        float lo = di_e4m3_to_f32((uint8_t)b), hi = di_e4m3_to_f32((uint8_t)(b + 1));
        float mid = (lo + hi) / 2; /* exact in f32 */
        uint8_t want = (b & 1) ? (uint8_t)(b + 1) : (uint8_t)b;
        if (di_f32_to_e4m3(mid) != want) bad++;
        if (di_f32_to_e4m3(-mid) != (want | 0x80)) bad++;
        if (di_f32_to_e4m3(nextafterf(mid, 0)) != b) bad++;
        if (di_f32_to_e4m3(nextafterf(mid, INFINITY)) != b + 1) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(di_f32_to_e4m3(464.0f), 0x7e);   /* tie between 448 and "480": even */
    CHECK_EQ_INT(di_f32_to_e4m3(470.0f), 0x7f);   /* beyond: NaN, as PyTorch */
    CHECK_EQ_INT(di_f32_to_e4m3(-1e9f), 0xff);
    CHECK_EQ_INT(di_f32_to_e4m3(NAN) & 0x7f, 0x7f);
    CHECK_EQ_INT(di_f32_to_e4m3(0x1p-11f), 0x00); /* quarter of the smallest subnormal */
}

static void test_e8m0(void) {
    int bad = 0;
    for (int b = 0; b < 255; b++) {
        float f = di_e8m0_to_f32((uint8_t)b);
        if (f != ldexpf(1.0f, b - 127)) bad++;
        if (di_f32_to_e8m0(f) != b) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(isnan(di_e8m0_to_f32(0xff)));
    CHECK_EQ_INT(di_f32_to_e8m0(3.0f), 128 + 1);  /* rounds up to 4 */
    CHECK_EQ_INT(di_f32_to_e8m0(0.75f), 127);     /* rounds up to 1 */
    CHECK_EQ_INT(di_f32_to_e8m0(INFINITY), 0xff);
    CHECK_EQ_INT(di_f32_to_e8m0(0.0f), 0);
}

static void test_e2m1(void) {
    static const float grid[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
    for (int c = 0; c < 16; c++) {
        float want = (c & 8) ? -grid[c & 7] : grid[c & 7];
        CHECK(di_e2m1_to_f32((uint8_t)c) == want);
        CHECK_EQ_INT(di_f32_to_e2m1(want), (c == 8) ? 8 : c);
    }
    /* RNE ties to the even code, as architecture.md §2 lists them. */
    CHECK_EQ_INT(di_f32_to_e2m1(0.25f), 0);
    CHECK_EQ_INT(di_f32_to_e2m1(0.75f), 2);
    CHECK_EQ_INT(di_f32_to_e2m1(1.25f), 2);
    CHECK_EQ_INT(di_f32_to_e2m1(1.75f), 4);
    CHECK_EQ_INT(di_f32_to_e2m1(2.5f), 4);
    CHECK_EQ_INT(di_f32_to_e2m1(3.5f), 6);
    CHECK_EQ_INT(di_f32_to_e2m1(5.0f), 6);
    CHECK_EQ_INT(di_f32_to_e2m1(-5.0f), 14);
    CHECK_EQ_INT(di_f32_to_e2m1(100.0f), 7);  /* saturates */
    CHECK_EQ_INT(di_f32_to_e2m1(0.26f), 1);
    /* Every f32 near each midpoint: below rounds down, above rounds up. */
    static const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int i = 0; i < 7; i++) {
        CHECK_EQ_INT(di_f32_to_e2m1(nextafterf(mids[i], 0)), i);
        CHECK_EQ_INT(di_f32_to_e2m1(nextafterf(mids[i], INFINITY)), i + 1);
    }
}

static void test_dtype_names(void) {
    for (int t = DI_DTYPE_INVALID + 1; t < DI_DTYPE_COUNT; t++) {
        const char *n = di_dtype_name((di_dtype)t);
        CHECK_EQ_INT(di_dtype_from_name(n, strlen(n)), t);
        CHECK(di_dtype_size((di_dtype)t) > 0);
    }
    CHECK_EQ_INT(di_dtype_from_name("F8_E4M3X", 8), DI_DTYPE_INVALID);
    CHECK_EQ_INT(di_dtype_from_name("F8_E4M3", 6), DI_DTYPE_INVALID);
    CHECK_EQ_INT(di_dtype_size(DI_DTYPE_F8_E8M0), 1);
    CHECK_EQ_INT(di_dtype_size(DI_DTYPE_BF16), 2);
}

int main(void) {
    RUN(test_bf16_roundtrip_all);
    RUN(test_bf16_rounding);
    RUN(test_f16_roundtrip_all);
    RUN(test_f16_midpoints);
    RUN(test_e4m3_decode);
    RUN(test_e4m3_roundtrip_and_midpoints);
    RUN(test_e8m0);
    RUN(test_e2m1);
    RUN(test_dtype_names);
    return test_summary();
}
