#!/usr/bin/env bash
# sparrow plan: strategies, budgets and errors from tensor headers alone, on
# generated models and on shape-only (sparse) Ling-flash-2.0 and
# Qwen3.5-122B-A10B.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

"$SYNTH" tools/tiny/bailing_moe.json "$TMP/ling" --dtype bf16 >/dev/null 2>&1
run "plan fits: resident" 0 "$SPARROW" plan "$TMP/ling" --mem-limit 1G
expect "resident strategy" "$TMP/out" "plan            resident (bailing_moe)"
expect "defaults are said to be defaults" "$TMP/out" "conservative defaults"
# the tiny model's bf16 experts are 48 KiB each; 200 KiB holds four of them
run "plan forced to an expert cache" 0 "$SPARROW" plan "$TMP/ling" --mem-limit 1G --expert-cache 200K
expect "expert-cache strategy" "$TMP/out" "plan            expert-cache (bailing_moe)"
expect "four experts cached" "$TMP/out" "= 4 of 32 experts"
run "plan --json" 0 "$SPARROW" plan "$TMP/ling" --mem-limit 1G --expert-cache 200K --json
cp "$TMP/out" "$TMP/plan.json"
run "plan --json parses" 0 node -e '
    const p = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    if (p.strategy !== "expert-cache" || p.cached_experts !== 4 || p.expert_bytes !== 49152 ||
        !(p.disk_bytes_per_token > 0) || p.limit_source !== "--mem-limit") process.exit(1);' "$TMP/plan.json"
run "--expert-cache 0 is an error" 1 "$SPARROW" plan "$TMP/ling" --expert-cache 0
expect "that names the minimum" "$TMP/err" "the minimum is 49152 bytes"
run "a limit too small for what every token needs" 1 "$SPARROW" plan "$TMP/ling" --mem-limit 20M
expect "says what does not fit" "$TMP/err" "what every token needs"
run "a bad size" 2 "$SPARROW" plan "$TMP/ling" --mem-limit 12Q

# Ling-flash-2.0 in mxfp4, shapes only: the published totals, planned at 64 and 24 GiB
run "shape-only Ling-flash-2.0" 0 "$SYNTH" bench/configs/ling-flash-2.0.json "$TMP/flash" --dtype bf16 --sparse --shard-size 5G
run "its mxfp4 layout, shapes only" 0 "$SPARROW" quantize "$TMP/flash" "$TMP/flash-mxfp4" --mode mxfp4 --sparse
run "inspect it" 0 "$SPARROW" inspect "$TMP/flash-mxfp4"
expect "102.89B parameters" "$TMP/out" "102.89B total, 6.15B active per token (4.86B without embeddings)"
run "plan at 64 GiB" 0 "$SPARROW" plan "$TMP/flash-mxfp4" --mem-limit 64G --ctx 8192
expect "fits at 64 GiB" "$TMP/out" "plan            resident"
run "plan at 24 GiB" 0 "$SPARROW" plan "$TMP/flash-mxfp4" --mem-limit 24G --ctx 8192
expect "streams at 24 GiB" "$TMP/out" "plan            expert-cache"
# the device tier, from headers alone (no GPU needed once --gpu-mem-limit is given)
run "plan for a 24 GiB GPU" 0 "$SPARROW" plan "$TMP/flash-mxfp4" --mem-limit 64G --ctx 8192 --device cuda --gpu-mem-limit 24G
expect "host memory holds the model" "$TMP/out" "plan            resident"
expect "the GPU caches experts" "$TMP/out" "cuda            expert cache of"
run "plan for a 24 GiB GPU --json" 0 "$SPARROW" plan "$TMP/flash-mxfp4" --mem-limit 64G --ctx 8192 --device cuda --gpu-mem-limit 24G --json
cp "$TMP/out" "$TMP/gpu.json"
run "its device tier in JSON" 0 node -e '
    const p = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")), g = p.gpu;
    const total = 256 * 31;  // experts x MoE layers
    if (p.device !== "cuda" || g.experts !== "expert-cache" || g.limit_source !== "--gpu-mem-limit" ||
        !(g.cached_experts > 0 && g.cached_experts < total) || !(g.h2d_bytes_per_token > 0) ||
        g.base_bytes + g.expert_cache_bytes > g.usable_bytes || p.host_expert_cache_bytes !== 0) process.exit(1);' "$TMP/gpu.json"
