#!/usr/bin/env bash
# ranks.sh - sparrow run and serve as ranks of several processes
# (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT, as a launcher such as
# torchrun sets them): each process computes its share of the routed
# experts and the MoE layers' outputs are summed through rank 0 over TCP on
# this host. run's rank 0 prints the text one process prints, greedy and
# sampled, and the other ranks print nothing; serve's rank 0 answers what
# one server answers (the prompt cache's copies and resumes reach the
# others) and names a rank that is gone; a rank that runs another model is
# refused by name.
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

# a host expert cache too small for the model: each rank's process keeps its own experts in one of its own
model=tests/fixtures/qwen3_moe
run "qwen3_moe, one process (greedy)" 0 "$SPARROW" run --model "$model" --threads 1 --tokens "$ids" --max-tokens 24 \
    --ignore-eos --temp 0
cp "$TMP/out" "$TMP/one"
run "2 ranks, each over an expert cache of 5 of the 32 experts" 0 ranks 2 "$model" --tokens "$ids" --max-tokens 24 \
    --ignore-eos --temp 0 --expert-cache 120K
if cmp -s "$TMP/out" "$TMP/one" && [ -s "$TMP/one" ]; then ok "over expert caches: one process's text"
else not_ok "over expert caches: the text differs" "$TMP/one" "$TMP/out" "$TMP/err"; fi
expect "rank 0 read its experts through its cache" "$TMP/err" "misses ("
expect "so did rank 1" "$TMP/err.1" "misses ("

# routing counts: recorded by one process, then the experts placed by them
# over 2 ranks (the same text) and in a plan over 2 GPUs
model=tests/fixtures/qwen3_moe
run "record the routing" 0 "$SPARROW" run --model "$model" --threads 1 --tokens "$ids" --max-tokens 24 --ignore-eos \
    --temp 0 --record-routing "$TMP/routing.json"
cp "$TMP/out" "$TMP/one"
expect "says where the counts went" "$TMP/err" "routing counts written to $TMP/routing.json"
# 28 prompt tokens and 23 decoded ones went through the layers (the last one drawn is not run)
run "the counts' tokens" 0 node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
    const moe = j.counts.filter(r => r); const sums = moe.map(r => r.reduce((a, b) => a + b, 0));
    if (j.tokens !== 51 || j.counts.length !== 3 || j.counts[1] !== null || sums.some(s => s !== 51 * 4))
        throw new Error(JSON.stringify(j));' "$TMP/routing.json"
run "2 ranks placed by the counts" 0 ranks 2 "$model" --tokens "$ids" --max-tokens 24 --ignore-eos --temp 0 \
    --expert-load "$TMP/routing.json"
if cmp -s "$TMP/out" "$TMP/one" && [ -s "$TMP/one" ]; then ok "placed by the counts: one process's text"
else not_ok "placed by the counts: the text differs" "$TMP/one" "$TMP/out" "$TMP/err"; fi
run "a plan by the counts" 0 "$SPARROW" plan "$model" --device cuda --devices 0,1 --gpu-mem-limit 1G \
    --expert-load "$TMP/routing.json"
expect "says the busiest GPU's share" "$TMP/out" "routed experts' tokens, by the routing counts of $TMP/routing.json"
run "the same plan as JSON" 0 "$SPARROW" plan "$model" --device cuda --devices 0,1 --gpu-mem-limit 1G \
    --expert-load "$TMP/routing.json" --json
cp "$TMP/out" "$TMP/plan.json"
run "gives the share and the file" 0 node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
    const d = j.gpu; if (!(d.device_routed_share >= 0.5 && d.device_routed_share < 1) || !d.expert_load.endsWith("routing.json"))
        throw new Error(JSON.stringify(d));' "$TMP/plan.json"
run "a load without ranks" 1 "$SPARROW" run --model "$model" --tokens 1 --expert-load "$TMP/routing.json"
expect "is refused: it would place nothing" "$TMP/err" "--expert-load places the routed experts over ranks"
run "another model's load" 1 ranks 2 tests/fixtures/gpt_oss --tokens "$ids" --expert-load "$TMP/routing.json"
expect "is refused, naming the file" "$TMP/err" "routing.json: counts of 3 layers (\"layers\"), the model has 4"
run "a bench that records" 1 "$SPARROW" bench --model "$model" --record-routing "$TMP/b.json"
expect "is refused: random tokens" "$TMP/err" "record with run or serve"
run "a recording where nothing can be written" 1 "$SPARROW" run --model "$model" --tokens "$ids" \
    --record-routing "$TMP/none/r.json"
