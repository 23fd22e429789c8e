#!/usr/bin/env bash
# Honest memory: a model whose routed experts are 4x the expert-cache budget
# runs within the plan's memory (anonymous and file-backed resident memory
# measured from /proc/self/status), the bytes read from the files are whole
# experts for the misses and the reads ahead, and prefetching does happen.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

run "a Ling-shaped model with 192 MiB of experts" 0 "$SYNTH" bench/configs/ling-h1024.json "$TMP/m" --dtype bf16 --layers 3
run "bench with a 48 MiB expert cache, cold" 0 "$SPARROW" bench --model "$TMP/m" --prompt 64 --gen 16 --threads 2 --expert-cache 48M --cold
grep '^{' "$TMP/out" | head -1 >"$TMP/r.json"
run "resident memory within the plan; reads match the misses" 0 node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const fail = (m) => { console.error(m, JSON.stringify(r)); process.exit(1); };
    if (r.bench !== "expert-cache") fail("no expert cache");
    if (r.expert_cache_bytes * 3 > 2 * 64 * r.expert_bytes) fail("the experts are not 3x the budget");
    // under AddressSanitizer (SAN=1) its shadow memory, redzones and larger
    // stack frames are anonymous memory the plan does not count (about 50
    // MB of the 110 here, against 59 in the plain build): the bound is looser
    // there, and the plain build holds the 10%
    const slack = process.env.SAN === "1" ? 1.25 : 1.1;
    if (r.rss_anon_bytes > slack * r.plan_anon_bytes) fail("anonymous memory above the plan");
    if (r.rss_file_bytes > 1.1 * r.plan_file_bytes) fail("file-backed memory above the plan: experts were mapped");
    // every read is one whole expert: the misses, plus reads ahead (the last may still be in flight)
    const reads = r.expert_bytes_read / r.expert_bytes;
    if (!Number.isInteger(reads) || reads < r.expert_misses || reads > r.expert_misses + r.prefetch_issued) fail("reads do not match misses");
    if (!(r.prefetch_issued > 0 && r.prefetch_hits > 0)) fail("prefetch is on but its counters did not move");
    if (!(r.hit_rate > 0 && r.hit_rate < 1)) fail("hit rate");' "$TMP/r.json"
