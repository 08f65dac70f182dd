#!/usr/bin/env bash
# Generates the Python code of protos/txmq/v1 into OUT (`make proto` into sdk/, and
# tools/check_generated.sh into a temporary directory): grpc_tools' modules, mypy-protobuf's
# typed stubs. Usage: tools/protoc.sh PYTHON OUT
set -euo pipefail
py=$1
out=$2
bin=$(dirname "$py")
"$py" -m grpc_tools.protoc -I protos \
  --plugin=protoc-gen-mypy="$bin/protoc-gen-mypy" --plugin=protoc-gen-mypy_grpc="$bin/protoc-gen-mypy_grpc" \
  --python_out="$out" --grpc_python_out="$out" --mypy_out=quiet:"$out" --mypy_grpc_out=quiet:"$out" \
  protos/txmq/v1/*.proto
