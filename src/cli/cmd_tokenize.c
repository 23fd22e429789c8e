/* cmd_tokenize.c - `sparrow tokenize` and `sparrow detokenize`: text to
 * token ids and back with a model's tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"
#include "format/modeldir.h"
#include "runtime/model_text.h"
#include "tokenizer/tokenizer.h"

static const char tokenize_usage[] =
    "usage: sparrow tokenize --model MODEL [--special] [--add-special] [--json] TEXT|-\n"
    "  Prints the token ids of TEXT ('-': standard input, bytes as they are) on one\n"
    "  line, separated by spaces, or as a JSON array with --json.\n"
    "  MODEL is a folder holding tokenizer.json (and tokenizer_config.json), a\n"
    "  tokenizer.json file, a GGUF model file, or a Hugging Face id in the cache.\n"
    "  --special      recognise special tokens written in TEXT (\"<|im_start|>\");\n"
    "                 without it they are tokenized as plain text\n"
    "  --add-special  add the tokens the tokenizer puts around a text (bos/eos)\n";

static const char detokenize_usage[] =
    "usage: sparrow detokenize --model MODEL [--skip-special] IDS...\n"
    "  Prints the text of token ids (comma- and/or space-separated, in one or\n"
    "  more arguments; '-' reads them from standard input).\n"
    "  --skip-special  leave special tokens out of the text\n";

#define MAX_INPUT ((size_t)1 << 30)

static enum sp_status read_stdin(struct sp_buf *b) {
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) {
        if (sp_buf_append(b, chunk, n) != SP_OK) return SP_ERR_NOMEM;
        if (b->len > MAX_INPUT) return sp_errorf(SP_ERR_LIMIT, "standard input is larger than 1 GiB");
    }
    if (ferror(stdin)) return sp_errorf(SP_ERR_IO, "reading standard input: %s", strerror(errno));
    return sp_buf_reserve(b, 0);
}

/* A folder or file given as is; anything else is looked up as a model id. */
static enum sp_status load(const char *model, struct sp_tokenizer **out) {
    if (sp_path_is_dir(model) || sp_path_is_file(model)) return sp_model_tokenizer_load(model, out);
    char *dir = NULL;
    enum sp_status st = sp_cli_model_resolve(NULL, model, &dir);
    if (st == SP_OK) st = sp_tokenizer_load(dir, out);
    sp_free(dir);
    return st;
}

int sp_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool special = false, add = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(tokenize_usage, stdout);
            return 0;
        } else if (sp_arg_value(argc, argv, &i, "--model", &v)) {
            if (!v) return SP_EXIT_USAGE;
            model = v;
        } else if (sp_arg_flag(argv[i], "--special")) {
            special = true;
        } else if (sp_arg_flag(argv[i], "--add-special")) {
            add = true;
        } else if (sp_arg_flag(argv[i], "--json")) {
            json = true;
        } else if (argv[i][0] == '-' && argv[i][1] && !text) {
            return sp_arg_unknown(argv[0], argv[i]);
        } else if (!text) {
            text = argv[i];
        } else {
            fprintf(stderr, "error: tokenize: one TEXT only (quote it)\n%s", tokenize_usage);
            return SP_EXIT_USAGE;
        }
    }
    if (!model || !text) {
        fprintf(stderr, "error: tokenize: %s\n%s", !model ? "--model is required" : "TEXT is required", tokenize_usage);
        return SP_EXIT_USAGE;
    }
    struct sp_tokenizer *t = NULL;
    struct sp_buf in = SP_BUF_INIT, out = SP_BUF_INIT;
    struct sp_ids ids = {0};
    int rc = 1;
    if (load(model, &t) != SP_OK) goto fail;
    const char *s = text;
    size_t n = strlen(text);
    if (strcmp(text, "-") == 0) {
        if (read_stdin(&in) != SP_OK) goto fail;
        s = in.data;
        n = in.len;
    }
    unsigned flags = (special ? SP_TOK_PARSE_SPECIAL : 0) | (add ? SP_TOK_ADD_SPECIAL : 0);
    if (sp_tokenizer_encode(t, s, n, flags, &ids) != SP_OK) goto fail;
    if (json) sp_buf_putc(&out, '[');
    for (int64_t i = 0; i < ids.n; i++) sp_buf_printf(&out, i ? (json ? ", %d" : " %d") : "%d", ids.v[i]);
    if (json) sp_buf_putc(&out, ']');
    sp_buf_putc(&out, '\n');
    if (out.failed) {
        sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    fwrite(out.data, 1, out.len, stdout);
    rc = 0;
fail:
    if (rc) sp_cli_fail();
    sp_ids_free(&ids);
    sp_buf_free(&in);
    sp_buf_free(&out);
    sp_tokenizer_free(t);
    return rc;
}

/* Parses ids separated by commas and/or whitespace into out. */
static enum sp_status parse_ids(const char *s, struct sp_ids *out) {
    while (*s) {
        if (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '[' || *s == ']') {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && !strchr(", \t\r\n[]", *end)))
            return sp_errorf(SP_ERR_ARG, "\"%.*s\" is not a token id", (int)strcspn(s, ", \t\r\n"), s);
        enum sp_status st = sp_ids_push(out, (int32_t)v);
        if (st != SP_OK) return st;
        s = end;
    }
    return SP_OK;
}

int sp_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    bool skip = false, any = false;
    struct sp_ids ids = {0};
    struct sp_buf in = SP_BUF_INIT, out = SP_BUF_INIT;
    struct sp_tokenizer *t = NULL;
    int rc = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(detokenize_usage, stdout);
            rc = 0;
            goto done;
        } else if (sp_arg_value(argc, argv, &i, "--model", &v)) {
            if (!v) {
                rc = SP_EXIT_USAGE;
                goto done;
            }
            model = v;
        } else if (sp_arg_flag(argv[i], "--skip-special")) {
            skip = true;
        } else if (strcmp(argv[i], "-") == 0) {
            any = true;
            if (read_stdin(&in) != SP_OK || parse_ids(in.data, &ids) != SP_OK) goto fail;
        } else if (argv[i][0] == '-' && !(argv[i][1] >= '0' && argv[i][1] <= '9')) {
            rc = sp_arg_unknown(argv[0], argv[i]);
            goto done;
        } else {
            any = true;
            if (parse_ids(argv[i], &ids) != SP_OK) goto fail;
        }
    }
    if (!model || !any) {
        fprintf(stderr, "error: detokenize: %s\n%s", !model ? "--model is required" : "IDS are required", detokenize_usage);
        rc = SP_EXIT_USAGE;
        goto done;
    }
    if (load(model, &t) != SP_OK) goto fail;
    if (sp_tokenizer_decode(t, ids.v, ids.n, skip ? SP_TOK_SKIP_SPECIAL : 0, &out) != SP_OK) goto fail;
    fwrite(out.data, 1, out.len, stdout);
    fputc('\n', stdout);
    rc = 0;
    goto done;
fail:
    sp_cli_fail();
done:
    sp_ids_free(&ids);
    sp_buf_free(&in);
    sp_buf_free(&out);
    sp_tokenizer_free(t);
    return rc;
}
