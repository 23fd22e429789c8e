#!/usr/bin/env bash
# Runs every test program given on the command line (cmocka binaries and
# tests/*.sh scripts), then the CLI and end-to-end suites, and closes with the
# line CI reads: "N passed, N failed".
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export BUILD="${BUILD:-build}"
passed=0
failed=0
failed_names=()

run_one() {
    local name="$1"
    shift
    local log
    log="$(mktemp)"
    "$@" >"$log" 2>&1
    local rc=$?
    # cmocka prints "[  PASSED  ] N test(s)." and "[  FAILED  ] N test(s)...";
    # shell suites print "ok N" / "not ok N" lines (TAP).
    local p f
    p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$NF} END {print s+0}')
    f=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$(NF-1)} END {print s+0}')
    p=$((p + $(grep -cE '^ok [0-9]+' "$log")))
    f=$((f + $(grep -cE '^not ok [0-9]+' "$log")))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then f=1; echo "$name: ran no test"; fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$f" -ne 0 ]; then
        failed_names+=("$name")
        echo "---- $name (exit $rc) ----"
        tail -n 60 "$log"
    else
        echo "$name: $p passed"
    fi
    rm -f "$log"
}

for t in "$@"; do
    run_one "$(basename "$t")" "$t"
done
for s in "$here"/cli/*.sh; do
    [ -e "$s" ] || continue
    case "$(basename "$s")" in lib*) continue ;; esac  # sourced helpers, not suites
    run_one "cli/$(basename "$s")" bash "$s"
done

if [ "${#failed_names[@]}" -ne 0 ]; then
    echo "failed: ${failed_names[*]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
