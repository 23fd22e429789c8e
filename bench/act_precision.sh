#!/usr/bin/env bash
# What rounding activations costs in quality, on the one real trained model
# available offline (../shared/models/stories260K.gguf, converted by
# tools/gguf_to_hf.mjs): texts sampled from the float model are scored
# (mean negative log-likelihood per token, and perplexity) by the float
# model and by its quantized copies (affine4 g32 / g64, mxfp4, affine8 g32)
# under each kernel set: float activations (avx2f), int16 (avx2-int16) and
# the default (avx2: int8 for 4- and 8-bit rows). The
# difference a set makes on one quantized model is what its activation
# rounding costs; the difference between the float model and the
# quantized one under avx2f is what the weight format costs. A bf16 copy is
# scored with float activations (avx2f) and by the best set this CPU runs
# (set=best), which on CPUs with AVX512-BF16 (the avx512 and amx sets)
# rounds them to bf16.
#
#     bench/act_precision.sh          # TEXTS=8 LEN=250 by default
#
# BUILD names the build folder (default build). Output: one line per model
# and set, "act_precision model=... set=... tokens=... nll=... ppl=...".
set -eu
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
TEXTS="${TEXTS:-8}"
LEN="${LEN:-250}"
GGUF="${GGUF:-../shared/models/stories260K.gguf}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/sparrow-act-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
sp="$BUILD/sparrow"

node tools/gguf_to_hf.mjs "$GGUF" "$tmp/f32"
"$sp" quantize "$tmp/f32" "$tmp/affine4-g32" --mode affine --bits 4 --group-size 32 >/dev/null
"$sp" quantize "$tmp/f32" "$tmp/affine4-g64" --mode affine --bits 4 --group-size 64 >/dev/null
"$sp" quantize "$tmp/f32" "$tmp/mxfp4" --mode mxfp4 >/dev/null
"$sp" quantize "$tmp/f32" "$tmp/affine8-g32" --mode affine --bits 8 --group-size 32 >/dev/null
"$sp" quantize "$tmp/f32" "$tmp/bf16" --mode bf16 >/dev/null

# texts: BOS + "Once upon a time" (ids of the stories260K vocabulary), then
# LEN tokens sampled at temperature 1 with no truncation, one seed per text
for s in $(seq "$TEXTS"); do
    "$sp" run --kernels avx2f --model "$tmp/f32" --tokens 1,403,407,261,378 --max-tokens "$LEN" --temp 1 \
        --top-k 0 --top-p 1 --min-p 0 --ignore-eos --seed "$s" --threads 1 2>/dev/null |
        head -1 | tr ' ' ',' | sed 's/^/1,403,407,261,378,/' >"$tmp/text$s"
done

score() {  # model set ("best": the best this CPU runs)
    local total=0 flags=(--kernels "$2")
    [ "$2" = best ] && flags=(--precision fast)
    for s in $(seq "$TEXTS"); do
        "$sp" run "${flags[@]}" --model "$tmp/$1" --tokens "$(cat "$tmp/text$s")" --dump-logits "$tmp/logits" \
            --threads 2 >/dev/null 2>&1
        node tools/nll.mjs "$tmp/logits" "$(cat "$tmp/text$s")" >>"$tmp/nll-$1-$2"
    done
    awk -v m="$1" -v k="$2" '{ n += $1; t += $2 } END { printf "act_precision model=%s set=%s tokens=%d nll=%.5f ppl=%.4f\n", m, k, t, n / t, exp(n / t) }' "$tmp/nll-$1-$2"
}

score f32 avx2f
for m in affine4-g32 affine4-g64 mxfp4 affine8-g32; do
    for k in avx2f avx2-int16 avx2; do score "$m" "$k"; done
done
for k in avx2f best; do score bf16 "$k"; done
