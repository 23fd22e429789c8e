#!/usr/bin/env bash
# The one real trained model available offline, stories260K (a tiny Llama
# trained on children's stories, ../shared/models/), converted from GGUF by
# tools/gguf_to_hf.mjs: greedy generation tells the story it was trained
# on, and its 4-bit copies keep its quality under every activation
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
