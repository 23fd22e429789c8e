#!/usr/bin/env bash
# The model-folder commands from the outside: synth -> inspect / quantize,
# Hugging Face cache ids, and clear errors (exit 1, no crash) for bad models
# and bad flags (exit 2).
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

for a in bailing_moe qwen3_moe gpt_oss qwen3 llama; do
    run "synth $a" 0 "$SYNTH" "tools/tiny/$a.json" "$TMP/$a" --dtype bf16 --seed 3
    run "inspect $a" 0 "$SPARROW" inspect "$TMP/$a"
    expect "inspect $a names the architecture" "$TMP/out" "architecture  $a"
    run "inspect --json $a" 0 "$SPARROW" inspect --model "$TMP/$a" --json
    cp "$TMP/out" "$TMP/$a.json"
    run "inspect --json $a is JSON" 0 node -e '
        const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
        if (r.architecture !== process.argv[2] || !(r.params.total > 0) || r.bytes.total <= 0) process.exit(1);' \
        "$TMP/$a.json" "$a"
    for mode in "affine --bits 4 --group-size 64" "affine --bits 8" "mxfp4"; do
        q="$TMP/$a-$(echo "$mode" | tr -d ' -')"
        # shellcheck disable=SC2086
        run "quantize $a $mode" 0 "$SPARROW" quantize "$TMP/$a" "$q" --mode $mode
        run "inspect quantized $a $mode" 0 "$SPARROW" inspect "$q"
    done
done
expect "quantized formats are named" "$TMP/out" "mxfp4"
"$SPARROW" inspect "$TMP/bailing_moe-affinebits4groupsize64" >"$TMP/q4"
expect "affine4 with bf16 scales" "$TMP/q4" "affine4-g64/bf16"
expect "router in 8-bit affine" "$TMP/q4" "affine8-g64/bf16"

# --balanced-routing: embeddings of std 1 and expert biases of zero (the plain
# synth of bailing_moe above: std 0.02, biases of std 0.1)
run "synth bailing_moe --balanced-routing" 0 "$SYNTH" tools/tiny/bailing_moe.json "$TMP/balanced" --dtype bf16 --seed 3 --balanced-routing
for d in balanced bailing_moe; do
    run "embedding and expert-bias statistics of $d" 0 node -e '
        const fs = require("fs"), [dir, want] = process.argv.slice(1);
        const b = fs.readFileSync(dir + "/model.safetensors"), n = Number(b.readBigUInt64LE(0));
        const h = JSON.parse(b.subarray(8, 8 + n).toString()), at = (t) => 8 + n + h[t].data_offsets[0];
        const emb = "model.word_embeddings.weight", bias = "model.layers.1.mlp.gate.expert_bias";
        const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
        let ss = 0, zero = true;
        for (let i = 0; i < 4096; i++) { u32[0] = b.readUInt16LE(at(emb) + 2 * i) << 16; ss += f32[0] * f32[0]; }
        for (let i = 0; i < h[bias].shape[0]; i++) if (b.readFloatLE(at(bias) + 4 * i) !== 0) zero = false;
        const std = Math.sqrt(ss / 4096);
        const ok = want === "balanced" ? std > 0.9 && std < 1.1 && zero : std > 0.015 && std < 0.025 && !zero;
        if (h[emb].dtype !== "BF16" || h[bias].dtype !== "F32" || !ok) { console.error(want, std, zero); process.exit(1); }' \
        "$TMP/$d" "$d"
done

# A Hugging Face cache laid out as `hf download` leaves it: blobs + symlinks.
hub="$TMP/hf/hub/models--acme--tiny-ling"
mkdir -p "$hub/blobs" "$hub/refs" "$hub/snapshots/0123abcd"
for f in config.json model.safetensors; do
    cp "$TMP/bailing_moe/$f" "$hub/blobs/$f.blob"
    ln -s "../../blobs/$f.blob" "$hub/snapshots/0123abcd/$f"
done
echo -n 0123abcd >"$hub/refs/main"
run "inspect a Hugging Face id via HF_HOME" 0 env HF_HOME="$TMP/hf" "$SPARROW" inspect acme/tiny-ling
run "inspect a Hugging Face id via HF_HUB_CACHE" 0 env HF_HUB_CACHE="$TMP/hf/hub" "$SPARROW" inspect acme/tiny-ling
run "a missing Hugging Face id" 1 env HF_HUB_CACHE="$TMP/hf/hub" "$SPARROW" inspect acme/absent
expect "says where it looked" "$TMP/err" "$TMP/hf/hub"
expect "and how to get it" "$TMP/err" "hf download acme/absent"

