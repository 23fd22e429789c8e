#!/usr/bin/env node
// gguf_to_hf.mjs - a GGUF llama model with F32/F16 tensors as a Hugging Face
// folder (config.json + model.safetensors, F32), for Node with no packages.
//
//     node tools/gguf_to_hf.mjs ../shared/models/stories260K.gguf OUT_DIR
//
// It gives sparrow a real trained model offline (stories260K) before sparrow
// reads GGUF itself: tests/cli/stories.sh and bench/act_precision.sh use it.
// Tensor names map to the Hugging Face llama names; Q and K rows go back from
// GGUF's interleaved rotary pairs to Hugging Face's half-split order (the
// inverse of the permutation llama.cpp's converter applies). The vocabulary
// goes to OUT_DIR/vocab.txt (one token per line, "\n" escaped) so that token
// ids can be read back as text; no tokenizer.json is made.
import fs from "node:fs";
import path from "node:path";

const F32 = 0, F16 = 1;
const SCALARS = { 0: [1, "getUint8"], 1: [1, "getInt8"], 2: [2, "getUint16"], 3: [2, "getInt16"], 4: [4, "getUint32"],
                  5: [4, "getInt32"], 6: [4, "getFloat32"], 7: [1, "getUint8"], 10: [8, "getBigUint64"],
                  11: [8, "getBigInt64"], 12: [8, "getFloat64"] };

function fail(msg) {
    process.stderr.write(`gguf_to_hf: ${msg}\n`);
    process.exit(1);
}

function readGguf(file) {
    const buf = fs.readFileSync(file);
    const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    let o = 0;
    const u32 = () => { const v = dv.getUint32(o, true); o += 4; return v; };
    const u64 = () => { const v = Number(dv.getBigUint64(o, true)); o += 8; return v; };
    const str = () => { const n = u64(); const s = buf.toString("utf8", o, o + n); o += n; return s; };
    const value = (t) => {
        if (t === 8) return str();
        if (t === 9) {
            const it = u32(), n = u64(), a = [];
            for (let i = 0; i < n; i++) a.push(value(it));
            return a;
        }
        if (!(t in SCALARS)) fail(`${file}: unknown GGUF value type ${t}`);
        const [size, get] = SCALARS[t];
        const v = dv[get](o, true);
        o += size;
        return typeof v === "bigint" ? Number(v) : v;
    };
    if (buf.toString("latin1", 0, 4) !== "GGUF") fail(`${file}: not a GGUF file`);
    o = 4;
    const version = u32();
    if (version < 2) fail(`${file}: GGUF version ${version} is not supported`);
    const nTensors = u64(), nKv = u64();
    const meta = {};
    for (let i = 0; i < nKv; i++) {
        const k = str();
        meta[k] = value(u32());
    }
    const infos = [];
    for (let i = 0; i < nTensors; i++) {
        const name = str(), nd = u32(), dims = [];
        for (let d = 0; d < nd; d++) dims.push(u64());
        infos.push({ name, dims, type: u32(), offset: u64() });
    }
    const align = meta["general.alignment"] ?? 32;
    const base = Math.ceil(o / align) * align;
    const tensors = {};
    for (const t of infos) {
        const count = t.dims.reduce((a, b) => a * b, 1), at = base + t.offset;
        const vals = new Float32Array(count);
        if (t.type === F32) for (let i = 0; i < count; i++) vals[i] = dv.getFloat32(at + 4 * i, true);
        else if (t.type === F16) for (let i = 0; i < count; i++) vals[i] = halfToFloat(dv.getUint16(at + 2 * i, true));
        else fail(`${file}: tensor ${t.name} has GGUF type ${t.type}; only F32 and F16 are converted`);
        tensors[t.name] = { shape: [...t.dims].reverse(), vals };  // ggml lists the fastest dimension first
    }
    return { meta, tensors };
}

function halfToFloat(h) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e === 0) return s * m * 2 ** -24;
    if (e === 31) return m ? NaN : s * Infinity;
    return s * (1 + m / 1024) * 2 ** (e - 15);
}

