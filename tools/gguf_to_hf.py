#!/usr/bin/env python3
"""gguf_to_hf.py - a GGUF llama model with F32/F16 tensors as a Hugging Face
folder (config.json + model.safetensors, F32), in pure Python.

    python3 tools/gguf_to_hf.py ../shared/models/stories260K.gguf OUT_DIR

It gives sparrow a real trained model offline (stories260K) before sparrow
reads GGUF itself: bench/act_precision.sh scores text with it to measure
what rounding activations costs. Tensor names map to the HF llama names;
Q and K rows go back from GGUF's interleaved rotary pairs to HF's
half-split order (the inverse of the permutation llama.cpp's converter
applies). The vocabulary is written to OUT_DIR/vocab.txt (one token per
line) so token ids can be read back as text; no tokenizer.json is made.
"""
import json
import os
import struct
import sys

GGUF_TYPES = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
F32, F16 = 0, 1


class Reader:
    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.o:self.o + n].decode("utf-8", "replace")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            it, n = self.take("<I"), self.take("<Q")
            return [self.value(it) for _ in range(n)]
        if t not in GGUF_TYPES:
            raise ValueError("unknown GGUF value type %d" % t)
        return self.take(GGUF_TYPES[t])


def read_gguf(path):
    data = open(path, "rb").read()
    r = Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError("%s: not a GGUF file" % path)
    r.o = 4
    version = r.take("<I")
    if version < 2:
        raise ValueError("%s: GGUF version %d is not supported" % (path, version))
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = r.string()
        meta[k] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, dims, r.take("<I"), r.take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (r.o + align - 1) // align * align
    tensors = {}
    for name, dims, t, off in infos:
        count = 1
        for d in dims:
            count *= d
        if t == F32:
            vals = struct.unpack_from("<%df" % count, data, base + off)
        elif t == F16:
            vals = struct.unpack_from("<%de" % count, data, base + off)
        else:
            raise ValueError("%s: tensor %s has GGUF type %d; only F32 and F16 are converted" % (path, name, t))
        tensors[name] = (list(reversed(dims)), vals)  # ggml lists the fastest dimension first
    return meta, tensors


def unpermute_rows(shape, vals, n_head):
    """GGUF row h*D + 2*b + a -> HF row h*D + a*(D/2) + b."""
    rows, cols = shape
    d = rows // n_head
    out = [None] * rows
    for h in range(n_head):
        for b in range(d // 2):
            for a in range(2):
                src = h * d + 2 * b + a
                out[h * d + a * (d // 2) + b] = vals[src * cols:(src + 1) * cols]
    return [v for row in out for v in row]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_to_hf.py MODEL.gguf OUT_DIR")
    meta, tensors = read_gguf(sys.argv[1])
    arch = meta.get("general.architecture")
    if arch != "llama":
        sys.exit("%s: architecture %r; only llama is converted" % (sys.argv[1], arch))
    n_head = meta["llama.attention.head_count"]
    n_kv = meta.get("llama.attention.head_count_kv", n_head)
    hidden = meta["llama.embedding_length"]
    vocab = tensors["token_embd.weight"][0][0]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": meta["llama.feed_forward_length"],
        "num_hidden_layers": meta["llama.block_count"],
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": hidden // n_head,
        "max_position_embeddings": meta.get("llama.context_length", 2048),
        "rms_norm_eps": meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": meta.get("llama.rope.freq_base", 10000.0),
        "vocab_size": vocab,
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", 1),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", 2),
        "torch_dtype": "float32",
    }
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    out = {}
    for name, (shape, vals) in tensors.items():
        parts = name.split(".")
        if name in names:
            hf = names[name]
        elif parts[0] == "blk" and parts[2] in per_layer:
            hf = "model.layers.%s.%s.weight" % (parts[1], per_layer[parts[2]])
            if parts[2] in ("attn_q", "attn_k"):
                vals = unpermute_rows(shape, vals, n_head if parts[2] == "attn_q" else n_kv)
        else:
            sys.exit("%s: tensor %s has no Hugging Face llama name" % (sys.argv[1], name))
        out[hf] = (shape, vals)
    os.makedirs(sys.argv[2], exist_ok=True)
    header, blobs, off = {}, [], 0
    for hf in sorted(out):
        shape, vals = out[hf]
        blob = struct.pack("<%df" % len(vals), *vals)
        header[hf] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(sys.argv[2], "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    with open(os.path.join(sys.argv[2], "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(sys.argv[2], "vocab.txt"), "w", encoding="utf-8") as f:
        for tok in meta.get("tokenizer.ggml.tokens", []):
            f.write(tok.replace("\n", "\\n") + "\n")


if __name__ == "__main__":
    main()
