#!/usr/bin/env bash
# The server end to end with the official openai npm client (Node's test
# runner, TAP output counted by tests/run.sh).
cd "$(dirname "$0")/../.." || exit 1
exec node --test --test-reporter=tap --test-concurrency=1 tests/e2e/
