/*
 * rng.h - a small, seedable, reproducible generator (xoshiro256**, seeded
 * with splitmix64) for random weights, tests and sampling.
 *
 *     struct sp_rng r;
 *     sp_rng_seed(&r, 42);
 *     float u = sp_rng_uniform(&r);      // [0, 1)
 *     float g = sp_rng_normal(&r);       // N(0, 1)
 */
#ifndef SP_CORE_RNG_H
#define SP_CORE_RNG_H

#include <math.h>
#include <stdint.h>

struct sp_rng {
    uint64_t s[4];
};

static inline uint64_t sp_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void sp_rng_seed(struct sp_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = sp_splitmix64(&seed);
}

static inline uint64_t sp_rng_next(struct sp_rng *r) {
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, 1) with 24 random bits. */
static inline float sp_rng_uniform(struct sp_rng *r) { return (float)(sp_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

/* Standard normal by Box-Muller (one value per call). */
static inline float sp_rng_normal(struct sp_rng *r) {
    double u1 = ((double)(sp_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(sp_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
