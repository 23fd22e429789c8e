#!/usr/bin/env bash
# `sparrow template` from the outside: every model's template on a few of the
# reference conversations, byte for byte, and clean errors (exit 1, "error: ")
# for bad input and templates that refuse a conversation.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"
D=tests/data/templates

# same NAME FILE: the last command's stdout is FILE, byte for byte.
same() {
    if cmp -s "$TMP/out" "$2"; then ok "$1"; else not_ok "$1 (differs from $2)" "$TMP/out"; fi
}

for m in Qwen3-0.6B Qwen3.5-4B Qwen3-Coder gpt-oss-120b Llama-3.1-8B-Instruct DeepSeek-V3.1 Ling-2.0; do
    for c in 03_multi_turn 13_tool_call_object_args 18_unicode; do
        want="$D/expected/$m/$c.txt"
        [ -f "$D/expected/$m/$c.jinja2.txt" ] && want="$D/expected/$m/$c.jinja2.txt"
        run "template $m $c" 0 "$SPARROW" template --model "$D/models/$m" --messages "$D/conversations/$c.json" \
            --date 2026-01-15
        same "template $m $c is exact" "$want"
    done
done

# Messages as a bare array on stdin, flags for the generation prompt and kwargs.
msgs='[{"role": "user", "content": "Hi"}]'
run "messages from stdin" 0 "$SPARROW" template --model "$D/models/Qwen3-0.6B" --messages - --kwargs '{"enable_thinking": false}' <<<"$msgs"
printf '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' >"$TMP/want"
same "kwargs reach the template" "$TMP/want"
run "no generation prompt" 0 "$SPARROW" template --model "$D/models/Qwen3-0.6B" --messages - --no-generation-prompt <<<"$msgs"
printf '<|im_start|>user\nHi<|im_end|>\n' >"$TMP/want"
same "no generation prompt is exact" "$TMP/want"
echo '[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]' >"$TMP/tools.json"
run "--tools file" 0 "$SPARROW" template --model "$D/models/Qwen3-0.6B" --messages - --tools "$TMP/tools.json" <<<"$msgs"
expect "tools are rendered" "$TMP/out" '{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}'

# Tool-call arguments sent as JSON text (as OpenAI clients do).
run "text arguments refused as transformers does" 1 "$SPARROW" template --model "$D/models/Qwen3-Coder" \
    --messages "$D/conversations/14_tool_call_string_args.json"
run "--parse-arguments" 0 "$SPARROW" template --model "$D/models/Qwen3-Coder" \
    --messages "$D/conversations/14_tool_call_string_args.json" --parse-arguments
expect "parsed arguments rendered" "$TMP/out" "<parameter=city>"

# --openai: null content and text parts as a server receives them.
run "null content refused as transformers does" 1 "$SPARROW" template --model "$D/models/Qwen3-0.6B" \
    --messages "$D/conversations/32_assistant_null_content.json"
run "--openai null content" 0 "$SPARROW" template --model "$D/models/Qwen3-0.6B" \
    --messages "$D/conversations/32_assistant_null_content.json" --openai
expect "null content rendered" "$TMP/out" '{"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}}'
run "--openai text parts" 0 "$SPARROW" template --model "$D/models/Qwen3-0.6B" \
    --messages "$D/conversations/17_content_parts.json" --openai
expect "text parts joined" "$TMP/out" "Describe "

# Errors.
run "a template's own exception" 1 "$SPARROW" template --model "$D/models/Llama-3.1-8B-Instruct" \
    --messages "$D/conversations/15_two_tool_calls.json"
expect "its message and line" "$TMP/err" "error: template line 71: raise_exception: This model only supports single tool-calls at once!"
run "missing --messages" 2 "$SPARROW" template --model "$D/models/Qwen3-0.6B"
run "unknown option" 2 "$SPARROW" template --model "$D/models/Qwen3-0.6B" --messages - --bogus <<<"$msgs"
run "malformed messages JSON" 1 "$SPARROW" template --model "$D/models/Qwen3-0.6B" --messages - <<<'[{"role": '
expect "says what is wrong" "$TMP/err" "error: "
run "messages not an array" 1 "$SPARROW" template --model "$D/models/Qwen3-0.6B" --messages - <<<'{"role": "user"}'
run "kwargs not an object" 1 "$SPARROW" template --model "$D/models/Qwen3-0.6B" --messages - --kwargs '[1]' <<<"$msgs"
run "a folder without a template" 1 "$SPARROW" template --model "$TMP" --messages - <<<"$msgs"
expect "names the missing template" "$TMP/err" "no chat_template"
printf '{%% for m in messages %%}' >"$TMP/chat_template.jinja"
run "a malformed template" 1 "$SPARROW" template --model "$TMP" --messages - <<<"$msgs"
expect "reports the template error" "$TMP/err" "error: "
expect "with what is missing" "$TMP/err" "endfor"