// GGUF row h*D + 2*b + a -> Hugging Face row h*D + a*(D/2) + b
function unpermuteRows({ shape, vals }, nHead) {
    const [rows, cols] = shape, d = rows / nHead, out = new Float32Array(vals.length);
    for (let h = 0; h < nHead; h++)
        for (let b = 0; b < d / 2; b++)
            for (let a = 0; a < 2; a++) {
                const src = h * d + 2 * b + a, dst = h * d + a * (d / 2) + b;
                out.set(vals.subarray(src * cols, (src + 1) * cols), dst * cols);
            }
    return { shape, vals: out };
}

const [file, outDir] = process.argv.slice(2);
if (!file || !outDir) fail("usage: node tools/gguf_to_hf.mjs MODEL.gguf OUT_DIR");
const { meta, tensors } = readGguf(file);
if (meta["general.architecture"] !== "llama") fail(`${file}: architecture ${meta["general.architecture"]}; only llama is converted`);
const nHead = meta["llama.attention.head_count"], nKv = meta["llama.attention.head_count_kv"] ?? nHead;
const hidden = meta["llama.embedding_length"];
if (!tensors["token_embd.weight"]) fail(`${file}: no token_embd.weight`);
const config = {
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    hidden_size: hidden,
    intermediate_size: meta["llama.feed_forward_length"],
    num_hidden_layers: meta["llama.block_count"],
    num_attention_heads: nHead,
    num_key_value_heads: nKv,
    head_dim: hidden / nHead,
    max_position_embeddings: meta["llama.context_length"] ?? 2048,
    rms_norm_eps: meta["llama.attention.layer_norm_rms_epsilon"] ?? 1e-5,
    rope_theta: meta["llama.rope.freq_base"] ?? 10000.0,
    vocab_size: tensors["token_embd.weight"].shape[0],
    hidden_act: "silu",
    tie_word_embeddings: !("output.weight" in tensors),
    bos_token_id: meta["tokenizer.ggml.bos_token_id"] ?? 1,
    eos_token_id: meta["tokenizer.ggml.eos_token_id"] ?? 2,
    torch_dtype: "float32",
};
const names = { "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight" };
const perLayer = { attn_norm: "input_layernorm", attn_q: "self_attn.q_proj", attn_k: "self_attn.k_proj",
                   attn_v: "self_attn.v_proj", attn_output: "self_attn.o_proj", ffn_norm: "post_attention_layernorm",
                   ffn_gate: "mlp.gate_proj", ffn_up: "mlp.up_proj", ffn_down: "mlp.down_proj" };
const out = {};
for (const [name, t] of Object.entries(tensors)) {
    const p = name.split(".");
    if (name in names) out[names[name]] = t;
    else if (p[0] === "blk" && p[2] in perLayer) {
        const hf = `model.layers.${p[1]}.${perLayer[p[2]]}.weight`;
        out[hf] = p[2] === "attn_q" ? unpermuteRows(t, nHead) : p[2] === "attn_k" ? unpermuteRows(t, nKv) : t;
    } else fail(`${file}: tensor ${name} has no Hugging Face llama name`);
}
fs.mkdirSync(outDir, { recursive: true });
const header = {}, blobs = [];
let off = 0;
for (const hf of Object.keys(out).sort()) {
    const { shape, vals } = out[hf];
    header[hf] = { dtype: "F32", shape, data_offsets: [off, off + vals.byteLength] };
    blobs.push(Buffer.from(vals.buffer, vals.byteOffset, vals.byteLength));
    off += vals.byteLength;
}
let h = Buffer.from(JSON.stringify(header));
h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
const len = Buffer.alloc(8);
len.writeBigUInt64LE(BigInt(h.length));
fs.writeFileSync(path.join(outDir, "model.safetensors"), Buffer.concat([len, h, ...blobs]));
fs.writeFileSync(path.join(outDir, "config.json"), JSON.stringify(config, null, 1) + "\n");
const vocab = (meta["tokenizer.ggml.tokens"] ?? []).map((t) => t.replace(/\n/g, "\\n"));
fs.writeFileSync(path.join(outDir, "vocab.txt"), vocab.join("\n") + "\n");