expect "is refused before the run" "$TMP/err" "--record-routing $TMP/none/r.json: cannot write in $TMP/none/"
if [ ! -s "$TMP/out" ]; then ok "and nothing was generated"; else not_ok "it generated first" "$TMP/out"; fi
run "a dense model's recording" 1 "$SPARROW" run --model tests/fixtures/llama --tokens 1 --record-routing "$TMP/d.json"
expect "is refused" "$TMP/err" "the model has no routed experts to count"

# a rank of another model: rank 0 says so and every rank fails
port=$((port + 1))
WORLD_SIZE=2 RANK=1 MASTER_PORT="$port" "$SPARROW" run --model tests/fixtures/gpt_oss --threads 1 --tokens "$ids" \
    >"$TMP/out.1" 2>"$TMP/err.1" &
pid=$!
run "a rank of another model" 1 env WORLD_SIZE=2 RANK=0 MASTER_PORT="$port" "$SPARROW" run \
    --model tests/fixtures/qwen3_moe --threads 1 --tokens "$ids"
expect "rank 0 names it" "$TMP/err" "runs another command or model"
# ... or the same model with other arguments (here another seed)
port=$((port + 1))
WORLD_SIZE=2 RANK=1 MASTER_PORT="$port" "$SPARROW" run --model tests/fixtures/qwen3_moe --threads 1 --tokens "$ids" \
    --seed 8 >"$TMP/out.1" 2>"$TMP/err.1" &
pid=$!
run "a rank of other arguments" 1 env WORLD_SIZE=2 RANK=0 MASTER_PORT="$port" "$SPARROW" run \
    --model tests/fixtures/qwen3_moe --threads 1 --tokens "$ids" --seed 7
expect "rank 0 refuses it too" "$TMP/err" "runs another command or model"
wait "$pid"
if wait "$pid"; then not_ok "the other rank failed too"; else ok "the other rank failed too"; fi
expect "the other rank says rank 0 refused it" "$TMP/err.1" "refused"

# serve: rank 0 answers, the others follow; the same texts as one server
run "the e2e model" 0 tools/make-e2e-model.sh "$TMP/e2e"
cat >"$TMP/ask.mjs" <<'JS'
// ask.mjs PORT PROMPT...: each prompt's greedy completion and its cached prompt tokens, a line each (or the error)
const [port, ...prompts] = process.argv.slice(2);
for (const prompt of prompts) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {method: 'POST',
    headers: {'content-type': 'application/json'}, body: JSON.stringify({prompt, max_tokens: 16, temperature: 0})});
  const j = await r.json();
  console.log(r.status, JSON.stringify(j.choices ? j.choices[0].text : j.error.message),
              j.usage?.prompt_tokens_details?.cached_tokens ?? 0);
}
JS
# serve_up OUT ERR ENV...: a server in the background ($!), its port in $sport once ready
serve_up() {
    local out="$1" err="$2"
    shift 2
    env "$@" "$SPARROW" serve --model "$TMP/e2e" --port 0 --threads 1 >"$out" 2>"$err" &
    spid=$!
    sport=
    for _ in $(seq 150); do
        sport=$(grep -o '"port":[0-9]*' "$out" 2>/dev/null | head -1 | cut -d: -f2)
        [ -n "$sport" ] && return 0
        sleep 0.2
    done
    return 1
}
prompts=("Hello there" "Hello there" "The sky is" "Hello there, friend")
serve_up "$TMP/s.out" "$TMP/s.err" WORLD_SIZE=1 && ok "one server up" || not_ok "one server up" "$TMP/s.err"
run "one server answers" 0 node "$TMP/ask.mjs" "$sport" "${prompts[@]}"
cp "$TMP/out" "$TMP/one"
kill "$spid"
wait "$spid"
port=$((port + 1))
WORLD_SIZE=2 RANK=1 MASTER_PORT="$port" "$SPARROW" serve --model "$TMP/e2e" --port 0 --threads 1 \
    >"$TMP/f.out" 2>"$TMP/f.err" &
