#!/usr/bin/env bash
# Soak test of `sparrow serve`: starts it with --parallel 4 and an expert
# cache smaller than the routed experts (so experts stream from the files),
# loads it with tools/soak.mjs, stops it with SIGTERM and checks that it
# exited 0 with no sanitizer report. Builds nothing.
#
#   tools/soak.sh SPARROW MODEL_DIR [SECONDS (600)] [CLIENTS (32)]
#
# The model: any MoE with a tokenizer and chat template, e.g. the e2e model
# (tools/make-e2e-model.sh DIR: 2 layers of 8 experts, 384 KiB of experts).
# Environment: EXPERT_CACHE (default 60K), PARALLEL (4), CTX (4096),
# THREADS (2), SERVE_ARGS (more serve flags), SOAK_ARGS (more soak.mjs flags),
# SOAK_DIR (where the server's logs and the summary go; default a new
# temporary folder, kept). Exits 0 only if every check passed.
# Memory figures: take them from the release binary. Under ASan resident
# memory climbs by about the size of its quarantine (256 MB by default) and
# keeps creeping in its allocator; the heap sparrow counts (/metrics) is in
# the summary for both. SERVE_ARGS="--queue 8" makes the 503 backpressure
# path run too (32 clients never fill the default queue of 64).
set -u
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: tools/soak.sh SPARROW MODEL_DIR [SECONDS] [CLIENTS]" >&2; exit 2; }
sparrow="$1" model="$2" secs="${3:-600}" clients="${4:-32}"
dir="${SOAK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sparrow-soak-XXXXXX")}"
mkdir -p "$dir"
fail=0
check() { # NAME OK(0|1)
    if [ "$2" -eq 0 ]; then echo "ok - $1"; else echo "FAIL - $1"; fail=1; fi
}

# ASan/LSan: a report ends the process with an error; keep the reports in
# the log; UBSan prints its stack
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# shellcheck disable=SC2086
"$sparrow" serve --model "$model" --port 0 --parallel "${PARALLEL:-4}" --expert-cache "${EXPERT_CACHE:-60K}" \
    --ctx "${CTX:-4096}" --threads "${THREADS:-2}" ${SERVE_ARGS:-} >"$dir/serve.out" 2>"$dir/serve.err" &
pid=$!
port=""
for _ in $(seq 600); do
    port=$(sed -n 's/^{"event":"ready".*"port":\([0-9]*\).*/\1/p' "$dir/serve.out")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
done
if [ -z "$port" ]; then
    echo "FAIL - the server did not start; $dir/serve.err:" >&2
    tail -n 30 "$dir/serve.err" >&2
    kill -TERM "$pid" 2>/dev/null
    exit 1
fi
grep -q '"strategy":"expert-cache"' "$dir/serve.out"
check "the plan streams experts (expert-cache strategy)" $?
echo "server pid $pid on port $port; logs in $dir"

node tools/soak.mjs --url "http://127.0.0.1:$port" --duration "$secs" --clients "$clients" --pid "$pid" ${SOAK_ARGS:-} \
    >"$dir/summary.json"
soak_rc=$?
cat "$dir/summary.json"
check "soak: no unintended error" $soak_rc

kill -TERM "$pid"
wait "$pid"
serve_rc=$?
echo "server exit code: $serve_rc"
[ "$serve_rc" -eq 0 ]
check "the server exited 0 on SIGTERM" $?
if grep -nE 'ERROR: AddressSanitizer|runtime error:|LeakSanitizer|ERROR: ThreadSanitizer' "$dir/serve.err" >"$dir/sanitizer.txt"; then
    check "no sanitizer report ($dir/sanitizer.txt)" 1
    grep -m1 -A40 -E 'ERROR: |runtime error:' "$dir/serve.err" >&2
else
    check "no sanitizer report" 0
fi
exit $fail
