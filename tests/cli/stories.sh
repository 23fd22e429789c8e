#!/usr/bin/env bash
# The one real trained model available offline, stories260K (a tiny Llama
# trained on children's stories, ../shared/models/), converted from GGUF by
# tools/gguf_to_hf.mjs: greedy generation tells the story it was trained
# on; the GGUF loaded directly (its tokenizer from its metadata) tells the
# same story from a text prompt and gives the converted model's logits bit
# for bit; and its 4-bit copies keep its quality under every activation
# rounding: the perplexity of texts it wrote, with activations rounded to
# int8 by the default x86 sets, stays within 3% (of the mean log-likelihood)
# of the same model with float activations, and 4-bit weights cost less
# than 30%.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

GGUF=../shared/models/stories260K.gguf
PROMPT=1,403,407,261,378  # <s> Once upon a time

run "convert the GGUF model" 0 node tools/gguf_to_hf.mjs "$GGUF" "$TMP/f32"
ids() { head -1 "$TMP/out" | tr ' ' ','; }
text() {  # token ids -> text with the model's vocabulary
    node -e '
        const v = require("fs").readFileSync(process.argv[1], "utf8").split("\n");
        process.stdout.write(process.argv[2].split(",").map((i) => v[+i]).join("").replace(/\u2581/g, " "));' \
        "$TMP/f32/vocab.txt" "$1"
}

run "greedy generation" 0 "$SPARROW" run --model "$TMP/f32" --tokens "$PROMPT" --max-tokens 30 --temp 0 --threads 2
text "$PROMPT,$(ids)" >"$TMP/story"
expect "tells a story" "$TMP/story" "<s> Once upon a time, there was a little girl named Lily."

run "the GGUF itself, prompted with text" 0 "$SPARROW" run --model "$GGUF" --prompt "Once upon a time" \
    --max-tokens 30 --temp 0 --threads 2
expect "tells the same story" "$TMP/out" ", there was a little girl named Lily."
run "a GGUF path that is not there" 1 "$SPARROW" run --model "$TMP/none.gguf" --tokens 1
expect "is named as a missing file" "$TMP/err" "model file $TMP/none.gguf: missing"
run "the GGUF's tokenizer" 0 "$SPARROW" tokenize --model "$GGUF" "Once upon a time"
expect "gives the prompt's ids" "$TMP/out" "403 407 261 378"
run "quantize the GGUF to a folder" 0 "$SPARROW" quantize "$GGUF" "$TMP/gguf-q8" --mode affine --bits 8
run "which has the GGUF's tokenizer" 0 "$SPARROW" run --model "$TMP/gguf-q8" --prompt "Once upon a time" \
    --max-tokens 12 --temp 0 --threads 2
expect "and tells the story" "$TMP/out" ", there was a little girl"

# two texts the float model writes (temperature 1, no truncation)
for s in 1 2; do
    "$SPARROW" run --model "$TMP/f32" --tokens "$PROMPT" --max-tokens 200 --temp 1 --top-k 0 --top-p 1 --min-p 0 \
        --ignore-eos --seed "$s" --threads 2 >"$TMP/out" 2>"$TMP/err"
    echo "$PROMPT,$(ids)" >"$TMP/text$s"
done

# mean negative log-likelihood of both texts: model, then flags that choose the kernel set
nll() {
    local m="$1" s sum=0 n=0
    shift
    for s in 1 2; do
        "$SPARROW" run --model "$TMP/$m" --tokens "$(cat "$TMP/text$s")" "$@" \
            --dump-logits "$TMP/logits" --threads 2 >/dev/null 2>&1 || { echo nan; return; }
        read -r a b < <(node tools/nll.mjs "$TMP/logits" "$(cat "$TMP/text$s")")
        sum=$(awk -v x="$sum" -v y="$a" 'BEGIN { print x + y }')
        n=$((n + b))
    done
    awk -v x="$sum" -v n="$n" 'BEGIN { printf "%.5f\n", x / n }'
}
# within: NAME A B LIMIT -> ok when A <= B * LIMIT
within() {
    if awk -v a="$2" -v b="$3" -v l="$4" 'BEGIN { exit !(a == a && b == b && a <= b * l) }'; then ok "$1 ($2 vs $3)"
    else not_ok "$1 ($2 vs $3, limit x$4)"; fi
}

"$SPARROW" run --model "$TMP/f32" --tokens "$(cat "$TMP/text1")" --dump-logits "$TMP/lf32" --threads 2 \
    >/dev/null 2>&1
"$SPARROW" run --model "$GGUF" --tokens "$(cat "$TMP/text1")" --dump-logits "$TMP/lgguf" --threads 2 >/dev/null 2>&1
if [ -s "$TMP/lf32" ] && cmp -s "$TMP/lf32" "$TMP/lgguf"; then ok "the GGUF gives the converted model's logits"
else not_ok "the GGUF gives the converted model's logits"; fi

base=$(nll f32 --precision exact)
for q in "affine4-g32 --mode affine --bits 4 --group-size 32" "affine4-g64 --mode affine --bits 4 --group-size 64" \
    "mxfp4 --mode mxfp4"; do
    set -- $q
    name=$1
    shift
    run "quantize $name" 0 "$SPARROW" quantize "$TMP/f32" "$TMP/$name" "$@"
    float=$(nll "$name" --precision exact)
    within "$name: 4-bit weights cost < 30% of the log-likelihood" "$float" "$base" 1.3
    within "$name: default activation rounding costs < 3% more" "$(nll "$name")" "$float" 1.03
done
