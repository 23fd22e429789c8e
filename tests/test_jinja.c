/*
 * test_jinja.c - the Jinja interpreter on its own: expressions, filters,
 * tests, methods, statements and whitespace control against what Python's
 * jinja2 renders (tests/data/jinja/cases.json, from tools/jinja_cases.py),
 * and the failure modes: malformed templates, runtime errors with their line,
 * and the limits that keep hostile templates from hanging or crashing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/json.h"
#include "template/jinja.h"

#define DATA "tests/data/jinja"

/* Compiles and renders src with the members of ctx (an object, or NULL) as
 * variables. Returns the status; *out is the text (caller frees) or NULL. */
static enum sp_status render_opts(const char *src, const cJSON *ctx, const struct sp_jinja_opts *o, char **out) {
    struct sp_jinja *t;
    *out = NULL;
    enum sp_status st = sp_jinja_compile(src, strlen(src), &t);
    if (st != SP_OK) return st;
    struct sp_jinja_var vars[32];
    int64_t n = 0;
    if (ctx)
        for (const cJSON *c = ctx->child; c && n < 32; c = c->next) vars[n++] = (struct sp_jinja_var){c->string, c};
    st = sp_jinja_render(t, vars, n, o, out, NULL);
    sp_jinja_free(t);
    return st;
}

static enum sp_status render(const char *src, char **out) { return render_opts(src, NULL, NULL, out); }

/* Asserts src renders to want (with no variables). */
static void expect(const char *src, const char *want) {
    char *out;
    enum sp_status st = render(src, &out);
    if (st != SP_OK) fail_msg("%s: %s", src, sp_error_msg());
    if (strcmp(out, want) != 0) fail_msg("%s: got \"%s\", want \"%s\"", src, out, want);
    sp_free(out);
}

/* Asserts src fails with status st and a message containing what. */
static void expect_error(const char *src, enum sp_status want_st, const char *what) {
    char *out;
    enum sp_status st = render(src, &out);
    if (st == SP_OK) fail_msg("%s: rendered \"%s\", want an error", src, out);
    assert_null(out);
    if (st != want_st)
        fail_msg("%s: status %s, want %s (%s)", src, sp_status_str(st), sp_status_str(want_st), sp_error_msg());
    if (what && !strstr(sp_error_msg(), what)) fail_msg("%s: error \"%s\" lacks \"%s\"", src, sp_error_msg(), what);
}

static void test_jinja2_cases(void **state) {
    (void)state;
    cJSON *cases, *ctx;
    assert_int_equal(sp_json_parse_file(DATA "/cases.json", 1 << 24, &cases), SP_OK);
    assert_int_equal(sp_json_parse_file(DATA "/context.json", 1 << 20, &ctx), SP_OK);
    int n = 0, bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *src = cJSON_GetObjectItem(c, "template")->valuestring;
        const cJSON *cx = cJSON_GetObjectItem(c, "context");
        const cJSON *want = cJSON_GetObjectItem(c, "output");
        char *out;
        enum sp_status st = render_opts(src, cJSON_IsString(cx) ? ctx : cx, NULL, &out);
        n++;
        if (want && st != SP_OK) {
            print_error("case %d %s\n  failed: %s\n", n, src, sp_error_msg());
            bad++;
        } else if (want && strcmp(out, want->valuestring) != 0) {
            print_error("case %d %s\n  got:  %s\n  want: %s\n", n, src, out, want->valuestring);
            bad++;
        } else if (!want && st == SP_OK) {
            print_error("case %d %s\n  rendered \"%s\", jinja2 raised %s\n", n, src, out,
                        cJSON_GetObjectItem(c, "error")->valuestring);
            bad++;
        }
        sp_free(out);
    }
    assert_true(n > 200);
    assert_int_equal(bad, 0);
    cJSON_Delete(cases);
    cJSON_Delete(ctx);
}

