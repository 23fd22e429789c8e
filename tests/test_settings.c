/*
 * test_settings.c - the settings (core/settings.h): defaults, the
 * environment's variables, flags over them, the folders' conventions, and
 * errors that name the variable or the flag.
 */
#include "helpers.h"

#include "core/settings.h"

/* Settings from the variables given, which must load. */
static void load_ok(struct sp_settings *s, char *const *env) {
    if (sp_settings_load(s, env) != SP_OK) fail_msg("%s", sp_error_msg());
}

static void test_defaults(void **state) {
    char *env[] = {"HOME=/home/u", NULL};
    struct sp_settings s;
    load_ok(&s, env);
    assert_string_equal(s.kernels, "");
    assert_int_equal(s.precision, SP_PRECISION_FAST);
    assert_int_equal(s.io, SP_IO_AUTO);
    assert_int_equal(s.expert_policy, SP_EXPERT_POLICY_ARC);
    assert_false(s.no_prefetch);
    assert_false(s.mmap);
    assert_false(s.row_order);
    assert_false(s.no_cpu_experts);
    assert_false(s.cuda_graphs);
    assert_int_equal(s.kernels_from, SP_ORIGIN_DEFAULT);
    assert_int_equal(s.precision_from, SP_ORIGIN_DEFAULT);
    assert_string_equal(s.hf_hub_cache, "/home/u/.cache/huggingface/hub");
    assert_string_equal(s.cache_dir, "/home/u/.cache/sparrow");
    assert_string_equal(s.tmp_dir, "/tmp");
    /* no environment at all */
    load_ok(&s, NULL);
    assert_string_equal(s.hf_hub_cache, "/.cache/huggingface/hub");
    assert_string_equal(s.cache_dir, "/tmp/.cache/sparrow");
}

