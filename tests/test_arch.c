/* test_arch.c - config.json -> architecture descriptor for every target
 * architecture, alternate key spellings, defaults and bad configs. */
#include "helpers.h"

#include "core/json.h"
#include "model/arch.h"

static enum sp_status parse(const char *text, struct sp_arch *a) {
    cJSON *c;
    enum sp_status st = sp_json_parse(text, strlen(text), "config.json", &c);
    if (st != SP_OK) return st;
    st = sp_arch_from_config(c, a);
    cJSON_Delete(c);
    return st;
}

static enum sp_status parse_file(const char *name, struct sp_arch *a) {
    char path[256];
    snprintf(path, sizeof path, "tools/tiny/%s.json", name);
    cJSON *c;
    assert_int_equal(sp_json_parse_file(path, 1 << 20, &c), SP_OK);
    enum sp_status st = sp_arch_from_config(c, a);
    cJSON_Delete(c);
    return st;
}

static void test_bailing(void **state) {
    struct sp_arch a;
    assert_int_equal(parse_file("bailing_moe", &a), SP_OK);
    assert_int_equal(a.id, SP_ARCH_BAILING_MOE);
    assert_true(a.fused_qkv && a.qk_norm && !a.qkv_bias);
    assert_int_equal(a.rope.rot_dims, 16);  // head_dim 32 x partial_rotary_factor 0.5
    assert_int_equal(a.router, SP_ROUTER_SIGMOID_GROUP_TOPK);
    assert_int_equal(a.n_group, 4);
    assert_int_equal(a.topk_group, 2);
    assert_int_equal(a.n_shared_experts, 1);
    assert_float_equal(a.routed_scale, 2.5, 0);
    assert_true(a.norm_topk_prob);
    assert_false(a.layer_moe[0]);  // first_k_dense_replace 1
    assert_true(a.layer_moe[1] && a.layer_moe[2]);
    sp_arch_free(&a);
    assert_int_equal(parse("{\"model_type\":\"bailing_moe\",\"vocab_size\":8,\"hidden_size\":16,\"intermediate_size\":8,"
                           "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_experts\":4,\"num_experts_per_tok\":2,"
                           "\"moe_intermediate_size\":8,\"first_k_dense_replace\":0,\"score_function\":\"softmax\"}", &a), SP_OK);
    assert_int_equal(a.head_dim, 128);  // Ling's config class default
    assert_int_equal(a.router, SP_ROUTER_SOFTMAX_GROUP_TOPK);
    assert_int_equal(a.n_group, 1);
    sp_arch_free(&a);
}

static void test_qwen3_moe(void **state) {
    struct sp_arch a;
    assert_int_equal(parse_file("qwen3_moe", &a), SP_OK);
    assert_int_equal(a.router, SP_ROUTER_SOFTMAX_TOPK);
    assert_true(a.qk_norm && a.norm_topk_prob);
    assert_int_equal(a.n_experts, 16);
    sp_arch_free(&a);
    /* transformers 5 spellings: num_local_experts, rope_parameters; mlp_only_layers; sparse step */
    assert_int_equal(parse("{\"model_type\":\"qwen3_moe\",\"vocab_size\":8,\"hidden_size\":16,\"intermediate_size\":8,"
                           "\"num_hidden_layers\":4,\"num_attention_heads\":2,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
                           "\"moe_intermediate_size\":8,\"decoder_sparse_step\":2,\"mlp_only_layers\":[3],"
                           "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000.0}}", &a), SP_OK);
    assert_int_equal(a.n_experts, 4);
    assert_float_equal(a.rope.theta, 5000.0, 0);
    assert_false(a.layer_moe[0]);
    assert_true(a.layer_moe[1]);
    assert_false(a.layer_moe[2]);
    assert_false(a.layer_moe[3]);
    assert_int_equal(a.head_dim, 8);
    sp_arch_free(&a);
}