static void test_whitespace(void **state) {
    (void)state;
    expect("", "");
    expect("a\n", "a"); // one trailing newline is dropped (keep_trailing_newline=False)
    expect("a\n\n", "a\n");
    expect("a\r\nb\rc", "a\nb\nc");
    expect("{% if true %}\nx\n{% endif %}\ny", "x\ny"); // trim_blocks
    expect("  {% if true %}x{% endif %}", "x");         // lstrip_blocks
    expect("  {%+ if true %}x{% endif %}", "  x");
    expect("{% if true +%}\nx{% endif %}", "\nx");
    expect("a  {{- 'b' -}}  c", "abc");
    expect("a\n  {# note #}\nb", "a\nb");
    expect("{{ 'x' }}  {% if true %}y{% endif %}", "x  y"); // not at a line start: kept
    expect("{% raw %}{{ x }}{% endraw %}", "{{ x }}");
    expect("{%- if true -%}  \n  x  \n  {%- endif -%}", "x");
}

static void test_python_semantics(void **state) {
    (void)state;
    expect("{{ true }}{{ none }}{{ 1.0 }}{{ 1e20 }}{{ 1e-5 }}{{ 0.1 + 0.2 }}",
           "TrueNone1.01e+201e-050.30000000000000004");
    expect("{{ ['a', \"it's\", none] }}", "['a', \"it's\", None]");
    expect("{{ {'k': [1, (2,)]} | tojson }}", "{\"k\": [1, [2]]}");
    expect("{{ {'k': 'é\\n'} | tojson(indent=2) }}", "{\n  \"k\": \"é\\n\"\n}");
    expect("{{ 'héllo'[1] }}{{ 'héllo' | length }}{{ 'héllo'[::-1] }}", "é5olléh");
    expect("{% for x in [1] %}{% set y = 1 %}{% endfor %}{{ y is defined }}", "False");
    expect("{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", "3");
    expect("{{ {'items': 1}.items() | list }}", "[('items', 1)]");
    expect("{{ u }}{{ u is defined }}{{ u | length }}{{ 'a' in u }}{% for x in u %}!{% endfor %}", "False0False");
    expect("{{ none.x is defined }}", "False");
}

