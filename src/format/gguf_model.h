/*
 * gguf_model.h - a GGUF model (one file, or shards name-00001-of-0000N.gguf)
 * opened as the model loader opens a Hugging Face folder: its metadata
 * becomes the config.json that Hugging Face's own files would hold, and its
 * tensors take Hugging Face's names, each shard a safetensors-like file over
 * the GGUF's mapping (sp_st_file), so that the architecture descriptor,
 * the weights' roles, the planner and the expert store read it unchanged.
 *
 *     struct sp_model_files *mf;
 *     if (sp_model_files_open("model.gguf", &mf) != SP_OK) ...   // modeldir.h calls this
 *
 * Architectures: llama (Llama-family GGUFs as llama.cpp's converter writes
 * them: the q and k rows of each head are reordered back from its
 * interleaved rotary pairs to Hugging Face's halves, into memory the file
 * owns), qwen3 and qwen3moe (stacked experts, ffn_*_exps, as mlx-lm's
 * SwitchGLU: the expert store reads them one expert at a time; a layer
 * without a router is dense; rope_freqs.weight, Llama 3's RoPE scaling as
 * llama.cpp computes it, becomes the "factors" scaling), gpt-oss (its
 * biases, sinks, post-attention norm, router bias and split ffn_gate_exps /
 * ffn_up_exps with their biases as SwitchGLU's; every other layer sliding
 * from the first, as llama.cpp has it; YaRN from rope.scaling.*; a fused
 * ffn_gate_up_exps is refused by name), bailingmoe2 (Ling 2.0: fused
 * attn_qkv, q / k norms, shared experts ffn_*_shexp, exp_probs_b as the
 * router's expert bias, group routing and its gating function, leading
 * dense layers, the rotated part of a head as partial_rotary_factor; its
 * MTP blocks past the model's are left out). Tensor types: F32, F16 and BF16 as they are
 * in the mapping; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and MXFP4 repacked exactly, at open,
 * into MLX's affine 8-, 5- and 4-bit and mxfp4 (group 32), in memory the
 * file owns, so the CPU and CUDA products read them (a copy of those
 * weights: they are not streamed from the file by the expert cache); the
 * K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K and IQ4_NL and IQ4_XS as they
 * are: sparrow's q2_k .. q6_k / iq4_nl / iq4_xs blocks, the file's bytes
 * (only q / k rows that RoPE's order needs moved are copied). Anything else
 * is refused with a message naming the
 * key or tensor.
 */
#ifndef SP_FORMAT_GGUF_MODEL_H
#define SP_FORMAT_GGUF_MODEL_H

#include <stdbool.h>

#include "core/status.h"

struct sp_model_files;

/* Whether path names a GGUF file (by its suffix, any case). */
bool sp_gguf_model_path(const char *path);
/* Whether path is such a name of an existing regular file. */
bool sp_gguf_model_file(const char *path);

/* Fills mf (its dir already set to path; everything else empty) from the
 * GGUF model at path. On failure mf holds what was made so far, for
 * sp_model_files_close. */
enum sp_status sp_gguf_model_open(const char *path, struct sp_model_files *mf);

#endif
