"""What the production image installs works on its own (docker build cannot run here).

The wheel is built from exactly the paths the Dockerfile COPYs, installed into a fresh
virtualenv with its dependencies from the package index, and its commands run from there.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "router_policies" / "examples").glob("*.yaml"))

pytestmark = pytest.mark.timeout(300)


def dockerfile_copies(dockerfile: Path) -> list[str]:
    """The build-context paths of the Dockerfile's COPY instructions, in order."""
    sources = []
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        if not line.upper().startswith("COPY "):
            continue
        words = shlex.split(line, comments=True)
        args = [w for w in words[1:] if not w.startswith("--")]
        sources.extend(args[:-1])
    return sources


def test_the_image_copies_the_product_and_not_the_tooling() -> None:
    copied = {s.rstrip("/") for s in dockerfile_copies(ROOT / "Dockerfile")}
    assert copied == {"pyproject.toml", "README.md", "gateway", "router_policies", "replica"}


@dataclass(frozen=True)
class Installed:
    bin: Path
    cwd: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        # A clean environment and an empty working directory: nothing of the checkout leaks in.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        return subprocess.run(
            [str(self.bin / "llm-gateway"), *args],
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def _make_venv(path: Path) -> None:
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(path)
    except (OSError, subprocess.CalledProcessError) as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"cannot create a virtualenv here ({exc}): the image's install is untested")


def _pip(python: Path, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def image_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("image")
    context = base / "src"
    context.mkdir()
    for source in dockerfile_copies(ROOT / "Dockerfile"):
        origin = ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, context / source)
    env_dir = base / "venv"
    _make_venv(env_dir)
    python = env_dir / "bin" / "python"
    wheels = base / "wheels"
    _pip(python, "wheel", "--no-deps", "-w", str(wheels), str(context))
    [wheel] = wheels.glob("llm_gateway-*.whl")
    _pip(python, "install", str(wheel))
    empty = base / "cwd"
    empty.mkdir()
    yield Installed(env_dir / "bin", empty)


def test_serve_help_runs_from_the_installed_wheel(image_install: Installed) -> None:
    done = image_install.run("serve", "--help")
    assert done.returncode == 0, done.stderr
    assert "--policy" in done.stdout


def test_the_simulated_replica_runs_from_the_same_image(image_install: Installed) -> None:
    done = image_install.run("sim-replica", "--help")
    assert done.returncode == 0, done.stderr
    assert "--num-blocks" in done.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_policy_checks_with_the_installed_wheel(
    image_install: Installed, example: Path
) -> None:
    done = image_install.run("check-policy", str(example))
    assert done.returncode == 0, done.stderr
    assert "pools:" in done.stdout


def test_there_are_example_policies_to_check() -> None:
    assert len(EXAMPLES) >= 2


def test_the_demo_is_absent_from_the_image_and_says_so_in_one_line(
    image_install: Installed,
) -> None:
    done = image_install.run("demo")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert "llm-gateway demo" in line
    assert "bench" in line


def test_the_installed_wheel_holds_only_the_product(image_install: Installed) -> None:
    site = next((image_install.bin.parent / "lib").glob("python3*/site-packages"))
    assert (site / "gateway").is_dir()
    assert not (site / "bench").exists()
    assert not (site / "numpy").exists()
