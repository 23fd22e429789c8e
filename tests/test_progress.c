/*
 * test_progress.c - the progress of a load (core/progress.h) on a clock the
 * test moves: nothing before a second, one line rewritten in place on a
 * terminal, plain lines at most every few seconds elsewhere, the final
 * line's shape, and silence below the info log level.
 */
#include "helpers.h"

#include <regex.h>

#include "core/log.h"
#include "core/progress.h"

static double fake_t;
static double fake_now(void) { return fake_t; }

/* Everything written to f so far, as a string (owned). */
static char *contents(FILE *f) {
    fflush(f);
    long n = ftell(f);
    char *s = calloc(1, (size_t)n + 1);
    rewind(f);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    return s;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

static void assert_matches(const char *s, const char *re) {
    regex_t r;
    assert_int_equal(regcomp(&r, re, REG_EXTENDED | REG_NEWLINE), 0);
    int rc = regexec(&r, s, 0, NULL, 0);
    regfree(&r);
    if (rc != 0) fail_msg("\"%s\" does not match /%s/", s, re);
}

#define GB 1000000000ull

/* 10 GB in steps of 125 MB each 1/16 s (exact in binary): 2 GB/s for 5 s. */
static char *load(enum sp_progress_mode mode, bool summary) {
    FILE *f = tmpfile();
    assert_non_null(f);
    struct sp_progress_opts o = {.mode = mode, .out = f, .now = fake_now};
    struct sp_progress p;
    fake_t = 100.0;
    sp_progress_begin(&p, "weights in memory", 10 * GB, &o);
    for (int i = 0; i < 80; i++) {
        fake_t += 0.0625;
        sp_progress_add(&p, GB / 8);
    }
    sp_progress_end(&p, summary);
    char *s = contents(f);
    fclose(f);
    return s;
}

static void test_lines(void **state) {
    char *s = load(SP_PROGRESS_LINES, false);
    /* at 1 s, then every 5 s at most: the load ends at 5 s, so one line before the final one */
    assert_int_equal(count(s, "\n"), 2);
    assert_int_equal(count(s, "\r"), 0);
    assert_matches(s, "^info: weights in memory: 1\\.86 of 9\\.31 GiB \\(20%\\), 2\\.00 GB/s, 1\\.0 s$");
    assert_matches(s, "^info: weights in memory: 10000000000 bytes \\(9\\.31 GiB\\) in 5\\.00 s, 2\\.00 GB/s$");
    free(s);
}

static void test_tty(void **state) {
    char *s = load(SP_PROGRESS_TTY, false);
    /* rewritten from 1 s to 5 s at most every 0.2 s (every 4th step: 17 times), each time from the line's
     * start; then cleared, and the final line */
    assert_int_equal(count(s, "\r"), 17 + 1);
    assert_int_equal(count(s, "\033[K"), 17 + 1);
    assert_int_equal(count(s, "\n"), 1);
    assert_non_null(strstr(s, "\rinfo: weights in memory: 1.86 of 9.31 GiB (20%), 2.00 GB/s, 1.0 s\033[K"));
    const char *last = strrchr(s, '\r');
    assert_string_equal(last, "\r\033[Kinfo: weights in memory: 10000000000 bytes (9.31 GiB) in 5.00 s, 2.00 GB/s\n");
    free(s);
}

/* A load shorter than a second: nothing, or only the final line where asked for. */
static void test_short(void **state) {
    for (int m = SP_PROGRESS_TTY; m <= SP_PROGRESS_LINES; m++) {
        FILE *f = tmpfile();
        struct sp_progress_opts o = {.mode = (enum sp_progress_mode)m, .out = f, .now = fake_now};
        struct sp_progress p;
        fake_t = 0;
        sp_progress_begin(&p, "weights to cuda", 300u << 20, &o);
        for (int i = 0; i < 30; i++) {
            fake_t += 0.03;
            sp_progress_add(&p, 10u << 20);
        }
        sp_progress_end(&p, false);
        char *s = contents(f);
        assert_string_equal(s, "");
        free(s);
        fake_t = 0;
        sp_progress_begin(&p, "weights in memory", 300u << 20, &o);
        fake_t = 0.5;
        sp_progress_add(&p, 300u << 20);
        sp_progress_end(&p, true);
        s = contents(f);
        assert_string_equal(s, "info: weights in memory: 314572800 bytes (300.00 MiB) in 0.50 s, 0.63 GB/s\n");
        free(s);
        fclose(f);
    }
}

/* Below the info level AUTO writes nothing at all, final line included. */
static void test_quiet(void **state) {
    enum sp_log_level was = sp_log_get_level();
    sp_log_set_level(SP_LOG_WARN);
    char *s = load(SP_PROGRESS_AUTO, true);
    assert_string_equal(s, "");
    free(s);
    sp_log_set_level(was);
    /* at info, a file is not a terminal: plain lines */
    s = load(SP_PROGRESS_AUTO, true);
    assert_int_equal(count(s, "\r"), 0);
    assert_int_equal(count(s, "\n"), 2);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines),
        cmocka_unit_test(test_tty),
        cmocka_unit_test(test_short),
        cmocka_unit_test(test_quiet),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
