#!/usr/bin/env bash
# Load progress (core/progress.h): a load prints its final line with the
# bytes, seconds and rate, the same in every command that loads a model;
# progress lines only for loads of a second or more (never here: the model
# is small), nothing at all with --quiet; on a terminal too (script(1)).
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

FINAL='^info: weights in memory: [0-9]+ bytes \([0-9]+\.[0-9]{2} (MiB|GiB)\) in [0-9]+\.[0-9]{2} s, [0-9]+\.[0-9]{2} GB/s$'
run "a model" 0 env BUILD="$BUILD" tools/make-e2e-model.sh "$TMP/m"
bytes=$(stat -c %s "$TMP/m/model.safetensors")

# final NAME: stderr ($TMP/err) has exactly one final line, of the model's bytes, and no progress line
final() {
    local lines
    lines=$(grep -cE "$FINAL" "$TMP/err")
    if [ "$lines" -eq 1 ] && grep -qE "^info: weights in memory: $bytes bytes " "$TMP/err" &&
        ! grep -qE 'GiB \([0-9]+%\)|MiB \([0-9]+%\)' "$TMP/err" && ! grep -q $'\r' "$TMP/err"; then
        ok "$1"
    else
        not_ok "$1 ($lines final lines; $bytes bytes expected)" "$TMP/err"
    fi
}

run "run" 0 "$SPARROW" run --model "$TMP/m" --tokens 1,2,3 --max-tokens 2 --threads 2
final "run: the final line of the load, stderr not a terminal"
run "run --mmap" 0 "$SPARROW" run --model "$TMP/m" --tokens 1,2,3 --max-tokens 2 --threads 2 --mmap
final "run --mmap: the pages faulted in are counted the same"
run "bench" 0 "$SPARROW" bench --model "$TMP/m" --prompt 8 --gen 2 --threads 2
final "bench: the same final line"

run "run --quiet" 0 "$SPARROW" run --model "$TMP/m" --tokens 1,2,3 --max-tokens 2 --threads 2 --quiet
if ! grep -q '^info:' "$TMP/err" && [ -s "$TMP/out" ]; then ok "--quiet: no info line, no progress"
else not_ok "--quiet: no info line, no progress" "$TMP/err"; fi

# serve: the final line comes before the ready line
"$SPARROW" serve --model "$TMP/m" --port 0 --threads 2 --ctx 64 >"$TMP/serve.out" 2>"$TMP/err" &
pid=$!
for _ in $(seq 100); do grep -q '"event":"ready"' "$TMP/serve.out" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$pid" 2>/dev/null
wait "$pid"
rc=$?
if [ "$rc" -eq 0 ]; then ok "serve starts and stops"; else not_ok "serve starts and stops (exit $rc)" "$TMP/err"; fi
final "serve: the same final line"

# on a terminal: still only the final line for a short load (a pty writes \r\n)
if command -v script >/dev/null; then
    script -qec "$SPARROW run --model $TMP/m --tokens 1,2,3 --max-tokens 2 --threads 2 2>&1 >/dev/null" /dev/null |
        tr -d '\r' >"$TMP/err"
    final "run on a terminal: the final line, no progress for a short load"
else
    ok "run on a terminal # SKIP no script(1)"
fi
