#!/usr/bin/env bash
# The layering of ../shared/DESIGN.md §2, checked on every #include of
# src/: server -> runtime -> model -> backend -> quant -> core, with format
# (model files) under model, tokenizer and template over core alone, and
# nothing outside src/backend/cuda/ including a CUDA header. A folder may
# include its own headers and those of the folders listed for it.
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

declare -A allowed=(
    [core]=""
    [quant]="core"
    [format]="core quant"
    [tokenizer]="core"
    [template]="core"
    [backend]="core quant"
    [model]="core quant format backend"
    [runtime]="core quant format backend model tokenizer template"
    [server]="core runtime tokenizer template"
    [api]="core quant format backend model runtime tokenizer template"
    [cli]="core quant format backend model runtime tokenizer template server api"
)

for dir in src/*/; do
    layer="$(basename "$dir")"
    if [ -z "${allowed[$layer]+set}" ]; then
        not_ok "src/$layer has a place in the layering (add it to tests/cli/layering.sh)"
        continue
    fi
    bad=""
    while IFS=: read -r file _ inc; do
        to="${inc#*\"}"
        to="${to%%/*}"
        [ "$to" = "$layer" ] && continue
        case " ${allowed[$layer]} " in *" $to "*) continue ;; esac
        bad+="$file includes $to/"$'\n'
    done < <(grep -rnE '^#include "[a-z_]+/' "$dir")
    if [ -z "$bad" ]; then
        ok "src/$layer includes only ${allowed[$layer]:-its own headers}"
    else
        printf '%s' "$bad" >"$TMP/bad"
        not_ok "src/$layer includes a layer above it" "$TMP/bad"
    fi
done

# CUDA headers stay inside the CUDA backend
grep -rlE '#include <(cuda|cuda_runtime|cuda_runtime_api|cublas_v2)\.h>' src --include='*.c' --include='*.h' \
    | grep -v '^src/backend/cuda/' >"$TMP/cuda" || true
if [ -s "$TMP/cuda" ]; then not_ok "no CUDA header outside src/backend/cuda/" "$TMP/cuda"; else ok "no CUDA header outside src/backend/cuda/"; fi
# settings come from one module: no library code reads the environment
grep -rnE '\bgetenv\b|\benviron\b' src --include='*.c' --include='*.h' | grep -v '^src/core/settings\.' \
    | grep -vE '^[^:]+:[0-9]+:\s*(/?\*|//)' >"$TMP/env" || true
if [ -s "$TMP/env" ]; then not_ok "only src/core/settings.c reads the environment" "$TMP/env"; else ok "only src/core/settings.c reads the environment"; fi
