# lib.sh - TAP helpers for the shell suites in tests/cli/ (sourced).
# Each check prints "ok N - name" or "not ok N - name" with the output that
# failed; tests/run.sh counts those lines.
set -u
BUILD="${BUILD:-build}"
SPARROW="$BUILD/sparrow"
SYNTH="$BUILD/tools/synth"
TAP_N=0
TMP="$(mktemp -d "${TMPDIR:-/tmp}/sparrow-cli-XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
# keep stored calibrations and caches of this machine out of the tests
export XDG_CACHE_HOME="$TMP/cache"

ok() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1"; }
not_ok() {
    TAP_N=$((TAP_N + 1))
    echo "not ok $TAP_N - $1"
    shift
    for f in "$@"; do [ -f "$f" ] && sed 's/^/#   /' "$f" | head -n 20; done
}

# run NAME EXPECTED_EXIT CMD...: runs CMD, keeps stdout in $TMP/out and
# stderr in $TMP/err, and checks the exit code (a signal is always a failure).
run() {
    local name="$1" want="$2"
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$name"; else not_ok "$name (exit $rc, wanted $want)" "$TMP/out" "$TMP/err"; fi
}

# expect NAME FILE TEXT: FILE contains TEXT (fixed string).
expect() {
    if grep -qF -- "$3" "$2"; then ok "$1"; else not_ok "$1 (no \"$3\")" "$2"; fi
}