static void test_environment(void **state) {
    char *env[] = {"SPARROW_KERNELS=avx2f", "SPARROW_IO=pread",      "SPARROW_EXPERT_POLICY=clock", "SPARROW_PREFETCH=0",
                   "SPARROW_MMAP=1",        "SPARROW_ROW_ORDER=yes", "TMPDIR=/scratch",             "SPARROW_CPU_EXPERTS=0",
                   "SPARROW_CUDA_GRAPHS=1", "SPARROW_CUDA_OVERLAP=0", "SPARROW_DEVICES=2,0",
                   "SPARROW_EXPERT_LOAD=/data/routing.json", "SPARROW_RECORD_ROUTING=", NULL};
    struct sp_settings s;
    load_ok(&s, env);
    assert_string_equal(s.expert_load, "/data/routing.json");
    assert_string_equal(s.record_routing, "");  // empty: unset
    assert_int_equal(s.n_devices, 2);
    assert_true(s.devices[0] == 2 && s.devices[1] == 0);
    /* a launcher's ranks: none set, one process; set, checked */
    assert_true(s.world_size == 1 && s.rank == 0 && s.master_port == 29500);
    assert_string_equal(s.master_addr, "127.0.0.1");
    char *launched[] = {"WORLD_SIZE=3", "RANK=2", "MASTER_ADDR=node7", "MASTER_PORT=1234", NULL};
    load_ok(&s, launched);
    assert_true(s.world_size == 3 && s.rank == 2 && s.local_rank == 2 && s.master_port == 1234);
    assert_string_equal(s.master_addr, "node7");
    char *local[] = {"WORLD_SIZE=4", "RANK=3", "LOCAL_RANK=1", NULL};
    load_ok(&s, local);
    assert_true(s.rank == 3 && s.local_rank == 1);
    const char *bad_ranks[][3] = {{"WORLD_SIZE=0", "RANK=0", "WORLD_SIZE"}, {"WORLD_SIZE=2", "RANK=2", "RANK"},
                                  {"WORLD_SIZE=2x", "RANK=0", "WORLD_SIZE"}, {"WORLD_SIZE=65", "RANK=0", "WORLD_SIZE"},
                                  {"MASTER_PORT=0", "RANK=0", "MASTER_PORT"}, {"WORLD_SIZE=2", "RANK=-1", "RANK"}};
    for (size_t i = 0; i < sizeof bad_ranks / sizeof *bad_ranks; i++) {
        char *e[] = {(char *)bad_ranks[i][0], (char *)bad_ranks[i][1], NULL};
        assert_int_equal(sp_settings_load(&s, e), SP_ERR_ARG);
        assert_non_null(strstr(sp_error_msg(), bad_ranks[i][2]));
    }
    load_ok(&s, env);
    assert_string_equal(s.kernels, "avx2f");
    assert_int_equal(s.kernels_from, SP_ORIGIN_ENV);
    assert_int_equal(s.io, SP_IO_PREAD);
    assert_int_equal(s.expert_policy, SP_EXPERT_POLICY_CLOCK);
    assert_true(s.no_prefetch);
    assert_true(s.mmap);
    assert_true(s.row_order);
    assert_true(s.no_cpu_experts);
    assert_true(s.cuda_graphs);
    assert_true(s.no_cuda_overlap);
    assert_string_equal(s.tmp_dir, "/scratch");
    /* "0" and "" are off for on-switches; prefetch is off only at "0" */
    char *off[] = {"SPARROW_MMAP=0", "SPARROW_ROW_ORDER=", "SPARROW_PREFETCH=1",
                   "SPARROW_IO=",    "SPARROW_KERNELS=",   "SPARROW_CUDA_OVERLAP=1", "SPARROW_CPU_EXPERTS=1", NULL};
    load_ok(&s, off);
    assert_false(s.no_cuda_overlap);
    assert_false(s.no_cpu_experts);
    assert_false(s.mmap);
    assert_false(s.row_order);
    assert_false(s.no_prefetch);
    assert_int_equal(s.io, SP_IO_AUTO);
    assert_string_equal(s.kernels, "");
    assert_int_equal(s.kernels_from, SP_ORIGIN_DEFAULT);
    /* a name that merely starts like a variable's is another variable */
    char *prefix[] = {"SPARROW_IOX=pread", "SPARROW_I=pread", NULL};
    load_ok(&s, prefix);
    assert_int_equal(s.io, SP_IO_AUTO);
    char *exact[] = {"SPARROW_PRECISION=exact", "SPARROW_EXPERT_POLICY=lru", "SPARROW_IO=buffered", NULL};
    load_ok(&s, exact);
    assert_int_equal(s.precision, SP_PRECISION_EXACT);
    assert_int_equal(s.precision_from, SP_ORIGIN_ENV);
    assert_int_equal(s.expert_policy, SP_EXPERT_POLICY_LRU);
    assert_int_equal(s.io, SP_IO_BUFFERED);
}

/* A bad value is an error naming the variable and the choices. */
static void test_environment_errors(void **state) {
    struct sp_settings s;
    char *io[] = {"SPARROW_IO=uring", NULL};
    assert_int_equal(sp_settings_load(&s, io), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "SPARROW_IO: expected auto, buffered, pread or mapped, got \"uring\"");
    char *policy[] = {"SPARROW_EXPERT_POLICY=fifo", NULL};
    assert_int_equal(sp_settings_load(&s, policy), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "SPARROW_EXPERT_POLICY: expected arc, lru or clock, got \"fifo\"");
    char *precision[] = {"SPARROW_PRECISION=float", NULL};
    assert_int_equal(sp_settings_load(&s, precision), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "SPARROW_PRECISION: expected fast or exact, got \"float\"");
    char *both[] = {"SPARROW_KERNELS=avx2", "SPARROW_PRECISION=exact", NULL};
    assert_int_equal(sp_settings_load(&s, both), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "SPARROW_KERNELS and SPARROW_PRECISION"));
    char name[64], *longer[] = {name, NULL};
    snprintf(name, sizeof name, "SPARROW_KERNELS=%040d", 0);
    assert_int_equal(sp_settings_load(&s, longer), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "SPARROW_KERNELS: no kernel set is called"));
    static char tmp[SP_SETTINGS_PATH_MAX + 16];
    char *long_tmp[] = {tmp, NULL};
    memset(tmp, 'a', sizeof tmp - 1);
    memcpy(tmp, "TMPDIR=/", 8);
    assert_int_equal(sp_settings_load(&s, long_tmp), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "TMPDIR"));
}

