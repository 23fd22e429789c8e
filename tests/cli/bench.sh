#!/usr/bin/env bash
# sparrow bench --synthetic: random weights of a config's shapes generated,
# quantized and benchmarked in one command; the model kept with --out, its
# temporary folders deleted otherwise; the flags that go together.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

CFG=tools/tiny/qwen3_moe.json
SMALL=(--layers 1 --prompt 8 --gen 4 --threads 1)
# generated models go to $TMPDIR: a private one, to see what is left in it
export TMPDIR="$TMP/tmpdir"
mkdir -p "$TMPDIR"
left() { find "$TMPDIR" -maxdepth 1 -name 'sparrow-synth-*' | grep -q .; }

run "synthetic affine4" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 "${SMALL[@]}"
expect "the human line" "$TMP/out" "resident: qwen3_moe 1L d128 16x top-4 affine4"
expect "says what it generates" "$TMP/err" "bench: generating $CFG: 1 layer, affine4"
expect "and how long it took" "$TMP/err" "bench: generated in "
grep '^{' "$TMP/out" | head -1 >"$TMP/r.json"
run "the JSON line names the config" 0 node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    if (r.synthetic !== process.argv[2] || !r.format.startsWith("affine4") || r.layers !== 1 || r.architecture !== "qwen3_moe")
        process.exit(1);' "$TMP/r.json" "$CFG"
if left; then not_ok "no sparrow-synth-* folder left in TMPDIR"; else ok "no sparrow-synth-* folder left in TMPDIR"; fi

run "--seqs 3" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --seqs 3 "${SMALL[@]}"
expect "decodes three sequences together" "$TMP/out" "tok/s (3 sequences)"
grep '^{"bench":"resident"' "$TMP/out" >"$TMP/q.json"
run "every sequence's tokens are counted" 0 node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    if (r.sequences !== 3 || r.decode_tokens !== 12 || r.prompt_tokens !== 24 || r.achieved_gbs !== 0) process.exit(1);' "$TMP/q.json"

run "--repeat 3" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --repeat 3 "${SMALL[@]}"
[ "$(grep -c '^{"bench":"resident"' "$TMP/out")" = 3 ] && ok "three runs, a JSON line each" || not_ok "three runs, a JSON line each" "$TMP/out"
expect "then a summary" "$TMP/out" "summary of 3 runs: prefill "
grep '^{"bench":"summary"' "$TMP/out" >"$TMP/s.json"
grep '^{"bench":"resident"' "$TMP/out" >"$TMP/runs.json"
run "the summary holds the runs' medians and bests" 0 node -e '
    const fs = require("fs");
    const s = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    const runs = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map(l => JSON.parse(l));
    const median = v => v.sort((a, b) => a - b)[1];
    const near = (a, b) => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b));
    for (const [k, f] of [["prefill_tok_s", "prefill_tok_s"], ["decode_tok_s", "decode_tok_s"], ["machine_gbs", "machine_gbs"]]) {
        const v = runs.map(r => r[f]);
        if (!near(s[k + "_median"], median(v.slice())) || !near(s[k + "_best"], Math.max(...v))) process.exit(1);
    }
    const eff = median(runs.map(r => r.efficiency_pct));
    const best = 100 * Math.max(...runs.map(r => r.achieved_gbs)) / Math.max(...runs.map(r => r.machine_gbs));
    if (s.runs !== 3 || !near(s.efficiency_pct_median, eff) || !near(s.efficiency_pct_best, best)) process.exit(1);' "$TMP/s.json" "$TMP/runs.json"
# long enough for /proc/stat's clock ticks to move
run "--repeat 3, runs of 512 + 500 tokens" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --repeat 3 --layers 1 --prompt 512 --gen 500 --threads 1
grep '^{"bench":"summary"' "$TMP/out" >"$TMP/s.json"
grep '^{"bench":"resident"' "$TMP/out" >"$TMP/runs.json"
expect "the summary line says the steal" "$TMP/out" "% of the CPU time (most "
run "each run says the share of CPU time a hypervisor kept (steal), the summary its median and most" 0 node -e '
    const fs = require("fs");
    const s = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    const runs = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map(l => JSON.parse(l));
    const v = runs.map(r => r.steal_pct);
    if (!v.every(x => typeof x === "number" && x >= 0 && x <= 100)) process.exit(1);
    const near = (a, b) => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b));
    if (!near(s.steal_pct_median, v.sort((a, b) => a - b)[1]) || !near(s.steal_pct_most, v[2])) process.exit(1);' "$TMP/s.json" "$TMP/runs.json"
run "--compare-mmap with an expert cache" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --expert-cache 64K --compare-mmap "${SMALL[@]}"
grep '^{' "$TMP/out" >"$TMP/cmp.json"
run "the ratio is the expert-cache run's decode over the mmap run's" 0 node -e '
    const l = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(x => JSON.parse(x));
    const [c, m, r] = l;
    if (l.length !== 3 || c.bench !== "expert-cache" || m.bench !== "mmap" || r.bench !== "ratio") process.exit(1);
    if (Math.abs(r.decode_expert_cache_over_mmap - c.decode_tok_s / m.decode_tok_s) > 0.0005 + 1e-9) process.exit(1);' "$TMP/cmp.json"
