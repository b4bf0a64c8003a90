#!/usr/bin/env bash
# Install the peer routers the comparison benchmark runs against (`llm-gateway bench compare`):
# vllm-router and sglang-router, Rust binaries shipped in PyPI wheels (no torch), into a
# virtualenv of their own so that their pins never touch the gateway's environment.
# Idempotent: a complete install is detected in about a second and kept.
#
#   bench/peers/install.sh                 # venv at .cache/peers-venv under the repo root
#   PEERS_VENV=/opt/peers bench/peers/install.sh
#
# Environment: PEERS_VENV (where the venv goes), PEERS_PYTHON (the interpreter that creates it;
# default python3). The versions are the ones the flags in bench/peers/__init__.py were checked against.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${PEERS_VENV:-$ROOT/.cache/peers-venv}"
PYTHON="${PEERS_PYTHON:-python3}"
PACKAGES=("vllm-router==0.1.17" "sglang-router==0.3.2")

say() { echo "[peers install] $*"; }
fail() { echo "[peers install] ERROR: $*" >&2; exit 1; }

# A usable install: both packages at the pinned versions, the vllm-router console script, and
# sglang-router's launcher module importable. Prints the reason when it is not usable.
check_install() {
    "$VENV/bin/python" - "${PACKAGES[@]}" <<'PY'
import importlib.metadata as md
import importlib.util
import sys

for pin in sys.argv[1:]:
    name, _, want = pin.partition("==")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(f"{name} is not installed")
    if have != want:
        sys.exit(f"{name} {have} is installed, not {want}")
if importlib.util.find_spec("sglang_router.launch_router") is None:
    sys.exit("sglang_router.launch_router is missing")
print(", ".join(sys.argv[1:]))
PY
    [[ -x "$VENV/bin/vllm-router" ]] || { echo "no vllm-router script in $VENV/bin"; return 1; }
}

case "$(uname -s)/$(uname -m)" in
    Linux/x86_64 | Linux/aarch64) ;;
    *) fail "the router wheels are built for Linux x86_64/aarch64 here, not $(uname -s)/$(uname -m)" ;;
esac

if [[ -x "$VENV/bin/python" ]] && reason=$(check_install 2>&1); then
    say "already installed in $VENV: $reason"
    exit 0
fi
if [[ -x "$VENV/bin/python" ]]; then
    say "venv $VENV exists but is not usable (${reason:-unknown}); repairing it"
fi

command -v "$PYTHON" >/dev/null || fail "no interpreter '$PYTHON' (set PEERS_PYTHON)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
    || fail "$PYTHON is $("$PYTHON" -V 2>&1); the router wheels need Python >= 3.9"
mkdir -p "$(dirname "$VENV")"
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating virtualenv $VENV with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV" || fail "could not create a virtualenv (is python3-venv installed?)"
fi
say "pip install ${PACKAGES[*]}"
"$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off "${PACKAGES[@]}" \
    || fail "pip could not install ${PACKAGES[*]} (no wheel for this platform, or no index)"

reason=$(check_install 2>&1) || fail "installed, but not usable: $reason"
say "ready: $reason"
say "vllm-router: $VENV/bin/vllm-router; sglang-router: $VENV/bin/python -m sglang_router.launch_router"
