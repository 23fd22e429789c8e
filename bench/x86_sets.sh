#!/usr/bin/env bash
# Compares the x86 kernel sets this CPU runs (avx2, and avxvnni / avx512 / amx
# where the CPU has them, each with its -int16 twin, which rounds the
# activations of 4-bit rows to int16 instead of int8): bench/kernels per
# set on the 4-bit, 8-bit and mxfp4 formats, then `sparrow bench` on
# synthetic models of real shapes with --kernels naming each set in
# turn, sets alternating within each repetition so that a drift of the
# machine touches every set alike. Ends
# with a table of the best prefill and decode figures per model and set.
# KFMTS lists the kernel formats besides affine4-g64 (default "mxfp4
# affine8-g64"; empty: none).
#
#     bench/x86_sets.sh               # THREADS=2 LAYERS=4 REPS=2 by default
#     THREADS=8 CONFIGS="qwen3-30b-a3b" QUANTS=affine4 bench/x86_sets.sh
#
# BUILD names the build folder (default build); models are generated with
# GEN_THREADS threads (default: every CPU) into a temporary folder in
# $TMPDIR, deleted afterwards.
set -u
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
THREADS="${THREADS:-2}"
LAYERS="${LAYERS:-4}"
REPS="${REPS:-2}"
CONFIGS="${CONFIGS:-ling-mini-2.0 qwen3-30b-a3b}"
QUANTS="${QUANTS:-affine4 mxfp4}"
PROMPT="${PROMPT:-512}"
GEN="${GEN:-32}"
GEN_THREADS="${GEN_THREADS:-$(nproc)}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/sparrow-sets-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

sets=()
for s in avx2 avx2-int16 avxvnni avxvnni-int16 avx512 avx512-int16 amx amx-int16; do
    out="$("$BUILD/bench/kernels" --quick --threads "$THREADS" --isa "$s" --fmt affine4-g64 | tee /dev/stderr)"
    grep -q "^kernel isa=$s " <<<"$out" && sets+=("$s")
done
[ "${#sets[@]}" -gt 0 ] || { echo "error: no x86 kernel set runs on this CPU" >&2; exit 1; }
for f in ${KFMTS-mxfp4 affine8-g64}; do
    for s in "${sets[@]}"; do "$BUILD/bench/kernels" --quick --threads "$THREADS" --isa "$s" --fmt "$f" | grep '^kernel'; done
done

for c in $CONFIGS; do
    for q in $QUANTS; do
        m="$tmp/$c-$q"
        "$BUILD/sparrow" bench --synthetic "bench/configs/$c.json" --quant "$q" --layers "$LAYERS" --out "$m" \
            --prompt 1 --gen 1 --threads "$GEN_THREADS" >/dev/null || exit 1
        for ((r = 0; r < REPS; r++)); do
            for s in "${sets[@]}"; do
                "$BUILD/sparrow" bench --kernels "$s" --model "$m" --prompt "$PROMPT" --gen "$GEN" \
                    --threads "$THREADS" | grep '^{' | sed "s/^{/{\"config\":\"$c\",/"
            done
        done
        rm -rf "$m"
    done
done | tee "$tmp/runs.jsonl"

echo "best of $REPS: config quant set prefill_tok_s decode_tok_s efficiency_pct"
sed -E 's/.*"config":"([^"]*)".*"format":"([^"]*)".*"kernels":"([^"]*)".*"prefill_tok_s":([0-9.]+).*"decode_tok_s":([0-9.]+).*"efficiency_pct":([0-9.]+).*/\1 \2 \3 \4 \5 \6/' \
    "$tmp/runs.jsonl" |
    awk '{k = $1 " " $2 " " $3; if ($4 > p[k]) p[k] = $4; if ($5 > d[k]) { d[k] = $5; e[k] = $6 } if (!(k in o)) { o[k] = n++ } }
         END { for (k in o) printf "%d %s %.1f %.2f %.0f\n", o[k], k, p[k], d[k], e[k] }' | sort -n | cut -d' ' -f2-
