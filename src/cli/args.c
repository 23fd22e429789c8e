/* args.c - flag parsing helpers for the subcommands. */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

bool sp_arg_value(int argc, char **argv, int *i, const char *name, const char **out) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return false;
    if (a[n] == '=') {
        *out = a + n + 1;
        return true;
    }
    if (a[n] != 0) return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "error: %s needs a value\n", name);
        *out = NULL;
        return true;
    }
    *out = argv[++*i];
    return true;
}

bool sp_arg_flag(const char *arg, const char *name) { return strcmp(arg, name) == 0; }

int sp_arg_unknown(const char *cmd, const char *arg) {
    fprintf(stderr, "error: %s: unknown option %s (see sparrow %s --help)\n", cmd, arg, cmd);
    return SP_EXIT_USAGE;
}

bool sp_arg_int(const char *flag, const char *v, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < min || x > max) {
        fprintf(stderr, "error: %s: expected an integer from %lld to %lld, got \"%s\"\n", flag, (long long)min,
                (long long)max, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

bool sp_arg_num(const char *flag, const char *v, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !isfinite(x)) {
        fprintf(stderr, "error: %s: expected a number, got \"%s\"\n", flag, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

bool sp_arg_range(const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "error: %s: expected a number from %g to %g, got \"%s\"\n", flag, lo, hi, v ? v : "");
        return false;
    }
    *out = x;
    return true;
}

bool sp_arg_size(const char *flag, const char *v, uint64_t *out) {
    char *end;
    double x = v ? strtod(v, &end) : -1;
    double mul = 1;
    if (v && end != v) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0, end++; break;
        case 'm': case 'M': mul = 1024.0 * 1024, end++; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024, end++; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024, end++; break;
        default: break;
        }
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
    }
    if (!v || end == v || *end || !(x >= 0) || x * mul > 1.8e19) {
        fprintf(stderr, "error: %s: expected a size such as 512M or 24G, got \"%s\"\n", flag, v ? v : "");
        return false;
    }
    *out = (uint64_t)(x * mul);
    return true;
}

int sp_cli_fail(void) {
    fprintf(stderr, "error: %s\n", sp_error_msg());
    return 1;
}
