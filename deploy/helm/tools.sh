#!/usr/bin/env bash
# Build the two programs the Helm chart tests run (tests/unit/deploy/test_helm_chart.py)
# and link them into .local/bin:
#   helm         helm.sh/helm/v3/cmd/helm                    (lint, template)
#   kubeconform  github.com/yannh/kubeconform/cmd/kubeconform (schema validation)
# Both are built with `go install` from the Go module proxy, which serves every version
# with checksums from the Go checksum database; no other download site is needed. A
# cold build takes minutes, almost all of it helm (docs/deploy.md), so each is built once
# per machine into the tools cache, named by version: $CDC_TOOLS_CACHE, else
# ${XDG_CACHE_HOME:-~/.cache}/pgdelta-cdc/bin (deploy/local/minio.py keeps MinIO there
# too). A fresh clone on the same machine, as every CI run is, links what is there.
# `make test` runs this; `make demo` does not (the demo never uses either). The compiler's
# output goes to a log file; on failure its tail is shown. Without Go this says what is
# missing; it fails only in CI (CI=true), where the chart tests would otherwise fail
# later and less clearly.
set -euo pipefail
cd "$(dirname "$0")/../.."

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
BIN=$PWD/.local/bin
CACHE=${CDC_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgdelta-cdc/bin}

# name -> module path@version, and the ldflags that stamp the version into it.
declare -A MODULE=(
  [helm]="helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  [kubeconform]="github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
)
declare -A LDFLAGS=(
  [helm]="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  [kubeconform]="-s -w -X main.version=$KUBECONFORM_VERSION"
)

# The cache names each build by its version; .local/bin links the pinned one.
mkdir -p "$BIN"
missing=()
for name in helm kubeconform; do
  cached="$CACHE/$name-${MODULE[$name]##*@}"
  if [ -x "$cached" ]; then
    ln -sfn "$cached" "$BIN/$name"
  else
    missing+=("$name")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v go >/dev/null 2>&1; then
  echo "bootstrap: missing: ${missing[*]} (for the Helm chart tests); they are built with Go," >&2
  echo "bootstrap: which is not installed: install Go (https://go.dev/dl/; helm $HELM_VERSION" >&2
  echo "bootstrap: needs 1.26, and any Go from 1.21 on fetches that toolchain by itself," >&2
  echo "bootstrap: so 'sudo apt-get install golang-go' also works) and run 'make tools'" >&2
  [ "${CI:-}" = true ] && exit 1
  echo "bootstrap: continuing; the Helm chart tests will be skipped" >&2
  exit 0
fi

mkdir -p "$CACHE" .local/log
for name in "${missing[@]}"; do
  version=${MODULE[$name]##*@}
  log=.local/log/build-$name.log
  echo "bootstrap: building $name $version with go install, once per machine (minutes; log: $log)"
  started=$SECONDS
  building=$(mktemp -d "$CACHE/.build-$name.XXXXXX")
  if ! GOBIN=$building CGO_ENABLED=0 GOFLAGS=-trimpath \
      go install -ldflags="${LDFLAGS[$name]}" "${MODULE[$name]}" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    rm -rf "$building"
    echo "bootstrap: building $name failed (full log: $log)" >&2
    exit 1
  fi
  # Moved into place whole, so a build cut short is never taken for a finished one.
  mv -f "$building/$name" "$CACHE/$name-$version"
  rm -rf "$building"
  ln -sfn "$CACHE/$name-$version" "$BIN/$name"
  echo "bootstrap: $name built in $((SECONDS - started))s"
done