static void test_compile_errors(void **state) {
    (void)state;
    static const struct {
        const char *src, *what;
    } cases[] = {
        {"{{ x | nosuchfilter }}", "no filter named 'nosuchfilter'"},
        {"{{ x is nosuchtest }}", "no test named 'nosuchtest'"},
        {"{% for x in y %}", "endfor"},
        {"{% if x %}\n{% else %}\n{% endfor %}", "line 3"},
        {"{% endif %}", "endif"},
        {"{{ x ", "'}}'"},
        {"{{ 'abc }}", "unterminated string"},
        {"{# never closed", "unterminated comment"},
        {"{% include 'x.j2' %}", "include"},
        {"{{ x y }}", "line 1"},
        {"{{ (1 + }}", "line 1"},
        {"{{ (1 + ) }}", "expected an expression"},
        {"{% set %}", "name"},
        {"{{ x[] }}", "subscript"},
        {"{{ $ }}", "unexpected character"},
        {"{% macro m(1) %}{% endmacro %}", "parameter"},
        {"{% raw %} never ended", "endraw"},
        {"{{ '\\x4' }}", "escape"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sp_jinja *t = (struct sp_jinja *)1;
        enum sp_status st = sp_jinja_compile(cases[i].src, strlen(cases[i].src), &t);
        if (st != SP_ERR_FORMAT && st != SP_ERR_UNSUPPORTED)
            fail_msg("%s: status %s (%s)", cases[i].src, sp_status_str(st), sp_error_msg());
        assert_null(t);
        if (!strstr(sp_error_msg(), cases[i].what) || !strstr(sp_error_msg(), "template line "))
            fail_msg("%s: error \"%s\" lacks \"%s\"", cases[i].src, sp_error_msg(), cases[i].what);
    }
}

static void test_runtime_errors(void **state) {
    (void)state;
    expect_error("a\n\n{{ raise_exception('No messages provided.') }}", SP_ERR_ARG,
                 "template line 3: raise_exception: No messages provided.");
    expect_error("{{ x.y }}", SP_ERR_ARG, "'x' is undefined");
    expect_error("{{ {}.a.b }}", SP_ERR_ARG, "has no attribute 'a'");
    expect_error("{{ 'a' + 1 }}", SP_ERR_ARG, "concatenate");
    expect_error("{{ 2 ** 64 }}", SP_ERR_ARG, "integer overflow"); // integers are 64-bit, not Python's
    expect_error("{{ 9223372036854775807 + 1 }}", SP_ERR_ARG, "integer overflow");
    expect_error("{% break %}", SP_ERR_ARG, "outside of a loop");
    expect_error("{{ 1 | int(0, 99) | tojson(indent='x' * 300) }}", SP_ERR_ARG, "indent");
}

static void test_limits(void **state) {
    (void)state;
    // Nested loops far past the iteration cap stop with an error, quickly.
    expect_error("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
                 "{% endfor %}{% endfor %}{% endfor %}",
                 SP_ERR_LIMIT, "loop iterations");
    expect_error("{{ range(100000000) | length }}", SP_ERR_LIMIT, "range");
    expect_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", SP_ERR_LIMIT, "macro calls nested");
    expect_error("{{ 'x' * 100000000 }}", SP_ERR_LIMIT, "output limit");
    expect_error("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                 "{% endfor %}",
                 SP_ERR_LIMIT, NULL);

    // Values nested past what can be printed, and shared structure that
    // would print (or compare) exponentially: errors, not a crash or a hang.
    expect_error("{% set ns = namespace(x=[]) %}{% for i in range(300000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                 "{{ ns.x }}",
                 SP_ERR_LIMIT, "nested too deeply");
    expect_error("{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
                 "{{ ns.x }}",
                 SP_ERR_LIMIT, "exceeds");
    expect_error("{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
                 "{{ ns.x | tojson }}",
                 SP_ERR_LIMIT, "exceeds");
    expect("{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}"
           "{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.x }}",
           "True");
    struct sp_jinja_opts work = {.max_compare_work = 1000000};
    char *cmp_out;
    assert_int_equal(render_opts("{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(60) %}"
                                 "{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}"
                                 "{{ ns.x == ns.y }}",
                                 NULL, &work, &cmp_out),
                     SP_ERR_LIMIT);
    assert_non_null(strstr(sp_error_msg(), "compares"));

    struct sp_jinja_opts o = {.max_output = 100};
    char *out;
    assert_int_equal(render_opts("{% for i in range(200) %}x{% endfor %}", NULL, &o, &out), SP_ERR_LIMIT);
    assert_null(out);
    struct sp_jinja_opts mem = {.max_memory = 1 << 20};
    assert_int_equal(render_opts("{% for i in range(100000) %}{% set x = [i, i, i] %}{% endfor %}", NULL, &mem, &out),
                     SP_ERR_LIMIT);
    struct sp_jinja_opts iters = {.max_loop_iterations = 10};
    assert_int_equal(
        render_opts("{% for i in range(5) %}{% for j in range(5) %}{% endfor %}{% endfor %}", NULL, &iters, &out),
        SP_ERR_LIMIT);
    assert_int_equal(
        render_opts("{% for i in range(3) %}{% for j in range(2) %}{% endfor %}{% endfor %}", NULL, &iters, &out),
        SP_OK);
    sp_free(out);
}

/* Deeply nested or very long constructs are refused, never followed down
 * the C stack. */
static void test_deep_nesting(void **state) {
    (void)state;
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jinja *t;
    sp_buf_puts(&b, "{{ ");
    for (int i = 0; i < 100000; i++) sp_buf_putc(&b, '(');
    sp_buf_putc(&b, '1');
    for (int i = 0; i < 100000; i++) sp_buf_putc(&b, ')');
    sp_buf_puts(&b, " }}");
    assert_int_equal(sp_jinja_compile(b.data, b.len, &t), SP_ERR_LIMIT);
    sp_buf_clear(&b);
    for (int i = 0; i < 5000; i++) sp_buf_puts(&b, "{% if true %}");
    assert_int_equal(sp_jinja_compile(b.data, b.len, &t), SP_ERR_LIMIT);
    sp_buf_clear(&b);
    sp_buf_puts(&b, "{{ 0");
    for (int i = 0; i < 50000; i++) sp_buf_puts(&b, " + 1");
    sp_buf_puts(&b, " }}");
    char *out;
    assert_int_equal(render(b.data, &out), SP_ERR_LIMIT);
    sp_buf_clear(&b);
    sp_buf_puts(&b, "{{ x");
    for (int i = 0; i < 50000; i++) sp_buf_puts(&b, "|trim");
    sp_buf_puts(&b, " }}");
    assert_int_equal(render(b.data, &out), SP_ERR_LIMIT);
    sp_buf_clear(&b);
    for (int i = 0; i < 50; i++) sp_buf_puts(&b, "{% for x in [1, 2] %}");
    sp_buf_putc(&b, 'x');
    for (int i = 0; i < 50; i++) sp_buf_puts(&b, "{% endfor %}");
    assert_int_equal(render(b.data, &out), SP_ERR_LIMIT); // 2^50 iterations
    sp_buf_free(&b);
}

/* A compiled template renders many times, with different variables. */
static void test_reuse(void **state) {
    (void)state;
    const char *src = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ extra | default('-') }}";
    struct sp_jinja *t;
    assert_int_equal(sp_jinja_compile(src, strlen(src), &t), SP_OK);
    cJSON *a = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON *e = cJSON_Parse("\"!\"");
    struct sp_jinja_var v1[] = {{"messages", a}};
    struct sp_jinja_var v2[] = {{"messages", a}, {"extra", e}};
    char *out;
    size_t len;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sp_jinja_render(t, v1, 1, NULL, &out, &len), SP_OK);
        assert_string_equal(out, "user:hi;-");
        assert_int_equal(len, 9);
        sp_free(out);
        assert_int_equal(sp_jinja_render(t, v2, 2, NULL, &out, NULL), SP_OK);
        assert_string_equal(out, "user:hi;!");
        sp_free(out);
    }
    sp_jinja_free(t);
    sp_jinja_free(NULL);
    cJSON_Delete(a);
    cJSON_Delete(e);
}