static void test_gpt_oss(void **state) {
    struct sp_arch a;
    assert_int_equal(parse_file("gpt_oss", &a), SP_OK);
    assert_true(a.attn_sinks && a.qkv_bias && a.o_bias && a.router_bias);
    assert_int_equal(a.router, SP_ROUTER_TOPK_SOFTMAX);
    assert_int_equal(a.act, SP_ACT_SWIGLU_CLAMP);
    assert_float_equal(a.swiglu_limit, 7.0, 0);
    assert_int_equal(a.rope.kind, SP_ROPE_YARN);
    assert_false(a.rope.truncate);
    assert_int_equal(a.rope.orig_max_pos, 4096);
    assert_float_equal(a.rope.factor, 32.0, 0);
    assert_true(a.layer_sliding[0]);
    assert_false(a.layer_sliding[1]);
    assert_int_equal(a.sliding_window, 128);
    assert_int_equal(a.d_expert, 128);
    assert_int_equal(a.d_ff, 0);
    sp_arch_free(&a);
}

static void test_dense(void **state) {
    struct sp_arch a;
    assert_int_equal(parse_file("llama", &a), SP_OK);
    assert_int_equal(a.rope.kind, SP_ROPE_LLAMA3);
    assert_float_equal(a.rope.factor, 8.0, 0);
    assert_int_equal(a.rope.orig_max_pos, 8192);
    assert_false(a.tie_embeddings);
    assert_int_equal(a.head_dim, 32);
    for (int64_t l = 0; l < a.n_layers; l++) assert_false(a.layer_moe[l]);
    sp_arch_free(&a);
    assert_int_equal(parse_file("qwen3", &a), SP_OK);
    assert_true(a.qk_norm && a.tie_embeddings);
    sp_arch_free(&a);
    assert_int_equal(parse("{\"model_type\":\"llama\",\"vocab_size\":8,\"hidden_size\":16,\"intermediate_size\":8,"
                           "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rope_scaling\":{\"type\":\"linear\",\"factor\":4}}", &a),
                     SP_OK);
    assert_int_equal(a.rope.kind, SP_ROPE_LINEAR);
    assert_int_equal(a.n_kv_heads, 2);
    sp_arch_free(&a);
}

static void expect_error(const char *cfg, enum sp_status want, const char *needle) {
    struct sp_arch a;
    enum sp_status st = parse(cfg, &a);
    if (st != want || !strstr(sp_error_msg(), needle))
        fail_msg("%s: got %d \"%s\", wanted %d with \"%s\"", cfg, st, sp_error_msg(), want, needle);
}

#define BASE "\"vocab_size\":8,\"hidden_size\":16,\"intermediate_size\":8,\"num_hidden_layers\":2,\"num_attention_heads\":2"

