#!/usr/bin/env bash
# The Quick start's first command: makes a tiny Ling 2.0 (bailing_moe) model
# offline with random weights, quantizes it to MLX mxfp4, and shows what
# sparrow sees in each.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD:-build}"
out="$BUILD/demo"
rm -rf "$out"
"$BUILD/tools/synth" tools/tiny/bailing_moe.json "$out/tiny-ling-bf16" --dtype bf16 --seed 1
"$BUILD/sparrow" quantize "$out/tiny-ling-bf16" "$out/tiny-ling-mxfp4" --mode mxfp4
echo "== $out/tiny-ling-bf16"
"$BUILD/sparrow" inspect "$out/tiny-ling-bf16"
echo
echo "== $out/tiny-ling-mxfp4"
"$BUILD/sparrow" inspect "$out/tiny-ling-mxfp4"