/* The Hugging Face cache: HF_HUB_CACHE, else HF_HOME/hub, else
 * XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; sparrow's
 * cache: XDG_CACHE_HOME/sparrow, else ~/.cache/sparrow. */
static void test_folders(void **state) {
    struct sp_settings s;
    char *all[] = {"HOME=/h", "XDG_CACHE_HOME=/x", "HF_HOME=/hf", "HF_HUB_CACHE=/hub", NULL};
    load_ok(&s, all);
    assert_string_equal(s.hf_hub_cache, "/hub");
    assert_string_equal(s.cache_dir, "/x/sparrow");
    all[3] = "HF_HUB_CACHE=";  // empty: unset
    load_ok(&s, all);
    assert_string_equal(s.hf_hub_cache, "/hf/hub");
    all[2] = "HF_HOMEX=/hf";
    load_ok(&s, all);
    assert_string_equal(s.hf_hub_cache, "/x/huggingface/hub");
    all[1] = "XDG_CACHE_HOME=";
    load_ok(&s, all);
    assert_string_equal(s.hf_hub_cache, "/h/.cache/huggingface/hub");
    assert_string_equal(s.cache_dir, "/h/.cache/sparrow");
}

static void test_flags(void **state) {
    char *env[] = {"SPARROW_IO=pread", "SPARROW_KERNELS=avx2", NULL};
    struct sp_settings s;
    load_ok(&s, env);
    bool takes;
    assert_true(sp_settings_is_flag("--io", &takes) && takes);
    assert_true(sp_settings_is_flag("--kernels", &takes) && takes);
    assert_true(sp_settings_is_flag("--mmap", &takes) && !takes);
    assert_true(sp_settings_is_flag("--no-prefetch", &takes) && !takes);
    assert_false(sp_settings_is_flag("--io=pread", &takes));
    assert_false(sp_settings_is_flag("--threads", &takes));
    /* a flag overrides its variable */
    assert_int_equal(sp_settings_set(&s, "--io", "buffered"), SP_OK);
    assert_int_equal(s.io, SP_IO_BUFFERED);
    assert_int_equal(sp_settings_set(&s, "--expert-policy", "lru"), SP_OK);
    assert_int_equal(s.expert_policy, SP_EXPERT_POLICY_LRU);
    assert_int_equal(sp_settings_set(&s, "--no-prefetch", NULL), SP_OK);
    assert_true(s.no_prefetch);
    assert_int_equal(sp_settings_set(&s, "--mmap", NULL), SP_OK);
    assert_true(s.mmap);
    assert_int_equal(sp_settings_set(&s, "--row-order", NULL), SP_OK);
    assert_true(s.row_order);
    /* --no-cpu-experts turns the default off; --cpu-experts, the default, back on */
    assert_int_equal(sp_settings_set(&s, "--no-cpu-experts", NULL), SP_OK);
    assert_true(s.no_cpu_experts);
    assert_int_equal(sp_settings_set(&s, "--cpu-experts", NULL), SP_OK);
    assert_false(s.no_cpu_experts);
    s.cuda_graphs = false;
    assert_int_equal(sp_settings_set(&s, "--cuda-graphs", NULL), SP_OK);
    assert_true(s.cuda_graphs);
    assert_int_equal(sp_settings_set(&s, "--no-cuda-overlap", NULL), SP_OK);
    assert_true(s.no_cuda_overlap);
    /* --devices: distinct GPU numbers below 64, separated by commas */
    assert_int_equal(sp_settings_set(&s, "--devices", "0,1,63"), SP_OK);
    assert_true(s.n_devices == 3 && s.devices[2] == 63);
    const char *bad[][2] = {{"0,0", "GPU 0 given twice"}, {"a", "expected GPU numbers"}, {"0,64", "GPU 64 is past 63"},
                            {"0,", "expected GPU numbers"}, {"", "expected GPU numbers"}, {"-1", "expected GPU numbers"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(sp_settings_set(&s, "--devices", bad[i][0]), SP_ERR_ARG);
        assert_non_null(strstr(sp_error_msg(), bad[i][1]));
        assert_non_null(strstr(sp_error_msg(), "--devices"));
    }
    assert_int_equal(sp_settings_set(&s, "--devices", NULL), SP_ERR_ARG);
    assert_int_equal(s.n_devices, 3);  // what was set stays
    /* the routing files: a name each */
    assert_int_equal(sp_settings_set(&s, "--record-routing", "out.json"), SP_OK);
    assert_string_equal(s.record_routing, "out.json");
    assert_int_equal(sp_settings_set(&s, "--expert-load", ""), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "--expert-load needs a file's name"));
    assert_int_equal(sp_settings_set(&s, "--expert-load", NULL), SP_ERR_ARG);
    char longname[SP_SETTINGS_PATH_MAX + 1];
    memset(longname, 'a', SP_SETTINGS_PATH_MAX);
    longname[SP_SETTINGS_PATH_MAX] = 0;
    assert_int_equal(sp_settings_set(&s, "--expert-load", longname), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "a file name of more than"));
    takes = false;
    assert_true(sp_settings_is_flag("--expert-load", &takes) && takes);
    /* --precision over SPARROW_KERNELS: the variable's set is dropped */
    assert_int_equal(sp_settings_set(&s, "--precision", "exact"), SP_OK);
    assert_int_equal(s.precision, SP_PRECISION_EXACT);
    assert_string_equal(s.kernels, "");
    /* but not with --kernels on the same command line, in either order */
    assert_int_equal(sp_settings_set(&s, "--kernels", "avx2f"), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "--kernels and --precision"));
    load_ok(&s, env);
    assert_int_equal(sp_settings_set(&s, "--kernels", "portable"), SP_OK);
    assert_string_equal(s.kernels, "portable");
    assert_int_equal(s.kernels_from, SP_ORIGIN_FLAG);
    assert_int_equal(sp_settings_set(&s, "--precision", "fast"), SP_ERR_ARG);
    /* --kernels over SPARROW_PRECISION */
    char *exact[] = {"SPARROW_PRECISION=exact", NULL};
    load_ok(&s, exact);
    assert_int_equal(sp_settings_set(&s, "--kernels", "avx2"), SP_OK);
    assert_int_equal(s.precision, SP_PRECISION_FAST);
    assert_string_equal(s.kernels, "avx2");
}

