/*
 * qtype.h - weight formats: the traits table (DESIGN.md §4) and the scalar
 * reference dequantize / dot / quantize of every format. The reference is
 * the specification that SIMD and CUDA kernels are tested against.
 *
 * A weight matrix is a struct sp_qmat: `rows` outputs of `cols` inputs,
 * stored as codes (or plain floats) plus, for quantized formats, one scale
 * (and for affine one bias) per `group` consecutive elements of a row, the
 * way MLX lays them out (../shared/specs/mlx-quant-format.md).
 *
 *     struct sp_qmat m = {.type = SP_QTYPE_AFFINE4, .group = 64, .rows = R, .cols = C,
 *                         .codes = w, .scales = s, .biases = b, .scale_dtype = SP_DTYPE_BF16};
 *     float y = sp_qmat_dot_row_ref(&m, r, x);     // x has C floats
 *
 * Adding a format is adding a row to SP_QTYPE_LIST and its three functions.
 */
#ifndef SP_QUANT_QTYPE_H
#define SP_QUANT_QTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "quant/dtype.h"

/* X(enum suffix, name, mode or NULL, bits per element, fixed group (0: 32/64/128), has biases,
 *   block bytes): MLX's formats keep codes, scales and biases in arrays of
 *   their own (block bytes 0); ggml's block formats keep each block of
 *   `group` elements whole, its scales inside it, in the codes alone. */
#define SP_QTYPE_LIST(X)                                                       \
    X(F32, "f32", NULL, 32, 1, false, 0)                                       \
    X(F16, "f16", NULL, 16, 1, false, 0)                                       \
    X(BF16, "bf16", NULL, 16, 1, false, 0)                                     \
    X(AFFINE2, "affine2", "affine", 2, 0, true, 0)                             \
    X(AFFINE3, "affine3", "affine", 3, 0, true, 0)                             \
    X(AFFINE4, "affine4", "affine", 4, 0, true, 0)                             \
    X(AFFINE5, "affine5", "affine", 5, 0, true, 0)                             \
    X(AFFINE6, "affine6", "affine", 6, 0, true, 0)                             \
    X(AFFINE8, "affine8", "affine", 8, 0, true, 0)                             \
    X(MXFP4, "mxfp4", "mxfp4", 4, 32, false, 0)                                \
    X(MXFP8, "mxfp8", "mxfp8", 8, 32, false, 0)                                \
    X(NVFP4, "nvfp4", "nvfp4", 4, 16, false, 0)                                \
    X(Q2_K, "q2_k", "q2_k", 2, 256, false, 84)                                 \
    X(Q3_K, "q3_k", "q3_k", 3, 256, false, 110)                                \
    X(Q4_K, "q4_k", "q4_k", 4, 256, false, 144)                               \
    X(Q5_K, "q5_k", "q5_k", 5, 256, false, 176)                               \
    X(Q6_K, "q6_k", "q6_k", 6, 256, false, 210)                               \
    X(IQ4_NL, "iq4_nl", "iq4_nl", 4, 32, false, 18)                            \
    X(IQ4_XS, "iq4_xs", "iq4_xs", 4, 256, false, 136)

enum sp_qtype {
#define SP_X(e, name, mode, bits, group, biases, block) SP_QTYPE_##e,
    SP_QTYPE_LIST(SP_X)
#undef SP_X
        SP_QTYPE_COUNT
};

struct sp_qmat;

struct sp_qtype_traits {
    const char *name;  // "affine4"
    const char *mode;  // mlx "mode" of config.json; NULL for plain floats
    int bits;          // bits per stored element
    int group;         // elements per scale; 0 = chosen per tensor (affine); 1 = no scales
    bool has_biases;
    /* ggml block formats: bytes of a whole block of `group` elements,
     * scales included (no scales or biases arrays); 0 for the others */
    int block_bytes;
    /* Fixed dtype of the scales (U8 for E8M0/E4M3 scales); SP_DTYPE_COUNT
     * when they take the model dtype (affine: F32, F16 or BF16). */
    enum sp_dtype scale_dtype;
    /* Dequantizes columns [col0, col0 + n) of one row (col0 group-aligned). */
    void (*dequant)(const struct sp_qmat *m, int64_t row, int64_t col0, int64_t n, float *out);
    /* Quantizes n values (a multiple of the group) into codes, scales and
     * biases laid out as one row of the format (block formats: codes only). */
    void (*quantize_row)(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                         enum sp_dtype scale_dtype);
};

const struct sp_qtype_traits *sp_qtype_traits(enum sp_qtype t);
const char *sp_qtype_name(enum sp_qtype t);
bool sp_qtype_from_name(const char *name, enum sp_qtype *out);
/* The quantized type for an mlx mode and bit width ("affine", 4 -> AFFINE4). */
enum sp_status sp_qtype_from_mode(const char *mode, int bits, enum sp_qtype *out);
bool sp_qtype_is_quantized(enum sp_qtype t);

