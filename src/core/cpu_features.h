/* What the host CPU can do, asked once at run time, so one binary built for
 * baseline x86-64 picks its AVX2/FMA kernels only where they can run. */
#ifndef DI_CORE_CPU_FEATURES_H
#define DI_CORE_CPU_FEATURES_H

/* 1 when AVX2, FMA and F16C are all usable (x86-64 only; 0 elsewhere). */
int di_cpu_has_avx2(void);
/* 1 when, on top of di_cpu_has_avx2(), AVX-512 F, DQ, BW and VL are usable:
 * the CPU has them and the OS saves the opmask and 512-bit register state. */
int di_cpu_has_avx512(void);
/* 1 when, on top of di_cpu_has_avx512(), AVX-512 VNNI is there (the 16-bit
 * multiply-add that also accumulates, vpdpwssd). */
int di_cpu_has_avx512_vnni(void);
/* 1 when, on top of di_cpu_has_avx512(), AVX-512 VBMI is there (vpermb:
 * bytes picked from a 64-byte table). */
int di_cpu_has_avx512_vbmi(void);
/* 1 when, on top of di_cpu_has_avx2(), AVX-VNNI is there: vpdpbusd and
 * vpdpwssd on 256-bit vectors, VEX-encoded (Intel cores since Alder Lake
 * and Sierra Forest, which lack AVX-512; AMD Zen 5). */
int di_cpu_has_avx_vnni(void);
/* 1 when, on top of di_cpu_has_avx512(), AMX tiles with bf16 products are
 * usable: the CPU has AMX-TILE and AMX-BF16, the OS manages the tile state
 * (XCR0 bits 17 and 18) and, on Linux, grants this process the tile data
 * (asked for on the first call: the kernel hands it out on request only). */
int di_cpu_has_amx_bf16(void);
/* Online logical CPUs available to this process (at least 1). */
int di_cpu_count(void);
/* "avx2+fma+f16c+avx512", "avx2+fma+f16c" or "scalar": for `deepinfer info` and benchmark headers. */
const char *di_cpu_describe(void);

#endif