run "plan for an 80 GiB GPU" 0 "$SPARROW" plan "$TMP/flash-mxfp4" --mem-limit 24G --ctx 8192 --device cuda --gpu-mem-limit 80G
expect "every expert on the GPU" "$TMP/out" "every routed expert on the device"
run "a GPU too small for what every token needs" 1 "$SPARROW" plan "$TMP/flash-mxfp4" --mem-limit 64G --device cuda --gpu-mem-limit 2G
expect "says what does not fit on it" "$TMP/err" "do not hold what every token needs there"
# several GPUs: each MoE layer's experts split over them, the rest on each.
# Ling-flash-2.0 in bf16 (192 GiB) does not fit one 141 GiB GPU, and does two
run "bf16 Ling-flash-2.0 on one 141 GiB GPU" 0 "$SPARROW" plan "$TMP/flash" --mem-limit 512G --ctx 8192 --device cuda --gpu-mem-limit 141G
expect "caches experts" "$TMP/out" "cuda            expert cache of"
run "... on two" 0 "$SPARROW" plan "$TMP/flash" --mem-limit 512G --ctx 8192 --device cuda --gpu-mem-limit 141G --devices 0,1
expect "splits the experts" "$TMP/out" "cuda x2         each MoE layer's 256 experts split over the devices: at most 128 a layer on one, 3968 in all"
expect "and holds them all" "$TMP/out" "cuda x2         every routed expert on the device holding it"
expect "says what a device reads and sends" "$TMP/out" "KiB sent (the MoE layers' outputs summed over the devices)"
run "... on two, --json" 0 "$SPARROW" plan "$TMP/flash" --mem-limit 512G --ctx 8192 --device cuda --gpu-mem-limit 141G --devices 0,1 --json
cp "$TMP/out" "$TMP/gpu2.json"
run "each device's share in JSON" 0 node -e '
    const p = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")), g = p.gpu;
    const routed = 8 * 31 * p.expert_bytes;  // a token: 8 experts in each of 31 MoE layers
    if (g.devices !== 2 || g.experts !== "resident" || g.device_experts !== 128 * 31 ||
        g.device_expert_bytes * 2 !== p.routed_expert_bytes || g.base_bytes + g.device_expert_bytes > g.usable_bytes ||
        Math.abs(g.device_bytes_per_token - (p.bytes_per_token - routed / 2)) > 1 ||
        g.link_bytes_per_token !== 31 * 4096 * 4 * 2 / 2 || g.h2d_bytes_per_token !== 0) process.exit(1);' "$TMP/gpu2.json"
run "three 24 GiB GPUs" 0 "$SPARROW" plan "$TMP/flash-mxfp4" --mem-limit 64G --ctx 8192 --device cuda --gpu-mem-limit 24G --devices 0,1,2 --json
cp "$TMP/out" "$TMP/gpu3.json"
run "each caches its share" 0 node -e '
    const p = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")), g = p.gpu;
    if (g.devices !== 3 || g.device_experts !== 86 * 31 || !(g.cached_experts > 0 && g.cached_experts <= g.device_experts) ||
        g.link_bytes_per_token !== 31 * 4096 * 4 * 2 * 2 / 3 - ((31 * 4096 * 4 * 2 * 2) % 3) / 3) process.exit(1);' "$TMP/gpu3.json"
