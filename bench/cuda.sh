#!/usr/bin/env bash
# The GPU figures of docs/performance.md in one go, on a machine with an
# NVIDIA GPU: the CUDA build's GPU tests, then for each shape (synthetic
# weights, fewer layers) batch-1 prefill and decode (medians of 3 runs, each
# against the copy bandwidth measured after it), the decode step's breakdown
# (--steps), batches of 8 and 32 sequences, the exact path, decode with
# the steps replayed as CUDA graphs (--cuda-graphs) beside the same without,
# and decode with kernels waiting for the one before to end
# (SPARROW_CUDA_OVERLAP=0) beside the default.
#
#   bench/cuda.sh [BUILD] [WORK]     BUILD: build/cuda (make CUDA=1); WORK: where
#                                     the models are written (several GB each)
#
# SHAPES (default "qwen3 ling gptoss") picks shapes; TESTS=0 skips the tests.
# TIER="6.75G ..." also decodes Ling-flash-2.0 with that --gpu-mem-limit (the
# rest of its experts in host memory), with --no-cpu-experts and without (each
# build taking turns with BASE's where given): tok/s, the decode hit rate,
# the bytes a token copied in, the experts the CPU took, and the rates the
# CPU's share was chosen by.
# SAMPLE=1 also decodes 256 tokens of each shape with sampling (sparrow run,
# temperature 0.8): top-k 64 (the GPU's best logits), 65 (every logit to the
# host) and greedy, BASE's build taking turns where given, the texts' digests
# beside the tok/s (the same seed draws the same tokens in both builds).
# DEVICES=0,1 also decodes each shape with its experts split over those GPUs
# (--devices), 1 and 32 sequences, beside the same on the first GPU alone,
# taking turns.
# BASE=FILE (another build's sparrow) measures batch-1 prefill and decode of
# that build and this one taking turns, ROUNDS times (default 2), each a
# median of 2 runs: the way docs/performance.md compares builds on a noisy
# machine. QUICK=1 stops at the batch-1 figures. Run from the repository root
# after npm ci (test_gguf reads the npm tokenizer files).
set -u -o pipefail  # a failing bench fails the script through its pipes too
cd "$(dirname "$0")/.." || exit 2
B="${1:-build/cuda}"
W="${2:-${TMPDIR:-/tmp}/sparrow-cuda}"
mkdir -p "$W"
rc=0

if [ "${TESTS:-1}" = 1 ]; then
    for t in test_backend_ops "test_forward test_cuda_*" test_gguf; do
        echo "== $t"
        read -r bin filter <<<"$t"
        "$B/tests/$bin" ${filter:+"$filter"} || rc=1
    done
fi

# name: config, format, layers
shape() {
    case "$1" in
        qwen3) echo "bench/configs/qwen3-30b-a3b.json affine4 4" ;;
        ling) echo "bench/configs/ling-flash-2.0.json mxfp4 6" ;;
        gptoss) echo "bench/configs/gpt-oss-120b.json mxfp4 6" ;;
        *) return 1 ;;
    esac
}

for s in ${SHAPES:-qwen3 ling gptoss}; do
    read -r cfg quant layers < <(shape "$s") || { echo "unknown shape $s" >&2; exit 2; }
    dir="$W/$s-$quant-$layers"
    if [ ! -f "$dir/config.json" ]; then
        rm -rf "$dir"
        "$B/sparrow" bench --synthetic "$cfg" --quant "$quant" --layers "$layers" --out "$dir" --prompt 8 \
            --gen 1 >/dev/null || { rc=1; continue; }
    fi
    echo "== $s ($cfg, $quant, $layers layers)"
    if [ -n "${BASE:-}" ]; then
        for _ in $(seq "${ROUNDS:-2}"); do
            for b in "$BASE" "$B/sparrow"; do
                printf '%s: ' "$b"
                "$b" bench --model "$dir" --device cuda --repeat 2 | tail -1 |
                    grep -oE '"(prefill|decode)_tok_s_median":[0-9.]+' | paste -sd' ' || rc=1
            done
        done
    else
        "$B/sparrow" bench --model "$dir" --device cuda --repeat 3 || rc=1
    fi
    if [ "$s" = ling ] && [ -n "${TIER:-}" ]; then
        for lim in $TIER; do
            for _ in $(seq "${ROUNDS:-2}"); do
                for b in ${BASE:+"$BASE"} "$B/sparrow"; do
                    for f in --no-cpu-experts ""; do
                        printf '%s --gpu-mem-limit %s %s: ' "$b" "$lim" "$f"
                        "$b" bench --model "$dir" --device cuda --gpu-mem-limit "$lim" $f --repeat 3 2>"$W/tier.log" |
                            tail -1 | grep -oE '"(prefill_tok_s_median|decode_tok_s_median|gpu_decode_hit_rate|h2d_bytes_per_token|cpu_computed_experts)":[0-9.e+]+' |
                            paste -sd' ' || rc=1
                        grep -h "CPU computes" "$W/tier.log" | tail -1
                    done
                done
            done
        done
    fi
    if [ "${SAMPLE:-0}" = 1 ]; then
        ids=$(seq 1000 7 1441 | paste -sd,)
        for _ in $(seq "${ROUNDS:-2}"); do
            for b in ${BASE:+"$BASE"} "$B/sparrow"; do
                for k in 64 65 greedy; do
                    if [ "$k" = greedy ]; then a="--temp 0"; else a="--temp 0.8 --top-k $k --seed 7"; fi
                    # shellcheck disable=SC2086
                    out=$("$b" run --model "$dir" --device cuda --tokens "$ids" --max-tokens 256 --ignore-eos $a \
                        2>"$W/run.log") || rc=1
                    printf '%s top-k %s: text %s, %s\n' "$b" "$k" "$(echo "$out" | md5sum | cut -c1-8)" \
                        "$(grep -o 'decode: [^;]*' "$W/run.log")"
                done
            done
        done
    fi
    if [ -n "${DEVICES:-}" ]; then
        for _ in $(seq "${ROUNDS:-2}"); do
            for d in "${DEVICES%%,*}" "$DEVICES"; do
                for n in 1 32; do
                    printf -- '--devices %s --seqs %s: ' "$d" "$n"
                    "$B/sparrow" bench --model "$dir" --device cuda --devices "$d" --seqs "$n" --repeat 2 | tail -1 |
                        grep -oE '"(prefill|decode)_tok_s_median":[0-9.]+' | paste -sd' ' || rc=1
                done
            done
        done
    fi
    [ "${QUICK:-0}" = 1 ] && continue
    "$B/sparrow" bench --model "$dir" --device cuda --steps | grep -v '^{' || rc=1
    for n in 8 32; do
        "$B/sparrow" bench --model "$dir" --device cuda --seqs "$n" --repeat 2 | tail -1 || rc=1
    done
    "$B/sparrow" bench --model "$dir" --device cuda --precision exact | tail -1 || rc=1
    for g in 0 1 0 1; do
        echo "-- SPARROW_CUDA_GRAPHS=$g"
        SPARROW_CUDA_GRAPHS=$g "$B/sparrow" bench --model "$dir" --device cuda --repeat 2 | tail -1 || rc=1
    done
    for o in 0 1 0 1; do
        echo "-- SPARROW_CUDA_OVERLAP=$o"
        SPARROW_CUDA_OVERLAP=$o "$B/sparrow" bench --model "$dir" --device cuda --repeat 2 | tail -1 || rc=1
    done
done
exit $rc
