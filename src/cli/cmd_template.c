/* cmd_template.c - `sparrow template`: render a model's chat template. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "core/alloc.h"
#include "core/file.h"
#include "core/json.h"
#include "format/modeldir.h"
#include "runtime/model_text.h"
#include "template/chat.h"

static const char usage[] =
    "usage: sparrow template --model MODEL --messages FILE.json [--tools FILE.json]\n"
    "                        [--no-generation-prompt] [--kwargs JSON] [--name NAME] [--date YYYY-MM-DD]\n"
    "                        [--parse-arguments] [--openai]\n"
    "  Prints the prompt MODEL's chat template makes of a conversation, exactly\n"
    "  (no newline added). MODEL is a folder, a GGUF model file or a Hugging Face id\n"
    "  in the cache.\n"
    "  FILE.json ('-': standard input) holds the messages array, or an object with\n"
    "  \"messages\" and optionally \"tools\", \"add_generation_prompt\" and\n"
    "  \"chat_template_kwargs\" (an OpenAI chat request body works as is).\n"
    "  --kwargs adds template variables (e.g. '{\"enable_thinking\": false}');\n"
    "  --name picks a named template (e.g. tool_use); --date fixes the date that\n"
    "  strftime_now() prints; --parse-arguments gives tool-call arguments sent as\n"
    "  JSON text to the template as objects; --openai also turns null content into\n"
    "  \"\" and lists of text parts into text for templates that expect a string.\n";

#define MAX_INPUT ((size_t)256 << 20)

static enum sp_status read_json(const char *path, const char *what, cJSON **out) {
    if (strcmp(path, "-") != 0) return sp_json_parse_file(path, MAX_INPUT, out);
    struct sp_buf b = SP_BUF_INIT;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) {
        if (sp_buf_append(&b, chunk, n) != SP_OK || b.len > MAX_INPUT) {
            sp_buf_free(&b);
            return sp_errorf(SP_ERR_LIMIT, "%s: standard input too large", what);
        }
    }
    enum sp_status st = sp_json_parse(b.data ? b.data : "", b.len, what, out);
    sp_buf_free(&b);
    return st;
}

/* Copies every member of src into dst, replacing members of the same name. */
static enum sp_status merge_kwargs(cJSON *dst, const cJSON *src, const char *what) {
    if (!cJSON_IsObject(src)) return sp_errorf(SP_ERR_ARG, "%s must be a JSON object", what);
    for (const cJSON *c = src->child; c; c = c->next) {
        cJSON *copy = cJSON_Duplicate(c, true);
        if (!copy) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        cJSON_DeleteItemFromObjectCaseSensitive(dst, c->string);
        cJSON_AddItemToObject(dst, c->string, copy);
    }
    return SP_OK;
}

static bool parse_date(const char *s, time_t *out) {
    struct tm tm = {0};
    const char *end = strptime(s, "%Y-%m-%d", &tm);
    if (!end || *end) return false;
    *out = timegm(&tm);
    return true;
}