run "--devices 0,0" 2 "$SPARROW" plan "$TMP/flash" --device cuda --gpu-mem-limit 141G --devices 0,0
expect "names the device given twice" "$TMP/err" "GPU 0 given twice"
run "--devices a" 2 "$SPARROW" plan "$TMP/flash" --device cuda --gpu-mem-limit 141G --devices a
expect "says what it expected" "$TMP/err" "expected GPU numbers separated by commas"
run "--devices 0,64" 2 "$SPARROW" plan "$TMP/flash" --device cuda --gpu-mem-limit 141G --devices 0,64
run "--devices 0, (a comma last)" 2 "$SPARROW" plan "$TMP/flash" --device cuda --gpu-mem-limit 141G --devices 0,
run "--devices on the CPU" 1 "$SPARROW" plan "$TMP/flash" --mem-limit 512G --devices 0,1
expect "says it needs a GPU device" "$TMP/err" "needs a GPU device"
run "run --devices on the CPU" 1 "$SPARROW" run --model "$TMP/flash" --mem-limit 512G --devices 0,1 --tokens 1,2
expect "says it needs a GPU device" "$TMP/err" "needs a GPU device"

# Qwen3.5-122B-A10B in mxfp4, shapes only: 36 Gated DeltaNet layers, whose
# recurrent state the plan counts (the same at any context)
run "shape-only Qwen3.5-122B-A10B" 0 "$SYNTH" bench/configs/qwen3.5-122b-a10b.json "$TMP/q122" --dtype bf16 --sparse --shard-size 5G
run "its mxfp4 layout, shapes only" 0 "$SPARROW" quantize "$TMP/q122" "$TMP/q122-mxfp4" --mode mxfp4 --sparse
run "inspect it" 0 "$SPARROW" inspect "$TMP/q122-mxfp4"
expect "122.11B parameters" "$TMP/out" "122.11B total, 9.77B active per token"
expect "its layer kinds" "$TMP/out" "36 of 48 layers Gated DeltaNet: 16 key heads x 128, 64 value heads x 128"
run "plan at 64 GiB" 0 "$SPARROW" plan "$TMP/q122-mxfp4" --mem-limit 64G --ctx 8192
expect "60 GiB of files cache experts at 64 GiB" "$TMP/out" "plan            expert-cache (qwen3_5_moe)"
expect "the recurrent state counted" "$TMP/out" "recurrent states 0.29 GiB: 149.1 MiB a sequence"
run "plan at 24 GiB, 4 sequences" 0 "$SPARROW" plan "$TMP/q122-mxfp4" --mem-limit 24G --ctx 8192 --parallel 4 --json
cp "$TMP/out" "$TMP/q122.json"
run "its recurrent state in JSON, per sequence" 0 node -e '
    const p = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const per = 36 * 4 * (3 * 12288 + 64 * 128 * 128) * 2;  // layers x bytes x (conv + matrices) x (state + snapshot)
    if (p.strategy !== "expert-cache" || p.recurrent_state_bytes !== 4 * per || !(p.kv_cache_bytes > 4 * per))
        process.exit(1);' "$TMP/q122.json"

# Ling-2.6-flash in mxfp4, shapes only: 28 Lightning layers (their states
# counted) and 4 MLA layers (their absorbed query matrices composed at load, counted)
run "shape-only Ling-2.6-flash" 0 "$SYNTH" bench/configs/ling-2.6-flash.json "$TMP/l26" --dtype bf16 --sparse --shard-size 5G
run "its mxfp4 layout, shapes only" 0 "$SPARROW" quantize "$TMP/l26" "$TMP/l26-mxfp4" --mode mxfp4 --sparse
run "inspect it" 0 "$SPARROW" inspect "$TMP/l26-mxfp4"
expect "104.19B parameters" "$TMP/out" "104.19B total, 7.45B active per token"
expect "its layer kinds" "$TMP/out" "28 of 32 layers Lightning (4 output norm groups), 4 MLA: q rank 1536, kv rank 512"
expect "what MLA composes" "$TMP/out" "(with 436.78 MiB composed at load)"
run "plan at 64 GiB" 0 "$SPARROW" plan "$TMP/l26-mxfp4" --mem-limit 64G --ctx 8192
expect "fits at 64 GiB" "$TMP/out" "plan            resident (bailing_hybrid)"
expect "the recurrent state counted" "$TMP/out" "recurrent states 0.11 GiB: 56.0 MiB a sequence"
run "plan at 24 GiB" 0 "$SPARROW" plan "$TMP/l26-mxfp4" --mem-limit 24G --ctx 8192
expect "streams at 24 GiB" "$TMP/out" "plan            expert-cache (bailing_hybrid)"
