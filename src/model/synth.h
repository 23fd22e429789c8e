/*
 * synth.h - synthetic models: a loadable model folder (config.json +
 * safetensors in the Hugging Face layout of its architecture) with random
 * weights of the exact shapes a config.json describes. Used by the tests,
 * the demo and the benchmarks to have real shapes offline.
 *
 *     struct sp_synth_opts o = {.dtype = SP_DTYPE_BF16, .seed = 1};
 *     if (sp_synth_write(config_json, "build/tiny-ling", &o) != SP_OK) ...
 *
 * Weights are streamed to disk in chunks: any size can be written.
 */
#ifndef SP_MODEL_SYNTH_H
#define SP_MODEL_SYNTH_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "core/pool.h"
#include "core/status.h"
#include "quant/dtype.h"

struct sp_synth_opts {
    enum sp_dtype dtype;  // F32, F16 or BF16
    uint64_t seed;
    size_t shard_bytes;  // 0: one file
    int64_t layers;      // > 0: override num_hidden_layers (fit large shapes in memory)
    float init_std;      // 0: 0.02
    bool balanced_routing;  // tokens spread over the experts as a trained router spreads them (below)
    bool sparse;         // no data: files of the right size made of holes (shapes only, for planning)
    struct sp_pool *pool;  // threads that make the values (NULL: the caller alone); same files either way
};

/* Routing. With every matrix at std 0.02 (the embeddings too), a random
 * attention layer's output (about the mean of the values before a token,
 * much the same for every late token) outweighs the token's own embedding,
 * so from the second layer on most tokens take the same few experts: in a
 * 256-token chunk of 4-layer Qwen3-30B-A3B shapes 15 to 51 of the 128
 * experts took any token, about ten of them 69 tokens or more (some all
 * 256); and random expert biases (Ling's, gpt-oss's) of std 0.1 outweigh a
 * small model's spread of router scores. A trained router
 * instead keeps every expert busy, about n x top-k / experts tokens each,
 * which is what benchmarks of prefill and of expert streaming must see.
 * balanced_routing gives that: embeddings of std 1, which keep each token's
 * hidden state its own through the layers, and router biases of zero,
 * leaving the selection to the random router. */

/* Writes config.json (the given config, with num_hidden_layers overridden if
 * asked) and the weights into dir (created if needed). */
enum sp_status sp_synth_write(const cJSON *config, const char *dir, const struct sp_synth_opts *opts);

#endif
