/*
 * cpuid.c - which CPU kernel families this processor and OS can run.
 *
 * An instruction set is usable only if the processor reports it (cpuid) and
 * the OS saves the register state it needs across context switches (XCR0,
 * read with xgetbv once OSXSAVE says we may). The families:
 *
 *   AVX2:   AVX, AVX2, FMA, F16C; XCR0 holds SSE and YMM state.
 *   AVX512: the above plus AVX-512 F, BW, VL, DQ, VNNI and BF16; XCR0 also
 *           holds opmask and both halves of ZMM state.
 *
 * The answer is computed once and cached; it never changes while the process
 * runs. On other architectures only the portable family exists.
 */
#include <stdatomic.h>

#include "../backend.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Bit 0: AVX2 family usable; bit 1: AVX512 family usable. */
static int detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    int fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return 0;
    uint64_t xcr0 = read_xcr0();
    int ymm_os = (xcr0 & 0x6) == 0x6;
    int zmm_os = (xcr0 & 0xe6) == 0xe6;

    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7)
        return 0;
    unsigned b7, c7, d7, a7;
    __cpuid_count(7, 0, a7, b7, c7, d7);
    unsigned a71 = 0, b71, c71, d71;
    if (a7 >= 1)
        __cpuid_count(7, 1, a71, b71, c71, d71);

    int avx2 = (b7 >> 5) & 1;
    int f = (b7 >> 16) & 1, dq = (b7 >> 17) & 1;
    int bw = (b7 >> 30) & 1, vl = (b7 >> 31) & 1;
    int vnni = (c7 >> 11) & 1;
    int bf16 = (a71 >> 5) & 1;

    int flags = 0;
    if (ymm_os && avx2 && fma && f16c)
        flags |= 1;
    if ((flags & 1) && zmm_os && f && bw && vl && dq && vnni && bf16)
        flags |= 2;
    return flags;
}
#else
static int detect(void) { return 0; }
#endif

/* -1 until detected. */
static _Atomic int cached_flags = -1;

static int isa_flags(void)
{
    int f = atomic_load_explicit(&cached_flags, memory_order_relaxed);
    if (f < 0) {
        f = detect();
        atomic_store_explicit(&cached_flags, f, memory_order_relaxed);
    }
    return f;
}

int cinfer_cpu_isa_supported(cinfer_cpu_isa isa)
{
    switch (isa) {
    case CINFER_CPU_ISA_AUTO:
    case CINFER_CPU_ISA_PORTABLE:
        return 1;
    case CINFER_CPU_ISA_AVX2:
        return (isa_flags() & 1) != 0;
    case CINFER_CPU_ISA_AVX512:
        return (isa_flags() & 2) != 0;
    }
    return 0;
}

const char *cinfer_cpu_isa_name(cinfer_cpu_isa isa)
{
    switch (isa) {
    case CINFER_CPU_ISA_AUTO: return "auto";
    case CINFER_CPU_ISA_PORTABLE: return "portable";
    case CINFER_CPU_ISA_AVX2: return "avx2";
    case CINFER_CPU_ISA_AVX512: return "avx512";
    }
    return "?";
}
