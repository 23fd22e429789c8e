/*
 * sampler.c - time of one sampled token over a real vocabulary (151936
 * logits, Qwen3's), for the settings users run: greedy, the defaults
 * (top-k 40, top-p 0.95, min-p 0.05), and top-k off with top-p, min-p or
 * no cut. Two shapes of logits: "peaked" (20 tokens far above a Gaussian
 * rest, most of the mass in them, as a trained model's), and "flat" (a
 * Gaussian alone: top-p reaches deep into the vocabulary). The decode
 * step of a small MoE model takes 10-20 ms on 2 cores; the sampler should
 * cost a small part of that.
 *
 *     build/bench/sampler
 *
 * One machine-readable line per result (the time includes copying the
 * logits, which the sampler modifies):
 *
 *     sampler vocab=151936 logits=peaked setting=default us=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/rng.h"
#include "runtime/sampler.h"

#define VOCAB 151936

struct setting {
    const char *name;
    int32_t top_k;
    float top_p, min_p, temp;
};

int main(void) {
    const struct setting settings[] = {
        {"greedy", 40, 0.95f, 0.05f, 0.0f},       {"default", 40, 0.95f, 0.05f, 0.8f},
        {"top_p_0.95", 0, 0.95f, 0.0f, 0.8f},     {"min_p_0.05", 0, 1.0f, 0.05f, 0.8f},
        {"no_cut", 0, 1.0f, 0.0f, 1.0f},
    };
    float *base = malloc(VOCAB * sizeof *base), *l = malloc(VOCAB * sizeof *l);
    if (!base || !l) return 2;
    for (int shape = 0; shape < 2; shape++) {
        struct sp_rng rng;
        sp_rng_seed(&rng, 3);
        for (int64_t i = 0; i < VOCAB; i++) base[i] = sp_rng_normal(&rng) * 2.0f;
        if (shape == 0)
            for (int i = 0; i < 20; i++) base[sp_rng_next(&rng) % VOCAB] += 16.0f;
        for (size_t c = 0; c < sizeof settings / sizeof *settings; c++) {
            struct sp_sampler_params p = sp_sampler_defaults();
            p.top_k = settings[c].top_k;
            p.top_p = settings[c].top_p;
            p.min_p = settings[c].min_p;
            p.temp = settings[c].temp;
            p.seed = 1;
            struct sp_sampler *s;
            if (sp_sampler_create(&p, VOCAB, &s) != SP_OK) return 2;
            int64_t draws = 0, sum = 0;
            double t0 = sp_now_s(), el;
            do {
                memcpy(l, base, VOCAB * sizeof *l);
                sum += sp_sampler_sample(s, l);
                draws++;
                el = sp_now_s() - t0;
            } while (el < 0.3 && draws < 100000);
            printf("sampler vocab=%d logits=%s setting=%s us=%.1f draws=%lld\n", VOCAB, shape ? "flat" : "peaked",
                   settings[c].name, el / (double)draws * 1e6, (long long)draws);
            fflush(stdout);
            sp_sampler_free(s);
            if (sum < 0) return 2;
        }
    }
    free(base);
    free(l);
    return 0;
}
