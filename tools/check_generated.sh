#!/usr/bin/env bash
# Regenerates the stubs into a temporary directory and fails if they differ from the
# checked-in ones (generated code comes only from `make proto`).
set -euo pipefail
py=${1:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$(dirname "$0")/protoc.sh" "$py" "$tmp"
status=0
for f in "$tmp"/txmq/v1/*; do
  name=$(basename "$f")
  if ! cmp -s "$f" "sdk/txmq/v1/$name"; then
    echo "generated file differs from 'make proto' output: sdk/txmq/v1/$name" >&2
    status=1
  fi
done
for f in sdk/txmq/v1/*_pb2*.py*; do
  [ -e "$tmp/txmq/v1/$(basename "$f")" ] || { echo "stale generated file: $f" >&2; status=1; }
done
exit $status
