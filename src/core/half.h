/*
 * half.h - IEEE half (f16) and bfloat16 conversions, scalar and exact.
 * f32 -> bf16/f16 round to nearest even; NaN stays NaN.
 */
#ifndef SP_CORE_HALF_H
#define SP_CORE_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t sp_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float sp_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float sp_bf16_to_f32(uint16_t h) { return sp_bits_f32((uint32_t)h << 16); }

static inline uint16_t sp_f32_to_bf16(float f) {
    uint32_t u = sp_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float sp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return sp_bits_f32(sign);
        /* subnormal: man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) return sp_bits_f32(sign | 0x7f800000u | (man << 13));
    return sp_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t sp_f32_to_f16(float f) {
    uint32_t u = sp_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;  // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00;  // rounds to inf (>= 65520)
    if (a < 0x38800000u) {                       // below f16's smallest normal 2^-14
        if (a < 0x33000000u) return sign;        // below half of the smallest subnormal
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);        // 14 + (113 - exp) ... bits to drop
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);  // round to nearest even at bit 13
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

#endif
