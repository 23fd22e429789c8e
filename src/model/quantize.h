/*
 * quantize.h - writes an MLX-layout copy of a model in another weight
 * format, the way `mlx_lm.convert -q` lays it out: routed experts stacked
 * [E, out, in] under mlp.switch_mlp (gpt-oss: mlp.experts, with gate and up
 * de-interleaved), routers in 8-bit affine with group 64 recorded as
 * per-module entries, embeddings and lm_head quantized with the global
 * parameters, norms and 1-D parameters copied, a module whose input width is
 * not a multiple of the group left unquantized. Scales and biases take the
 * source weight's float dtype.
 *
 *     struct sp_quantize_opts o = {.type = SP_QTYPE_AFFINE4, .group = 64};
 *     sp_quantize_model(model, "out_dir", &o);
 *
 * With a plain float type (f32, f16, bf16) it writes every weight
 * dequantized to that type, in the same layout, without a quantization section.
 */
#ifndef SP_MODEL_QUANTIZE_H
#define SP_MODEL_QUANTIZE_H

#include "core/pool.h"
#include "model/model.h"

struct sp_quantize_opts {
    enum sp_qtype type;
    int group;           // 0: the format's default (affine 64)
    size_t shard_bytes;  // 0: 5 GB, as mlx-lm
    bool sparse;         // write the layout only: data left as holes (shape-only models for planning)
    struct sp_pool *pool;  // threads that quantize rows (NULL: the caller alone); same output either way
};

enum sp_status sp_quantize_model(const struct sp_model *m, const char *out_dir, const struct sp_quantize_opts *o);

#endif