/* A bad flag value is an error naming the flag and the choices. */
static void test_flag_errors(void **state) {
    struct sp_settings s;
    load_ok(&s, NULL);
    assert_int_equal(sp_settings_set(&s, "--io", "direct"), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "--io: expected auto, buffered, pread or mapped, got \"direct\"");
    assert_int_equal(s.io, SP_IO_AUTO);
    assert_int_equal(sp_settings_set(&s, "--expert-policy", ""), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "--expert-policy: expected arc, lru or clock, got \"\"");
    assert_int_equal(sp_settings_set(&s, "--precision", "EXACT"), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "--precision: expected fast or exact, got \"EXACT\"");
    assert_int_equal(sp_settings_set(&s, "--kernels", ""), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "--kernels"));
    assert_int_equal(sp_settings_set(&s, "--io", NULL), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "--io needs a value");
    assert_int_equal(sp_settings_set(&s, "--mmap", "1"), SP_ERR_ARG);
    assert_string_equal(sp_error_msg(), "--mmap takes no value");
    assert_int_equal(sp_settings_set(&s, "--threads", "2"), SP_ERR_ARG);
    assert_false(s.mmap);
}

static void test_names(void **state) {
    assert_string_equal(sp_io_method_name(SP_IO_PREAD), "pread");
    assert_string_equal(sp_expert_policy_name(SP_EXPERT_POLICY_CLOCK), "clock");
    assert_string_equal(sp_precision_name(SP_PRECISION_EXACT), "exact");
    assert_string_equal(sp_io_method_name(SP_IO_COUNT), "?");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults), cmocka_unit_test(test_environment), cmocka_unit_test(test_environment_errors),
        cmocka_unit_test(test_folders),  cmocka_unit_test(test_flags),       cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