# Bad models: one clear message, exit 1.
bad="$TMP/bad"
cp -r "$TMP/llama" "$bad"
size=$(stat -c %s "$bad/model.safetensors")
truncate -s $((size - 100)) "$bad/model.safetensors"
run "truncated shard" 1 "$SPARROW" inspect "$bad"
expect "truncated shard names the file and tensor" "$TMP/err" "model.safetensors: tensor"
expect "truncated shard says so" "$TMP/err" "file truncated?"
cp "$TMP/llama/model.safetensors" "$bad/"
printf '{"model_type": "llama", ' >"$bad/config.json"
run "invalid config JSON" 1 "$SPARROW" inspect "$bad"
expect "invalid JSON with position" "$TMP/err" "config.json: invalid JSON at line 1"
echo '{"model_type": "rwkv"}' >"$bad/config.json"
run "unknown model type" 1 "$SPARROW" inspect "$bad"
expect "lists the supported types" "$TMP/err" "supported: bailing_moe, bailing_hybrid, qwen3_moe, qwen3_5_moe, gpt_oss, qwen3, llama"
echo '{"model_type": "qwen3_next"}' >"$bad/config.json"
run "recognised, unsupported model type" 1 "$SPARROW" inspect "$bad"
expect "says it is recognised" "$TMP/err" "recognised but not supported yet"
# something other than a file where config.json should be: said what it is
# (a FIFO is never opened: that would wait for a writer for ever)
rm -f "$bad/config.json"
mkdir "$bad/config.json"
run "config.json a directory" 1 timeout 20 "$SPARROW" inspect "$bad"
expect "says it is a directory" "$TMP/err" "config.json is a directory, not a file"
rmdir "$bad/config.json"
mkfifo "$bad/config.json"
run "config.json a FIFO" 1 timeout 20 "$SPARROW" inspect "$bad"
expect "says it is a FIFO" "$TMP/err" "config.json is a FIFO (named pipe), not a file"
rm "$bad/config.json"
ln -s config.json "$bad/config.json"
run "config.json a symlink loop" 1 timeout 20 "$SPARROW" inspect "$bad"
expect "says it is a loop" "$TMP/err" "config.json is a symbolic link loop, not a file"
rm "$bad/config.json"
# values no model can run with: the error names the key
bad_value() {  # NAME KEY VALUE MESSAGE: llama's config with KEY set to VALUE
    node -e 'const fs = require("fs"); const c = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
        c[process.argv[3]] = JSON.parse(process.argv[4]);
        fs.writeFileSync(process.argv[2], JSON.stringify(c).replace("\"@INF@\"", "-1e999"));' \
        "$TMP/llama/config.json" "$bad/config.json" "$2" "$3"
    run "$1" 1 "$SPARROW" inspect "$bad"
    expect "$1: names the key" "$TMP/err" "$4"
}
bad_value "max_position_embeddings 0" max_position_embeddings 0 '"max_position_embeddings": 0 must be positive'
bad_value "rope_theta -inf" rope_theta '"@INF@"' '"rope_theta": -inf must be positive and finite'
bad_value "rope_theta 0" rope_theta 0 '"rope_theta": 0 must be positive'
bad_value "eos_token_id past the vocabulary" eos_token_id 512 '"eos_token_id": 512 is outside the vocabulary (vocab_size 512)'
bad_value "eos_token_id list with a negative id" eos_token_id '[2, -1]' '"eos_token_id": -1 is outside the vocabulary'
cp "$TMP/llama/config.json" "$bad/"
printf 'garbage that is not safetensors' >"$bad/model.safetensors"
cp "$TMP/llama/config.json" "$bad/"
run "not a safetensors file" 1 "$SPARROW" inspect "$bad"
expect "header length message" "$TMP/err" "not a safetensors file?"
run "missing folder" 1 "$SPARROW" inspect "$TMP/nowhere"
run "quantize with a bad mode" 2 "$SPARROW" quantize "$TMP/llama" "$TMP/x" --mode int4
run "quantize with bad bits" 1 "$SPARROW" quantize "$TMP/llama" "$TMP/x" --mode affine --bits 7
run "unknown command" 2 "$SPARROW" frobnicate
run "run --repeat-penalty 0" 2 "$SPARROW" run --model "$TMP/llama" --tokens 1,2 --repeat-penalty 0
expect "names the flag and what it takes" "$TMP/err" "error: --repeat-penalty: expected a number from 0.01 to 100, got \"0\""
run "help" 0 "$SPARROW" --help
