"""The Dockerfile, checked against the project with no Docker engine: the image installs every
product package (the bench tooling stays out) with the base dependencies that serve `epp` and
trace, runs as a non-root user, listens on all interfaces, and its entrypoint and command serve
the policy that GATEWAY_POLICY names.
"""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from tests.deploy import ROOT

pytestmark = pytest.mark.timeout(600)  # as every deployment test (tests/deploy.py)


# --- Dockerfile (no engine here: the file is checked against the project instead) ---------------


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_installs_every_package_and_runs_as_a_user() -> None:
    instructions = dockerfile()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    copied = {args.split()[0] for op, args in instructions if op == "COPY"}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    # The image holds the product only: the tooling (bench) stays out of it.
    packages = {pattern.rstrip("*") for pattern in include} - {"bench"}
    assert packages <= copied, f"pip install . needs {packages - copied}"
    assert "bench" not in copied
    assert {"pyproject.toml", "README.md"} <= set(
        next(a for o, a in instructions if o == "COPY" and "pyproject" in a).split()[:-1]
    )
    # The base install serves `llm-gateway epp` and can trace.
    assert ("RUN", "pip install . && rm -rf /src") in instructions
    base = {re.split(r"[<>=!~ ]", d)[0] for d in pyproject["project"]["dependencies"]}
    assert {"grpcio", "xds-protos", "opentelemetry-sdk"} <= base
    users = [args for op, args in instructions if op == "USER"]
    assert users and not users[-1].startswith(("root", "0"))
    env = " ".join(args for op, args in instructions if op == "ENV")
    assert "GATEWAY_HOST=0.0.0.0" in env
    entrypoint = json.loads(next(a for o, a in instructions if o == "ENTRYPOINT"))
    cmd = json.loads(next(a for o, a in instructions if o == "CMD"))
    assert entrypoint == ["llm-gateway"]
    assert cmd[:2] == ["serve", "--policy"]
    assert f"GATEWAY_POLICY={cmd[2]}" in env
