#!/usr/bin/env bash
# The settings' flags of serve, run and bench (--kernels, --precision, --io,
# --expert-policy, --no-prefetch, --mmap, --row-order, --device) and the SPARROW_*
# variables they override: each reaches what it switches, as the JSON line
# of bench (or serve's ready line) reports it, and a bad value is an error
# that names the flag or the variable.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

run "a tiny MoE, bf16" 0 "$SYNTH" tools/tiny/qwen3_moe.json "$TMP/bf16" --dtype bf16 --layers 4
run "its affine4 copy" 0 "$SPARROW" quantize "$TMP/bf16" "$TMP/a4" --mode affine --bits 4 --group-size 64
SMALL=(--prompt 16 --gen 8 --threads 1)
CACHE=(--expert-cache 200K)  # a few experts: misses, reads ahead, evictions

# field NAME: the value of NAME in the first JSON line of $TMP/out
field() { grep -m1 '^{' "$TMP/out" | grep -oE "\"$1\":(\"[^\"]*\"|[0-9.e+-]+)" | sed -E 's/^[^:]*://; s/"//g'; }
# is NAME TEXT WANT: field NAME of the last run is WANT
is() {
    local got
    got="$(field "$2")"
    if [ "$got" = "$3" ]; then ok "$1"; else not_ok "$1 ($2 is \"$got\", wanted \"$3\")" "$TMP/out" "$TMP/err"; fi
}

# the sets this CPU runs, as the error for an unknown one lists them
run "an unknown --kernels is an error" 2 "$SPARROW" bench --model "$TMP/bf16" --kernels sse9 "${SMALL[@]}"
expect "naming the flag and the sets this CPU runs" "$TMP/err" "error: --kernels sse9: not a kernel set this CPU runs; it runs portable"
sets="$(sed -n 's/.*it runs //p' "$TMP/err" | tr -d ',')"
best=$(for s in amx avx512 avxvnni avx2 portable; do case " $sets " in *" $s "*) echo "$s"; break ;; esac; done)
exact=portable
case " $sets " in *" avx2f "*) exact=avx2f ;; esac

run "bench" 0 "$SPARROW" bench --model "$TMP/bf16" "${SMALL[@]}"
is "the best set by default" kernels "$best"
run "bench --kernels portable" 0 "$SPARROW" bench --model "$TMP/bf16" --kernels portable "${SMALL[@]}"
is "runs the portable set" kernels portable
expect "and says so" "$TMP/out" "(portable kernels)"
run "bench --kernels=portable" 0 "$SPARROW" bench --model "$TMP/bf16" --kernels=portable "${SMALL[@]}"
is "the same" kernels portable
run "SPARROW_KERNELS=portable" 0 env SPARROW_KERNELS=portable "$SPARROW" bench --model "$TMP/bf16" "${SMALL[@]}"
is "the variable chooses the set" kernels portable
run "bench --precision exact" 0 "$SPARROW" bench --model "$TMP/bf16" --precision exact "${SMALL[@]}"
is "float activations: $exact" kernels "$exact"
run "SPARROW_PRECISION=exact, --kernels portable" 0 env SPARROW_PRECISION=exact "$SPARROW" bench --model "$TMP/bf16" \
    --kernels portable "${SMALL[@]}"
is "the flag overrides the other's variable" kernels portable
run "SPARROW_KERNELS=portable, --precision fast" 0 env SPARROW_KERNELS=portable "$SPARROW" bench --model "$TMP/bf16" \
    --precision fast "${SMALL[@]}"
is "either way" kernels "$best"
run "--kernels and --precision together" 2 "$SPARROW" run --model "$TMP/bf16" --tokens 1 --kernels portable --precision exact
expect "are an error" "$TMP/err" "--kernels and --precision both choose the kernel set"
run "an unknown SPARROW_KERNELS is an error" 2 env SPARROW_KERNELS=sse9 "$SPARROW" run --model "$TMP/bf16" --tokens 1
expect "naming the variable" "$TMP/err" "error: SPARROW_KERNELS=sse9: not a kernel set this CPU runs"

