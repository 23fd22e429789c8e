#!/usr/bin/env bash
# Runs every benchmark program built from bench/*.c. Each prints one
# machine-readable line per result; speed is asserted here, never in tests.
set -u
BUILD="${BUILD:-build}"
rc=0
for b in "$BUILD"/bench/*; do
    [ -x "$b" ] || continue
    echo "== $(basename "$b")"
    "$b" || rc=1
done
exit $rc
