/* Run-time CPU feature detection (see cpu_features.h). */
#include "core/cpu_features.h"

#include <sched.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#endif

int di_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    /* FMA (ecx 12), OSXSAVE (27), AVX (28), F16C (29) */
    const unsigned need1 = (1u << 12) | (1u << 27) | (1u << 28) | (1u << 29);
    if ((c & need1) != need1) return 0;
    /* The OS must save the XMM and YMM state (XCR0 bits 1 and 2). */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6u) != 6u) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1u; /* AVX2 */
#else
    return 0;
#endif
}

int di_cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (!di_cpu_has_avx2()) return 0; /* also checks OSXSAVE and leaf 7 */
    /* The OS must save the opmask registers and both halves of the 32 zmm
     * registers (XCR0 bits 5, 6, 7) besides XMM and YMM (1, 2). */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xe6u) != 0xe6u) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    /* AVX512F (ebx 16), AVX512DQ (17), AVX512BW (30), AVX512VL (31) */
    const unsigned need7 = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    return (b & need7) == need7;
#else
    return 0;
#endif
}

int di_cpu_has_avx512_vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (!di_cpu_has_avx512()) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 11) & 1u; /* AVX512_VNNI (ecx 11) */
#else
    return 0;
#endif
}

int di_cpu_has_avx512_vbmi(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (!di_cpu_has_avx512()) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 1) & 1u; /* AVX512_VBMI (ecx 1) */
#else
    return 0;
#endif
}

int di_cpu_has_avx_vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (!di_cpu_has_avx2()) return 0; /* also checks the YMM state and leaf 7 */
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    if (a < 1) return 0; /* no subleaf 1 */
    __cpuid_count(7, 1, a, b, c, d);
    return (a >> 4) & 1u; /* AVX-VNNI (leaf 7 subleaf 1, eax 4) */
#else
    return 0;
#endif
}

int di_cpu_has_amx_bf16(void) {
#if defined(__x86_64__) && defined(__linux__)
    if (!di_cpu_has_avx512()) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return 0; /* AMX-BF16 (edx 22), AMX-TILE (24) */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if (((xlo >> 17) & 3u) != 3u) return 0; /* XTILECFG, XTILEDATA */
    /* Linux traps the first tile instruction of a process that has not
     * asked (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); it may refuse,
     * e.g. where a thread's alternate signal stack is too small for the
     * larger state. */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

int di_cpu_count(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

const char *di_cpu_describe(void) {
    if (di_cpu_has_avx512()) return "avx2+fma+f16c+avx512";
    return di_cpu_has_avx2() ? "avx2+fma+f16c" : "scalar";
}
