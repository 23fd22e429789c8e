/*
 * model.h - an opened model: its files, architecture descriptor,
 * quantization config and role table, validated against each other, and
 * typed views of its weights.
 *
 *     struct sp_model *m;
 *     if (sp_model_open("path/to/folder", &m) != SP_OK) puts(sp_error_msg());
 *     struct sp_linear q;
 *     sp_model_linear(m, 0, SP_ROLE_ATTN_Q, -1, &q);   // q.w is (out, in)
 *     struct sp_vector n;
 *     sp_model_vector(m, 0, SP_ROLE_ATTN_NORM, &n);
 *     sp_model_close(m);
 *
 * Opening reads headers only and checks that every tensor the descriptor
 * needs exists with the right shape, dtype and quantization. Views borrow
 * from the model's mappings and are valid until sp_model_close.
 */
#ifndef SP_MODEL_MODEL_H
#define SP_MODEL_MODEL_H

#include "backend/backend.h"
#include "format/modeldir.h"
#include "format/qconfig.h"
#include "model/arch.h"
#include "model/weights.h"
#include "quant/qtype.h"

struct sp_progress;

struct sp_model {
    struct sp_model_files *files;
    struct sp_arch arch;
    struct sp_qconfig qcfg;
    struct sp_weights weights;
    bool has_expert_bias;   // router selection bias present (bailing)
    bool has_lm_head;       // false: logits use the embedding (tied)
    bool fused_gate_up;     // experts store gate and up as one matrix
    bool norm_plus_one;     // RMSNorm weights are stored as w of a (1 + w) scale (arch.norm_offset, unless
                            // mlx-lm's conversion stored 1 + w already, as its conv1d layout tells)
};

/* Opens a model folder (a Hugging Face id is resolved to one first: sp_model_resolve). */
enum sp_status sp_model_open(const char *dir, struct sp_model **out);
void sp_model_close(struct sp_model *m);
/* Maps every weight file into memory now (sp_map_populate), for a model the
 * plan keeps resident: its first forward pass then takes no page faults.
 * pr (may be NULL) counts the bytes of the files that are not copies
 * already (sp_model_copy_in counted those). */
enum sp_status sp_model_populate(const struct sp_model *m, struct sp_progress *pr);
struct sp_model_copy {
    size_t copied;       // bytes of the files copied
    size_t interleaved;  // bytes of the matrices interleaved in the copies
    int64_t matrices;    // how many (a stacked tensor of experts is one)
};
/* Replaces weight files' maps by anonymous copies at the same addresses
 * (sp_map_to_anon): views into them stay valid. A file is copied where
 * huge_pages is set and it is 2 MiB or more, to be in anonymous 2 MiB
 * pages (whatever pages the page cache holds it in); and where `want` (not
 * NULL) takes one of its matrices, whose arrays all lie in the file: the
 * matrices it takes are interleaved in the copy (sp_qmat.interleaved; the
 * slots' row_blocks tell sp_model_linear). On failure the files not copied
 * stay mapped and readable, in row order. pr (may be NULL) counts the
 * bytes copied. */
enum sp_status sp_model_copy_in(struct sp_model *m, bool huge_pages, sp_interleave_fn want,
                                struct sp_model_copy *out, struct sp_progress *pr);
/* Bytes of the weights in 2 MiB pages now (sp_map_huge_bytes): the
 * files' maps, and what a file made when opened (a GGUF's repacked blocks). */
size_t sp_model_huge_bytes(const struct sp_model *m);
/* Bytes of the weights held in anonymous memory: the files' copies
 * (sp_map_to_anon) and what a file made when opened. */
size_t sp_model_copied_bytes(const struct sp_model *m);
/* Bytes of the files' maps that are still read (sp_map_live_bytes): what a
 * load brings in. */
size_t sp_model_mapped_bytes(const struct sp_model *m);

/* Whether slot s holds a block format's codes (quant/qtype.h's
 * block_bytes): U8 codes without scales of a module the config quantizes
 * so; *p its parameters. */
bool sp_model_slot_blocks(const struct sp_model *m, const struct sp_wslot *s, struct sp_qparams *p);

/* The linear layer of (layer, role, expert); expert is -1 for non-expert
 * roles and 0..E-1 for routed experts. */
enum sp_status sp_model_linear(const struct sp_model *m, int64_t layer, enum sp_role role, int64_t expert,
                               struct sp_linear *out);
enum sp_status sp_model_vector(const struct sp_model *m, int64_t layer, enum sp_role role, struct sp_vector *out);

/* The shape the architecture expects for a role: (rows, cols) for matrices
 * as (out, in), (n, 0) for vectors. */
void sp_model_expected_shape(const struct sp_arch *a, enum sp_role role, int64_t *rows, int64_t *cols);

#endif
