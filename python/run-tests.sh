#!/usr/bin/env bash
# The Python client's tests (README "Two commands"; .ci/run calls it after `cargo test
# --workspace`): a venv in target/pyvenv, `pip install ./python` (maturin, from PyPI into pip's
# build environment; the extension builds in python/target), pytest, and the `felix` binary the
# tests start brokers from (target/debug/felix). Arguments go to pytest (`-k groups`, `-x`).
# MATURIN_PEP517_ARGS picks the extension's cargo profile: dev here (quick to build, enough
# for the tests); unset it to empty for release (`MATURIN_PEP517_ARGS= python/run-tests.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/target/pyvenv
start=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
  echo "== python3 -m venv $venv"
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import pytest' 2>/dev/null; then
  "$venv/bin/pip" install -q pytest
fi

echo "== pip install ./python"
MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS---profile dev}" \
  "$venv/bin/pip" install -q --force-reinstall --no-deps ./python

echo "== cargo build -p felix-broker --bin felix"
cargo build -q -p felix-broker --bin felix

echo "== pytest python/tests"
cd python/tests
FELIX_BIN="$root/target/debug/felix" "$venv/bin/python" -m pytest -q -ra "$@"
echo "== python/run-tests.sh took $(( $(date +%s) - start )) s"
