#!/usr/bin/env bash
# Build the two programs the Helm chart tests run (tests/unit/deploy/test_helm_chart.py)
# into .local/bin, each only when missing or at another version:
#   helm         helm.sh/helm/v3/cmd/helm                    (lint, template)
#   kubeconform  github.com/yannh/kubeconform/cmd/kubeconform (schema validation)
# Both are built with `go install` from the Go module proxy, which serves every version
# with checksums from the Go checksum database; no other download site is needed. A
# cold build (empty Go caches, as in CI) takes minutes, almost all of it helm: see
# docs/deploy.md. Without Go this says what is missing; it fails only in CI (CI=true),
# where the chart tests would otherwise fail later and less clearly.
set -euo pipefail
cd "$(dirname "$0")/../.."

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
BIN=$PWD/.local/bin

# name -> module path@version, and the ldflags that stamp the version into it.
declare -A MODULE=(
  [helm]="helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  [kubeconform]="github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
)
declare -A LDFLAGS=(
  [helm]="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  [kubeconform]="-s -w -X main.version=$KUBECONFORM_VERSION"
)

# A stamp next to each binary records the version it was built at.
missing=()
for name in helm kubeconform; do
  version=${MODULE[$name]##*@}
  if [ ! -x "$BIN/$name" ] || [ "$(cat "$BIN/.$name.version" 2>/dev/null)" != "$version" ]; then
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

mkdir -p "$BIN"
for name in "${missing[@]}"; do
  echo "bootstrap: building $name ${MODULE[$name]##*@} into .local/bin (go install, takes minutes)"
  started=$SECONDS
  GOBIN=$BIN CGO_ENABLED=0 GOFLAGS=-trimpath go install -ldflags="${LDFLAGS[$name]}" "${MODULE[$name]}"
  echo "${MODULE[$name]##*@}" >"$BIN/.$name.version"
  echo "bootstrap: $name built in $((SECONDS - started))s"
done
