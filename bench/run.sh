#!/usr/bin/env bash
# Runs every benchmark: the programs built from bench/*.c, then the server
# benchmark on a generated model. Each prints one machine-readable line per
# result; speed is asserted here, never in tests.
set -u
cd "$(dirname "$0")/.."
export BUILD="${BUILD:-build}"
rc=0
for b in "$BUILD"/bench/*; do
    [ -x "$b" ] || continue
    echo "== $(basename "$b")"
    "$b" || rc=1
done
tmp="$(mktemp -d "${TMPDIR:-/tmp}/sparrow-bench-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
if tools/make-e2e-model.sh "$tmp/model" >/dev/null 2>&1; then
    echo "== server (tiny Qwen3-MoE, real tokenizer)"
    node bench/server.mjs "$tmp/model" --threads 2 --tokens 64 || rc=1
fi
exit $rc
