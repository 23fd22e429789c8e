#!/usr/bin/env bash
# ranks.sh - sparrow run as ranks of several processes (WORLD_SIZE, RANK,
# MASTER_ADDR, MASTER_PORT, as a launcher such as torchrun sets them): each
# process computes its share of the routed experts and the MoE layers'
# outputs are summed through rank 0 over TCP on this host. Rank 0 prints
# the text one process prints, greedy and sampled; the other ranks print
# nothing; a rank that runs another model is refused by name.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

ids=$(seq 10 7 200 | paste -sd,)
port=$((20000 + RANDOM % 20000))

# ranks N MODEL ARGS...: N processes of sparrow run on MODEL; rank 0's
# stdout in $TMP/out, its stderr in $TMP/err, rank r's in $TMP/out.r, $TMP/err.r
ranks() {
    local n="$1" model="$2" pids=() rc=0
    shift 2
    port=$((port + 1))
    for r in $(seq 1 $((n - 1))); do
        WORLD_SIZE="$n" RANK="$r" MASTER_PORT="$port" "$SPARROW" run --model "$model" --threads 1 "$@" \
            >"$TMP/out.$r" 2>"$TMP/err.$r" &
        pids+=($!)
    done
    WORLD_SIZE="$n" RANK=0 MASTER_PORT="$port" "$SPARROW" run --model "$model" --threads 1 "$@" >"$TMP/out" 2>"$TMP/err" || rc=1
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

for fx in qwen3_moe bailing_moe gpt_oss; do
    model="tests/fixtures/$fx"
    for sampling in "--temp 0" "--temp 0.8 --top-k 40 --seed 7"; do
        # shellcheck disable=SC2086
        run "$fx, one process ($sampling)" 0 "$SPARROW" run --model "$model" --threads 1 --tokens "$ids" \
            --max-tokens 24 --ignore-eos $sampling
        cp "$TMP/out" "$TMP/one"
        for n in 2 3; do
            # shellcheck disable=SC2086
            run "$fx, $n ranks ($sampling)" 0 ranks "$n" "$model" --tokens "$ids" --max-tokens 24 --ignore-eos $sampling
            if cmp -s "$TMP/out" "$TMP/one" && [ -s "$TMP/one" ]; then ok "$fx, $n ranks: rank 0's text is one process's"
            else not_ok "$fx, $n ranks: rank 0's text differs" "$TMP/one" "$TMP/out" "$TMP/err"; fi
            if [ ! -s "$TMP/out.1" ]; then ok "$fx, $n ranks: rank 1 prints nothing"
            else not_ok "$fx, $n ranks: rank 1 printed" "$TMP/out.1"; fi
        done
    done
done

# a rank of another model: rank 0 says so and every rank fails
port=$((port + 1))
WORLD_SIZE=2 RANK=1 MASTER_PORT="$port" "$SPARROW" run --model tests/fixtures/gpt_oss --threads 1 --tokens "$ids" \
    >"$TMP/out.1" 2>"$TMP/err.1" &
pid=$!
run "a rank of another model" 1 env WORLD_SIZE=2 RANK=0 MASTER_PORT="$port" "$SPARROW" run \
    --model tests/fixtures/qwen3_moe --threads 1 --tokens "$ids"
expect "rank 0 names it" "$TMP/err" "runs another model or shape"
if wait "$pid"; then not_ok "the other rank failed too"; else ok "the other rank failed too"; fi
expect "the other rank says rank 0 refused it" "$TMP/err.1" "refused"

run "serve as ranks" 2 env WORLD_SIZE=2 "$SPARROW" serve --model tests/fixtures/qwen3_moe
expect "says it does not yet" "$TMP/err" "serve does not run as ranks of several processes yet"

# the launcher's variables, checked
run "WORLD_SIZE=two" 2 env WORLD_SIZE=two "$SPARROW" run --model tests/fixtures/qwen3_moe --tokens 1
expect "names the variable" "$TMP/err" "WORLD_SIZE: expected a whole number"
run "RANK past WORLD_SIZE" 2 env WORLD_SIZE=2 RANK=2 "$SPARROW" run --model tests/fixtures/qwen3_moe --tokens 1
expect "names RANK" "$TMP/err" "RANK: expected a whole number from 0 to 1"
run "a dense model" 1 env WORLD_SIZE=2 RANK=0 MASTER_PORT=$((port + 1)) "$SPARROW" run --model tests/fixtures/llama \
    --tokens 1
expect "says there are no experts to split" "$TMP/err" "routed experts a layer"