# the expert cache: how it reads, evicts and reads ahead
run "bench with an expert cache" 0 "$SPARROW" bench --model "$TMP/bf16" "${CACHE[@]}" "${SMALL[@]}"
is "ARC by default" expert_policy arc
default_io="$(field io)"
prefetched="$(field prefetch_issued)"
if [ "${prefetched:-0}" -gt 0 ]; then ok "reads ahead by default"; else not_ok "reads ahead by default" "$TMP/out"; fi
run "--io pread" 0 "$SPARROW" bench --model "$TMP/bf16" --io pread "${CACHE[@]}" "${SMALL[@]}"
if [ "$default_io" = pread ]; then
    ok "reads with pread # SKIP io_uring is refused here"
else
    is "reads with pread" io pread
    run "--io buffered" 0 "$SPARROW" bench --model "$TMP/bf16" --io buffered "${CACHE[@]}" "${SMALL[@]}"
    is "reads through io_uring without O_DIRECT" io io_uring
    run "SPARROW_IO=pread" 0 env SPARROW_IO=pread "$SPARROW" bench --model "$TMP/bf16" "${CACHE[@]}" "${SMALL[@]}"
    is "the variable too" io pread
    run "SPARROW_IO=pread, --io auto" 0 env SPARROW_IO=pread "$SPARROW" bench --model "$TMP/bf16" --io auto \
        "${CACHE[@]}" "${SMALL[@]}"
    is "the flag overrides it" io "$default_io"
fi
run "--expert-policy lru" 0 "$SPARROW" bench --model "$TMP/bf16" --expert-policy lru "${CACHE[@]}" "${SMALL[@]}"
is "LRU" expert_policy lru
run "SPARROW_EXPERT_POLICY=clock" 0 env SPARROW_EXPERT_POLICY=clock "$SPARROW" bench --model "$TMP/bf16" \
    "${CACHE[@]}" "${SMALL[@]}"
is "clock" expert_policy clock
run "--no-prefetch" 0 "$SPARROW" bench --model "$TMP/bf16" --no-prefetch "${CACHE[@]}" "${SMALL[@]}"
is "reads nothing ahead" prefetch_issued 0
run "SPARROW_PREFETCH=0" 0 env SPARROW_PREFETCH=0 "$SPARROW" bench --model "$TMP/bf16" "${CACHE[@]}" "${SMALL[@]}"
is "nor with the variable" prefetch_issued 0

# loading: copies into anonymous memory (2 MiB pages where allowed), interleaved rows
copied() { sed -nE 's/^info: weights: ([0-9.]+) MiB of them copied out of the page cache.*/\1/p' "$TMP/err"; }
run "run" 0 "$SPARROW" run --model "$TMP/bf16" --tokens 1,2,3 --max-tokens 2 --threads 1
if [ "$(copied)" = 0.0 ]; then
    ok "--mmap keeps the files' pages # SKIP nothing is copied here (transparent huge pages off)"
else
    run "run --mmap" 0 "$SPARROW" run --model "$TMP/bf16" --tokens 1,2,3 --max-tokens 2 --threads 1 --mmap
    if [ "$(copied)" = 0.0 ]; then ok "--mmap keeps the files' pages"; else not_ok "--mmap keeps the files' pages" "$TMP/err"; fi
    run "SPARROW_MMAP=1" 0 env SPARROW_MMAP=1 "$SPARROW" run --model "$TMP/bf16" --tokens 1,2,3 --max-tokens 2 --threads 1
    if [ "$(copied)" = 0.0 ]; then ok "so does the variable"; else not_ok "so does the variable" "$TMP/err"; fi
fi
run "run an affine4 model" 0 "$SPARROW" run --model "$TMP/a4" --tokens 1,2,3 --max-tokens 2 --threads 1
if ! grep -q "in interleaved blocks" "$TMP/err"; then
    ok "--row-order keeps rows in order # SKIP the $best set interleaves no affine4 rows"
else
    run "run --row-order" 0 "$SPARROW" run --model "$TMP/a4" --tokens 1,2,3 --max-tokens 2 --threads 1 --row-order
    if grep -q "in interleaved blocks" "$TMP/err"; then not_ok "--row-order keeps rows in order" "$TMP/err"; else ok "--row-order keeps rows in order"; fi
    run "SPARROW_ROW_ORDER=1" 0 env SPARROW_ROW_ORDER=1 "$SPARROW" run --model "$TMP/a4" --tokens 1,2,3 --max-tokens 2 --threads 1
    if grep -q "in interleaved blocks" "$TMP/err"; then not_ok "so does the variable" "$TMP/err"; else ok "so does the variable"; fi