/* Objects from JSON: duplicate keys keep the last value in the first
 * position (as json.loads does), and big objects stay fast to look up. */
static void test_big_and_duplicate_objects(void **state) {
    (void)state;
    cJSON *ctx = cJSON_Parse("{\"d\": {\"a\": 1, \"b\": 2, \"a\": 3}}");
    char *out;
    assert_int_equal(render_opts("{{ d }}|{{ d.a }}|{{ d | length }}", ctx, NULL, &out), SP_OK);
    assert_string_equal(out, "{'a': 3, 'b': 2}|3|2");
    sp_free(out);
    cJSON_Delete(ctx);

    struct sp_buf b = SP_BUF_INIT;
    sp_buf_puts(&b, "{\"d\": {");
    for (int i = 0; i < 60000; i++) sp_buf_printf(&b, "%s\"k%d\": %d", i ? ", " : "", i, i);
    sp_buf_puts(&b, "}}");
    ctx = cJSON_Parse(b.data);
    sp_buf_free(&b);
    assert_non_null(ctx);
    // 60000 iterations, each looking a key up: quadratic scanning would take minutes.
    const char *src = "{% set ns = namespace(sum=0) %}{% for k in d %}{% set ns.sum = ns.sum + d[k] %}{% endfor %}"
                      "{{ ns.sum }}|{{ d.k59999 }}|{{ d['k7'] }}|{{ d.get('nope', 'none') }}|{{ 'k123' in d }}";
    assert_int_equal(render_opts(src, ctx, NULL, &out), SP_OK);
    assert_string_equal(out, "1799970000|59999|7|none|True");
    sp_free(out);
    cJSON_Delete(ctx);
}

static void test_strftime_now(void **state) {
    (void)state;
    struct sp_jinja_opts o = {.now = 1768435200, .utc = true};
    char *out;
    assert_int_equal(render_opts("{{ strftime_now('%Y-%m-%d %d %b %Y') }}", NULL, &o, &out), SP_OK);
    assert_string_equal(out, "2026-01-15 15 Jan 2026");
    sp_free(out);
}

int main(void) {
    sp_mem_hook_cjson();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jinja2_cases),     cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_python_semantics), cmocka_unit_test(test_compile_errors),
        cmocka_unit_test(test_runtime_errors),   cmocka_unit_test(test_limits),
        cmocka_unit_test(test_deep_nesting),     cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_strftime_now),     cmocka_unit_test(test_big_and_duplicate_objects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