run "--repeat 0" 2 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --repeat 0 "${SMALL[@]}"
expect "is refused" "$TMP/err" "--repeat"
run "--warmup 2" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --warmup 2 "${SMALL[@]}"
expect "says its uncounted runs" "$TMP/err" "bench: 2 warm-up runs done (not counted)"
[ "$(grep -c '^{"bench":"resident"' "$TMP/out")" = 1 ] && ok "and reports only the counted run" || not_ok "and reports only the counted run" "$TMP/out"
run "--warmup 0" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --warmup 0 "${SMALL[@]}"
if grep -q "warm-up" "$TMP/err"; then not_ok "makes none" "$TMP/err"; else ok "makes none"; fi
run "--warmup -1" 2 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --warmup -1 "${SMALL[@]}"
run "--batch 3: the 8-token prompt in chunks" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --batch 3 "${SMALL[@]}"
grep '^{"bench":"resident"' "$TMP/out" >"$TMP/b.json"
run "all 8 prompt tokens prefilled, 4 decoded" 0 node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    if (r.prompt_tokens !== 8 || r.decode_tokens !== 4 || !(r.prefill_tok_s > 0)) process.exit(1);' "$TMP/b.json"
run "--batch 0" 2 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --batch 0 "${SMALL[@]}"
expect "is refused" "$TMP/err" "--batch: expected an integer from 1"

run "--steps" 0 "$SPARROW" bench --synthetic "$CFG" --quant affine4 --steps "${SMALL[@]}"
expect "a line for prefill" "$TMP/out" "steps, prefill (% of "
expect "and one for decode" "$TMP/out" "steps, decode (% of "
grep '^{"bench":"steps"' "$TMP/out" >"$TMP/steps.json"
run "the steps' multiply-adds are the model's, their times within the phase's" 0 node -e '
    const fs = require("fs");
    const c = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
    const l = fs.readFileSync(process.argv[1], "utf8").trim().split("\n").map(x => JSON.parse(x));
    const d = c.hidden_size, qd = c.num_attention_heads * c.head_dim, kvd = c.num_key_value_heads * c.head_dim;
    const names = ["embed", "norms", "qkv", "attention", "o", "router", "route", "experts", "move", "mlp", "lm_head"];
    // 1 layer; prefill: 8 tokens at positions 0-7, logits for the last; decode: 4 at 8-11, logits for each
    const phases = [["prefill", 8, 1, 36], ["decode", 4, 4, 9 + 10 + 11 + 12]];
    if (l.length !== 2) process.exit(1);
    for (let i = 0; i < 2; i++) {
        const [phase, n, rows, seen] = phases[i], r = l[i];
        if (r.phase !== phase || r.tokens !== n) process.exit(2);
        let sum = 0;
        for (const k of names) {
            if (!(r[k].s >= 0) || !(r[k].macs >= 0)) process.exit(3);
            sum += r[k].s;
        }
        if (sum > r.wall_s + 1e-9) process.exit(4);
        const want = {qkv: n * d * (qd + 2 * kvd), o: n * qd * d, router: n * d * c.num_experts,
            experts: n * c.num_experts_per_tok * 3 * d * c.moe_intermediate_size, mlp: 0,
            lm_head: rows * d * c.vocab_size, attention: 2 * seen * qd};
        for (const k in want) if (r[k].macs !== want[k]) { console.error(phase, k, r[k].macs, want[k]); process.exit(5); }
    }' "$TMP/steps.json" "$CFG"

run "synthetic mxfp4 kept with --out" 0 "$SPARROW" bench --synthetic "$CFG" --quant mxfp4 --out "$TMP/mx" "${SMALL[@]}"
expect "says where it is kept" "$TMP/err" "kept in $TMP/mx"
run "inspect the kept folder" 0 "$SPARROW" inspect "$TMP/mx"
grep -E '^mxfp4 +[0-9]' "$TMP/out" >/dev/null && ok "it is mxfp4" || not_ok "it is mxfp4" "$TMP/out"
if left; then not_ok "no temporary bf16 folder left"; else ok "no temporary bf16 folder left"; fi
run "synthetic bf16 kept with --out" 0 "$SPARROW" bench --synthetic "$CFG" --quant bf16 --out "$TMP/bf" "${SMALL[@]}"
run "inspect it" 0 "$SPARROW" inspect "$TMP/bf"
expect "it has 1 layer" "$TMP/out" "qwen3_moe: 1 layers"
grep -E '^bf16 +[0-9]' "$TMP/out" >/dev/null && ok "it is bf16" || not_ok "it is bf16" "$TMP/out"
run "--out a folder that holds files" 1 "$SPARROW" bench --synthetic "$CFG" --quant bf16 --out "$TMP/bf" "${SMALL[@]}"
expect "is refused" "$TMP/err" "not an empty folder"
run "a config that does not exist" 1 "$SPARROW" bench --synthetic "$TMP/none.json" --quant affine4 "${SMALL[@]}"
if left; then not_ok "nothing left after a failure"; else ok "nothing left after a failure"; fi

run "--model with --synthetic" 2 "$SPARROW" bench --model "$TMP/bf" --synthetic "$CFG" --quant bf16
expect "names the conflict" "$TMP/err" "--model and --synthetic exclude each other"
run "neither --model nor --synthetic" 2 "$SPARROW" bench --prompt 8
expect "asks for one" "$TMP/err" "give --model MODEL or --synthetic CONFIG.json"
run "--synthetic without --quant" 2 "$SPARROW" bench --synthetic "$CFG"
expect "asks for --quant" "$TMP/err" "--synthetic needs --quant"
run "an unknown --quant" 2 "$SPARROW" bench --synthetic "$CFG" --quant q5
expect "lists the formats" "$TMP/err" "unknown --quant q5 (affine4, affine8, mxfp4 or bf16)"
for f in "--quant affine4" "--layers 1" "--out $TMP/x"; do
    run "${f%% *} with --model" 2 "$SPARROW" bench --model "$TMP/bf" $f
    expect "says it needs --synthetic" "$TMP/err" "${f%% *} applies only to --synthetic"
done