static void test_errors(void **state) {
    expect_error("{\"model_type\":\"mamba\"}", SP_ERR_UNSUPPORTED, "unknown model_type \"mamba\" (supported: bailing_moe, bailing_hybrid, qwen3_moe, qwen3_5_moe, gpt_oss, qwen3, llama)");
    expect_error("{\"model_type\":\"qwen3_next\"}", SP_ERR_UNSUPPORTED, "recognised but not supported yet");
    /* Qwen3.5: the wrapper's text_config, layer kinds, linear-attention heads */
    struct sp_arch a;
    assert_int_equal(parse("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{" BASE ",\"num_experts\":4,"
                           "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"shared_expert_intermediate_size\":12,"
                           "\"full_attention_interval\":2,\"head_dim\":8,\"linear_num_key_heads\":2,\"linear_num_value_heads\":6,"
                           "\"linear_key_head_dim\":4,\"linear_value_head_dim\":2}}", &a), SP_OK);
    assert_int_equal(a.id, SP_ARCH_QWEN3_5_MOE);
    assert_int_equal(a.n_layers, 2);
    assert_int_equal(a.layer_kind[0], SP_LAYER_GATED_DELTA);
    assert_int_equal(a.layer_kind[1], SP_LAYER_ATTENTION);
    assert_int_equal(a.rope.rot_dims, 2);  // partial_rotary_factor 0.25 by default
    assert_int_equal(a.d_shared, 12);
    assert_true(a.attn_gate && a.norm_offset && a.shared_gate && sp_arch_recurrent(&a));
    assert_int_equal(sp_arch_state_floats(&a, 0), 3 * (2 * 2 * 4 + 6 * 2) + 6 * 4 * 2);
    assert_int_equal(sp_arch_state_floats(&a, 1), 0);
    sp_arch_free(&a);
    expect_error("{\"model_type\":\"qwen3_5_moe\",\"text_config\":{" BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,"
                 "\"moe_intermediate_size\":8,\"linear_num_key_heads\":4,\"linear_num_value_heads\":6}}",
                 SP_ERR_FORMAT, "value heads a multiple of key heads");
    /* Ling 2.6: Lightning layers with the last of each group MLA */
    assert_int_equal(parse("{\"model_type\":\"bailing_hybrid\",\"vocab_size\":8,\"hidden_size\":16,\"intermediate_size\":8,"
                           "\"num_attention_heads\":2,\"num_hidden_layers\":5,\"head_dim\":8,\"layer_group_size\":2,"
                           "\"partial_rotary_factor\":0.5,"
                           "\"group_norm_size\":2,\"kv_lora_rank\":4,\"q_lora_rank\":6,\"qk_nope_head_dim\":4,"
                           "\"qk_rope_head_dim\":4,\"v_head_dim\":8,\"num_experts\":4,\"num_experts_per_tok\":2,"
                           "\"moe_intermediate_size\":8}", &a), SP_OK);
    const enum sp_layer_kind kinds[5] = {SP_LAYER_LIGHTNING, SP_LAYER_MLA, SP_LAYER_LIGHTNING, SP_LAYER_MLA, SP_LAYER_MLA};
    for (int64_t L = 0; L < 5; L++) assert_int_equal(a.layer_kind[L], kinds[L]);
    assert_int_equal(a.n_kv_heads, 2);  // Lightning: keys and values a head each
    assert_int_equal(sp_arch_state_floats(&a, 0), 2 * 8 * 8);
    int64_t heads, kv_heads, hd;
    sp_arch_attention_heads(&a, &heads, &kv_heads, &hd);
    assert_true(heads == 2 && kv_heads == 1 && hd == 4 + 4);  // MLA: one latent head of rope + kv_lora
    sp_arch_free(&a);
    expect_error("{\"model_type\":\"bailing_hybrid\",\"vocab_size\":8,\"hidden_size\":16,\"intermediate_size\":8,"
                 "\"num_attention_heads\":2,\"num_hidden_layers\":2,\"head_dim\":8,\"qk_rope_head_dim\":2,"
                 "\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8}",
                 SP_ERR_FORMAT, "qk_rope_head_dim 2 (which the rotary dims 8 must equal)");
    expect_error("{\"model_type\":\"qwen3_5_moe_text\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,"
                 "\"moe_intermediate_size\":8,\"layer_types\":[\"linear_attention\",\"mamba\"]}",
                 SP_ERR_UNSUPPORTED, "\"layer_types\"[1]");
    expect_error("{\"hidden_size\":4}", SP_ERR_FORMAT, "no \"model_type\"");
    expect_error("{\"model_type\":7}", SP_ERR_FORMAT, "\"model_type\": expected a string, got a number");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"num_key_value_heads\":3}", SP_ERR_FORMAT, "not a multiple of num_key_value_heads");
    expect_error("{\"model_type\":\"llama\",\"vocab_size\":8,\"hidden_size\":\"16\"}", SP_ERR_FORMAT, "\"hidden_size\": expected an integer, got a string");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}}", SP_ERR_UNSUPPORTED, "rope scaling type \"dynamic\"");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":-1}}", SP_ERR_FORMAT, "must be positive");
    expect_error("{\"model_type\":\"llama\",\"vocab_size\":8,\"hidden_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":2}", SP_ERR_FORMAT, "\"intermediate_size\"");
    expect_error("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":8,\"moe_intermediate_size\":8}", SP_ERR_FORMAT, "exceeds num_experts");
    expect_error("{\"model_type\":\"bailing_moe\"," BASE ",\"head_dim\":8,\"num_experts\":6,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"n_group\":4,\"topk_group\":2}", SP_ERR_FORMAT, "n_group");
    expect_error("{\"model_type\":\"bailing_moe\"," BASE ",\"head_dim\":8,\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"partial_rotary_factor\":2}", SP_ERR_FORMAT, "partial_rotary_factor");
    expect_error("{\"model_type\":\"bailing_moe\"," BASE ",\"head_dim\":8,\"num_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"score_function\":\"relu\"}", SP_ERR_UNSUPPORTED, "score_function");
    expect_error("{\"model_type\":\"gpt_oss\"," BASE ",\"num_local_experts\":4,\"num_experts_per_tok\":2,\"layer_types\":[\"full_attention\"]}", SP_ERR_FORMAT, "layer_types");
    expect_error("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,\"mlp_only_layers\":[5]}", SP_ERR_FORMAT, "mlp_only_layers");
    expect_error("{\"model_type\":\"llama\",\"num_hidden_layers\":-3}", SP_ERR_FORMAT, "num_hidden_layers");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"max_position_embeddings\":0}", SP_ERR_FORMAT, "\"max_position_embeddings\": 0 must be positive");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"max_position_embeddings\":-8}", SP_ERR_FORMAT, "\"max_position_embeddings\"");
    /* cJSON reads an overflowing number as an infinity */
    expect_error("{\"model_type\":\"llama\"," BASE ",\"rope_theta\":-1e999}", SP_ERR_FORMAT, "\"rope_theta\": -inf must be positive and finite");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"rope_theta\":1e999}", SP_ERR_FORMAT, "\"rope_theta\": inf must be positive");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"rope_theta\":0}", SP_ERR_FORMAT, "\"rope_theta\": 0 must be positive");
    expect_error("{\"model_type\":\"qwen3\"," BASE ",\"rope_parameters\":{\"rope_theta\":-5}}", SP_ERR_FORMAT, "\"rope_theta\": -5");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":1e999}}", SP_ERR_FORMAT, "finite");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"rms_norm_eps\":1e999}", SP_ERR_FORMAT, "\"rms_norm_eps\": inf");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":8}", SP_ERR_FORMAT, "\"eos_token_id\": 8 is outside the vocabulary (vocab_size 8)");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":[1,-1]}", SP_ERR_FORMAT, "\"eos_token_id\": -1 is outside the vocabulary");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":\"2\"}", SP_ERR_FORMAT, "\"eos_token_id\": expected a token id");
    expect_error("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":[1.5]}", SP_ERR_FORMAT, "\"eos_token_id\": expected integer token ids");
}

static void test_eos(void **state) {
    struct sp_arch a;
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":[7,0,3]}", &a), SP_OK);
    assert_int_equal(a.n_eos, 3);
    assert_int_equal(a.eos[0], 7);
    assert_int_equal(a.eos[2], 3);
    sp_arch_free(&a);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":null}", &a), SP_OK);
    assert_int_equal(a.n_eos, 0);
    sp_arch_free(&a);
    assert_int_equal(parse("{\"model_type\":\"llama\"," BASE ",\"eos_token_id\":5}", &a), SP_OK);
    assert_int_equal(a.n_eos, 1);
    assert_int_equal(a.eos[0], 5);
    sp_arch_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bailing), cmocka_unit_test(test_qwen3_moe), cmocka_unit_test(test_gpt_oss),
        cmocka_unit_test(test_dense),   cmocka_unit_test(test_errors), cmocka_unit_test(test_eos),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