/* One (rows x cols) weight matrix in some format; borrowed views. Rows are
 * `row_bytes` apart in codes; scales/biases rows are cols/group elements.
 *
 * Interleaved (4-bit codes only, sp_qmat_interleavable): the same bytes in
 * blocks of SP_QMAT_BLOCK_ROWS rows, so that a vector of 16 lanes holds the
 * same columns of 16 rows. Block b (rows 16b ..) takes the place of its rows
 * in each array: in codes, 4 bytes (8 columns) of each of its rows in turn,
 * row i's at byte 4i of each 64; in scales and biases, group g of its rows
 * side by side, row i's at element 16g + i. */
#define SP_QMAT_BLOCK_ROWS 16
struct sp_qmat {
    enum sp_qtype type;
    int group;  // elements per scale group (1 for plain floats)
    int64_t rows, cols;
    const void *codes;  // (rows, row_bytes): packed codes or plain floats
    const void *scales;  // (rows, cols/group) of scale_dtype; NULL for plain floats
    const void *biases;  // (rows, cols/group) of scale_dtype; affine only
    enum sp_dtype scale_dtype;
    bool interleaved;  // in blocks of SP_QMAT_BLOCK_ROWS rows (above)
};

/* Bytes of codes in one row of `cols` elements. */
size_t sp_qtype_row_bytes(enum sp_qtype t, int64_t cols);
/* Total bytes (codes + scales + biases) of a rows x cols matrix. */
size_t sp_qtype_matrix_bytes(enum sp_qtype t, int group, enum sp_dtype scale_dtype, int64_t rows, int64_t cols);
/* Checks that cols and group suit the format; names the problem otherwise. */
enum sp_status sp_qtype_check_shape(enum sp_qtype t, int group, int64_t cols);

/* Whether m (row order) can be interleaved: affine4 or mxfp4, whole
 * blocks of rows. */
bool sp_qmat_interleavable(const struct sp_qmat *m);
/* m (row order, interleavable) interleaved into codes, scales and biases
 * (NULL for mxfp4) of m's sizes; *out views them. */
void sp_qmat_interleave(const struct sp_qmat *m, void *codes, void *scales, void *biases, struct sp_qmat *out);
/* The same where m's arrays are (writable memory), a block at a time
 * through tmp (sp_qmat_block_bytes); *out views them, interleaved. */
void sp_qmat_interleave_in_place(const struct sp_qmat *m, void *tmp, struct sp_qmat *out);
/* Block b of interleaved m in row order: its rows' codes, scales and biases
 * (NULL for mxfp4) into buffers of SP_QMAT_BLOCK_ROWS rows; *out views them
 * as a matrix of those rows. */
void sp_qmat_block_rows(const struct sp_qmat *m, int64_t b, void *codes, void *scales, void *biases,
                        struct sp_qmat *out);
/* sp_qmat_block_rows without the codes (out->codes NULL): for a caller
 * that moves those its own way. */
void sp_qmat_block_groups(const struct sp_qmat *m, int64_t b, void *scales, void *biases, struct sp_qmat *out);
/* Room for what sp_qmat_block_rows writes for m (codes, scales, biases). */
size_t sp_qmat_block_bytes(const struct sp_qmat *m);

/* Reference operations (scalar, exact to float rounding; any layout). */
void sp_qmat_dequant_row_ref(const struct sp_qmat *m, int64_t row, float *out);
void sp_qmat_dequant_cols_ref(const struct sp_qmat *m, int64_t row, int64_t col0, int64_t n, float *out);
/* Dot product of row `row` with x (cols floats), accumulated in double. */
float sp_qmat_dot_row_ref(const struct sp_qmat *m, int64_t row, const float *x);
/* Quantizes one row with mlx's rounding rules (see the spec). */
void sp_qtype_quantize_row_ref(enum sp_qtype t, const float *x, int64_t n, int group, void *codes, void *scales,
                               void *biases, enum sp_dtype scale_dtype);

/* Element decoders shared with kernels. */
extern const float sp_e2m1_values[16];  // E2M1 code -> value (code 8 = -0.0)
float sp_e8m0_to_float(uint8_t s);      // 2^(s-127); s == 255 gives +inf as mlx does
float sp_e4m3_to_float(uint8_t x);      // E4M3FN (0x7f decodes to 480 as mlx does)
uint8_t sp_float_to_e4m3(float v);      // round to nearest even, saturating at 448
uint8_t sp_float_to_e2m1(float y);      // nearest code, ties to even, sign from signbit
uint8_t sp_float_to_e8m0(float amax_over_max);  // round(log2(x)) + 127, clamped; 127 for 0
extern const int8_t sp_iq4_values[16];  // IQ4_NL / IQ4_XS code -> value (ggml's kvalues_iq4nl)

/* Extracts element i (0-based) of a row of b-bit codes packed LSB-first. */
static inline uint32_t sp_unpack_bits(const uint8_t *row, int64_t i, int b) {
    uint64_t bit = (uint64_t)i * (uint64_t)b;
    const uint8_t *p = row + (bit >> 3);
    unsigned shift = (unsigned)(bit & 7);
    /* b <= 8 and shift <= 7 span at most two bytes. */
    uint32_t v = p[0];
    if (shift + (unsigned)b > 8) v |= (uint32_t)p[1] << 8;
    return (v >> shift) & ((1u << b) - 1);
}

#endif
