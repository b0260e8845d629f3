#!/usr/bin/env bash
# The compiled extension's own checks (native/), run by `make test` before the suite:
# clippy with every warning an error, then the crate's Rust unit tests (`cargo test`).
# Neither needs PostgreSQL or Kafka; a warm run takes seconds, a cold one (pyo3
# compiled for tests and for clippy) under a minute on 2 cores.
#
# Why `cargo test` links: pyo3 links an extension module without libpython (the
# interpreter that imports it provides the symbols), which a test executable cannot
# be. So the crate does not enable pyo3's `extension-module` feature; the module's
# build sets PYO3_BUILD_EXTENSION_MODULE instead (native/build.sh), and everything
# else, these checks included, links against the libpython of .venv's interpreter.
#
# Without a Rust toolchain (or clippy) this says what is missing and skips the checks;
# it fails only in CI (CI=true), as native/build.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=""
if ! command -v cargo >/dev/null 2>&1; then
  missing="cargo (install Rust: https://rustup.rs, or 'sudo apt-get install cargo')"
elif ! cargo clippy --version >/dev/null 2>&1; then
  missing="clippy ('rustup component add clippy', or 'sudo apt-get install rust-clippy')"
fi
if [ -n "$missing" ]; then
  echo "native-check: missing: $missing, to test and lint native/" >&2
  [ "${CI:-}" = true ] && exit 1
  echo "native-check: skipping cargo test and cargo clippy" >&2
  exit 0
fi

# The build directory native/build.sh uses, so a rebuild is incremental.
export CARGO_TARGET_DIR=$PWD/.local/cargo-target
# The interpreter pyo3 builds against, as for the module: .venv's.
export PYO3_PYTHON=$PWD/.venv/bin/python
# A test that runs Python code loads that interpreter's libpython, which need not be
# where the dynamic loader looks (pyenv, a venv of a custom build).
libdir=$("$PYO3_PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cd native
started=$SECONDS
cargo clippy --quiet --locked --all-targets -- -D warnings
cargo test --quiet --locked
echo "native-check: cargo clippy and cargo test passed in $((SECONDS - started))s"