fi

# bad values name the flag or the variable, on every command that takes them
for cmd in "serve --model $TMP/bf16" "run --model $TMP/bf16 --tokens 1" "bench --model $TMP/bf16"; do
    name="${cmd%% *}"
    run "$name --io direct" 2 "$SPARROW" $cmd --io direct
    expect "$name: says what --io takes" "$TMP/err" 'error: --io: expected auto, buffered, pread or mapped, got "direct"'
    run "$name --expert-policy fifo" 2 "$SPARROW" $cmd --expert-policy fifo
    expect "$name: says what --expert-policy takes" "$TMP/err" 'error: --expert-policy: expected arc, lru or clock, got "fifo"'
    run "$name --precision float" 2 "$SPARROW" $cmd --precision float
    expect "$name: says what --precision takes" "$TMP/err" 'error: --precision: expected fast or exact, got "float"'
    run "$name --device tpu" 2 "$SPARROW" $cmd --device tpu
    expect "$name: says what --device takes" "$TMP/err" 'error: --device: expected cpu or cuda, got "tpu"'
    run "$name --mmap=1" 2 "$SPARROW" $cmd --mmap=1
    expect "$name: --mmap takes no value" "$TMP/err" "error: --mmap takes no value"
    run "$name --help" 0 "$SPARROW" $name --help
    expect "$name: --help lists the settings" "$TMP/out" "--expert-policy arc|lru|clock"
done
run "--device cpu" 0 "$SPARROW" run --model "$TMP/bf16" --tokens 1,2,3 --max-tokens 2 --threads 1 --device cpu
# --device cuda: runs where the build and the machine have the GPU; else an
# error that says why (a build without the backend: how to get one)
"$SPARROW" run --model "$TMP/bf16" --tokens 1,2,3 --max-tokens 2 --device cuda >"$TMP/out" 2>"$TMP/err"
rc=$?
if grep -qF "error: --device cuda: this build of sparrow has no cuda backend (build it with make CUDA=1" "$TMP/err"; then
    if [ "$rc" -eq 2 ]; then ok "--device cuda without the backend is a usage error"; else not_ok "--device cuda without the backend is a usage error (exit $rc)" "$TMP/err"; fi
    run "SPARROW_DEVICE=cuda" 2 env SPARROW_DEVICE=cuda "$SPARROW" run --model "$TMP/bf16" --tokens 1
    expect "names the device" "$TMP/err" "error: --device cuda: this build of sparrow has no cuda backend"
elif [ "$rc" -eq 0 ]; then
    ok "--device cuda runs"
elif grep -q "no CUDA device" "$TMP/err"; then
    ok "--device cuda # SKIP $(grep -m1 -o 'no CUDA device.*' "$TMP/err")"
else
    not_ok "--device cuda (exit $rc)" "$TMP/err"
fi
run "SPARROW_IO=direct" 2 env SPARROW_IO=direct "$SPARROW" run --model "$TMP/bf16" --tokens 1
expect "names the variable" "$TMP/err" 'error: SPARROW_IO: expected auto, buffered, pread or mapped, got "direct"'
run "SPARROW_EXPERT_POLICY=fifo" 2 env SPARROW_EXPERT_POLICY=fifo "$SPARROW" bench --model "$TMP/bf16"
expect "names the variable" "$TMP/err" 'error: SPARROW_EXPERT_POLICY: expected arc, lru or clock, got "fifo"'

# serve: the set it runs, in the ready line (serve needs a tokenizer: a two-token one)
cat >"$TMP/bf16/tokenizer.json" <<'EOF'
{"version": "1.0", "added_tokens": [], "normalizer": null, "post_processor": null, "decoder": {"type": "ByteLevel"},
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
 "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}
EOF
"$SPARROW" serve --model "$TMP/bf16" --port 0 --threads 1 --kernels portable >"$TMP/serve.out" 2>"$TMP/serve.err" &
pid=$!
for _ in $(seq 100); do grep -q '"event":"ready"' "$TMP/serve.out" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
expect "serve --kernels portable: the ready line says so" "$TMP/serve.out" '"kernels":"portable"'
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