fpid=$!
serve_up "$TMP/s.out" "$TMP/s.err" WORLD_SIZE=2 RANK=0 MASTER_PORT="$port" && ok "rank 0's server up" ||
    not_ok "rank 0's server up" "$TMP/s.err" "$TMP/f.err"
run "two ranks answer" 0 node "$TMP/ask.mjs" "$sport" "${prompts[@]}"
if cmp -s "$TMP/out" "$TMP/one" && grep -q '^200 ' "$TMP/one"; then ok "the texts of one server"
else not_ok "the texts differ from one server's" "$TMP/one" "$TMP/out" "$TMP/s.err"; fi
if [ "$(sed -n 2p "$TMP/out" | awk '{print $NF}')" -gt 0 ]; then ok "the prompt cache served the repeat"
else not_ok "the prompt cache served no repeat" "$TMP/out"; fi
kill "$spid"
if wait "$spid"; then ok "rank 0 stops on a signal"; else not_ok "rank 0 stops on a signal" "$TMP/s.err"; fi
if wait "$fpid"; then ok "rank 1 stops with it"; else not_ok "rank 1 stops with it" "$TMP/f.err"; fi
# a server that records the routing writes its counts when it stops
serve_up "$TMP/s.out" "$TMP/s.err" WORLD_SIZE=1 SPARROW_RECORD_ROUTING="$TMP/served.json" &&
    ok "a recording server up" || not_ok "a recording server up" "$TMP/s.err"
run "it answers the same" 0 node "$TMP/ask.mjs" "$sport" "${prompts[@]}"
if cmp -s "$TMP/out" "$TMP/one"; then ok "the texts of one server, recording"
else not_ok "recording changed the texts" "$TMP/one" "$TMP/out" "$TMP/s.err"; fi
kill "$spid"
if wait "$spid"; then ok "it stops on a signal"; else not_ok "it stops on a signal" "$TMP/s.err"; fi
expect "having written the counts" "$TMP/s.err" "routing counts written to $TMP/served.json"
run "the counts are of the requests' tokens" 0 node -e 'const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
    if (!(j.tokens > 0) || !j.counts.some(r => r && r.some(c => c > 0))) throw new Error(JSON.stringify(j));' \
    "$TMP/served.json"
# a rank gone: rank 0 answers with the error and keeps serving
port=$((port + 1))
WORLD_SIZE=2 RANK=1 MASTER_PORT="$port" "$SPARROW" serve --model "$TMP/e2e" --port 0 --threads 1 \
    >"$TMP/f.out" 2>"$TMP/f.err" &
fpid=$!
serve_up "$TMP/s.out" "$TMP/s.err" WORLD_SIZE=2 RANK=0 MASTER_PORT="$port" && ok "again, up" || not_ok "again, up" "$TMP/s.err"
kill -9 "$fpid"
wait "$fpid" 2>/dev/null
run "a request after rank 1 is gone" 0 node "$TMP/ask.mjs" "$sport" "Hello there"
expect "its error names the gone rank" "$TMP/out" "another rank is gone"
run "rank 0 still answers" 0 node "$TMP/ask.mjs" "$sport" "The sky is"
expect "with the same error" "$TMP/out" "another rank is gone"
kill "$spid"
wait "$spid"

# the launcher's variables, checked
run "WORLD_SIZE=two" 2 env WORLD_SIZE=two "$SPARROW" run --model tests/fixtures/qwen3_moe --tokens 1
expect "names the variable" "$TMP/err" "WORLD_SIZE: expected a whole number"
run "RANK past WORLD_SIZE" 2 env WORLD_SIZE=2 RANK=2 "$SPARROW" run --model tests/fixtures/qwen3_moe --tokens 1
expect "names RANK" "$TMP/err" "RANK: expected a whole number from 0 to 1"
run "a dense model" 1 env WORLD_SIZE=2 RANK=0 MASTER_PORT=$((port + 1)) "$SPARROW" run --model tests/fixtures/llama \
    --tokens 1
expect "says there are no experts to split" "$TMP/err" "routed experts a layer"