int sp_cmd_template(int argc, char **argv) {
    sp_mem_hook_cjson(); // before the first cJSON node, so all are freed alike
    const char *model = NULL, *messages_path = NULL, *tools_path = NULL, *kwargs_text = NULL, *name = NULL,
               *date = NULL;
    bool gen_prompt = true, gen_prompt_set = false, parse_args = false, openai = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (sp_arg_flag(argv[i], "--no-generation-prompt")) {
            gen_prompt = false;
            gen_prompt_set = true;
        } else if (sp_arg_flag(argv[i], "--parse-arguments")) {
            parse_args = true;
        } else if (sp_arg_flag(argv[i], "--openai")) {
            parse_args = openai = true;
        } else if (sp_arg_value(argc, argv, &i, "--model", &v)) {
            if (!(model = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--messages", &v)) {
            if (!(messages_path = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--tools", &v)) {
            if (!(tools_path = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--kwargs", &v)) {
            if (!(kwargs_text = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--name", &v)) {
            if (!(name = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--date", &v)) {
            if (!(date = v)) return SP_EXIT_USAGE;
        } else {
            return sp_arg_unknown(argv[0], argv[i]);
        }
    }
    if (!model || !messages_path) {
        fputs(usage, stderr);
        return SP_EXIT_USAGE;
    }
    time_t now = 0;
    if (date && !parse_date(date, &now)) {
        fprintf(stderr, "error: template: --date wants YYYY-MM-DD, got \"%s\"\n", date);
        return SP_EXIT_USAGE;
    }

    int rc = 1;
    char *dir = NULL, *prompt = NULL;
    cJSON *input = NULL, *tools_doc = NULL, *kwargs = cJSON_CreateObject();
    struct sp_chat_template *ct = NULL;
    if (!kwargs) {
        sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (sp_path_is_dir(model)) {
        if (!(dir = sp_strdup(model, SP_MEM_MISC))) goto fail;
    } else if (sp_cli_model_resolve(NULL, model, &dir) != SP_OK) {
        goto fail;
    }
    if (read_json(messages_path, "messages", &input) != SP_OK) goto fail;
    const cJSON *messages = input, *tools = NULL;
    if (cJSON_IsObject(input)) {
        messages = cJSON_GetObjectItemCaseSensitive(input, "messages");
        tools = cJSON_GetObjectItemCaseSensitive(input, "tools");
        const cJSON *agp = cJSON_GetObjectItemCaseSensitive(input, "add_generation_prompt");
        if (!gen_prompt_set && cJSON_IsBool(agp)) gen_prompt = cJSON_IsTrue(agp);
        static const char *const kw_keys[] = {"kwargs", "chat_template_kwargs"};
        for (int k = 0; k < 2; k++) {
            const cJSON *kw = cJSON_GetObjectItemCaseSensitive(input, kw_keys[k]);
            if (kw && merge_kwargs(kwargs, kw, kw_keys[k]) != SP_OK) goto fail;
        }
    }
    if (!cJSON_IsArray(messages)) {
        sp_errorf(SP_ERR_ARG, "%s: expected an array of messages or an object with \"messages\"", messages_path);
        goto fail;
    }
    if (tools_path) {
        if (read_json(tools_path, "tools", &tools_doc) != SP_OK) goto fail;
        tools = tools_doc;
    }
    if (tools && cJSON_IsNull(tools)) tools = NULL;
    if (tools && !cJSON_IsArray(tools)) {
        sp_errorf(SP_ERR_ARG, "tools must be a JSON array");
        goto fail;
    }
    if (kwargs_text) {
        cJSON *kw;
        if (sp_json_parse(kwargs_text, strlen(kwargs_text), "--kwargs", &kw) != SP_OK) goto fail;
        enum sp_status st = merge_kwargs(kwargs, kw, "--kwargs");
        cJSON_Delete(kw);
        if (st != SP_OK) goto fail;
    }
    if (sp_model_chat_template_load(dir, name, &ct) != SP_OK) goto fail;
    if (date) {
        ct->opts.now = now;
        ct->opts.utc = true;
    }
    struct sp_chat_request req = {
        .messages = messages,
        .tools = tools,
        .add_generation_prompt = gen_prompt,
        .kwargs = kwargs,
        .parse_tool_arguments = parse_args,
        .null_content_as_empty = openai,
        .flatten_content_parts = openai,
    };
    size_t len;
    if (sp_chat_render(ct, &req, &prompt, &len) != SP_OK) goto fail;
    if (fwrite(prompt, 1, len, stdout) != len || fflush(stdout) != 0) {
        fprintf(stderr, "error: template: cannot write the prompt to standard output\n");
        rc = 1;
    } else {
        rc = 0;
    }
fail:
    if (rc != 0 && !prompt) sp_cli_fail();
    sp_free(prompt);
    sp_chat_template_free(ct);
    cJSON_Delete(input);
    cJSON_Delete(tools_doc);
    cJSON_Delete(kwargs);
    sp_free(dir);
    return rc;
}
