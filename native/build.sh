#!/usr/bin/env bash
# Build capture's compiled row encoder (native/, the `capture_native` extension) into
# .venv, only when it is missing or its sources changed since the last build. maturin
# (a dev dependency) drives cargo; crates come from crates.io, and the build directory
# is .local/cargo-target, so a rebuild after a change is incremental. A cold build
# (pyo3 and the crate, release mode) takes about a minute on 2 cores.
#
# Without a Rust toolchain this says what is missing and capture runs its Python path,
# which writes the same bytes, slower; it fails only in CI (CI=true), where the tests of
# the compiled path would otherwise fail later and less clearly.
set -euo pipefail
cd "$(dirname "$0")/.."

stamp=.venv/.native-built
sources=(native/Cargo.toml native/Cargo.lock native/pyproject.toml native/src)
if [ -f "$stamp" ] && .venv/bin/python -c 'import capture_native' 2>/dev/null \
    && [ -z "$(find "${sources[@]}" -newer "$stamp" 2>/dev/null)" ]; then
  exit 0
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "bootstrap: missing: cargo, to build capture's compiled row encoder (native/);" >&2
  echo "bootstrap: install Rust (https://rustup.rs, or 'sudo apt-get install cargo') and" >&2
  echo "bootstrap: run 'make native'" >&2
  [ "${CI:-}" = true ] && exit 1
  echo "bootstrap: continuing; capture encodes rows in Python (same bytes, slower)" >&2
  exit 0
fi

echo "bootstrap: building capture's compiled row encoder (native/, cargo --release)"
export CARGO_TARGET_DIR=$PWD/.local/cargo-target
# An extension module leaves libpython's symbols to the interpreter that imports it.
# maturin sets this too; said here because the crate no longer enables pyo3's
# `extension-module` feature, so that `cargo test` links (native/check.sh).
export PYO3_BUILD_EXTENSION_MODULE=1
# cargo's output (a line per crate downloaded and compiled) goes to a log; its tail is
# shown when the build fails.
mkdir -p .local/log
log=.local/log/build-native.log
started=$SECONDS
if ! VIRTUAL_ENV=$PWD/.venv .venv/bin/maturin develop --release --quiet -m native/Cargo.toml \
    >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "bootstrap: building capture's compiled core failed (full log: $log)" >&2
  exit 1
fi
touch "$stamp"
echo "bootstrap: compiled core built in $((SECONDS - started))s"
