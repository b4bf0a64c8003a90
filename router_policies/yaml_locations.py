"""Validation errors as operators read them: at the line of the key each names in their file,
in words that say what to write, and at most MAX_PROBLEMS of them.

A file is parsed once (router_policies/policy_yaml.py) and every problem's line is looked up in
that one node tree: a reload that parsed the file again per problem held the event loop for
seconds on a file with a few hundred mistakes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails, InitErrorDetails

FieldPath = tuple[str | int, ...]
FieldProblem = tuple[FieldPath, str]
"""A problem with the field at a path (as pydantic's `loc`), before its line is known."""

MAX_PROBLEMS = 50
"""Problems listed for one file; the rest are counted. A file with more holds one mistake made
over and over (a key misspelt in every pool), which the first ones show; thousands of lines
would only flood the reload log, the admin API's answer and the terminal."""


class Locations:
    """Where each key of one parsed policy file is: the line of a field path, from the tree."""

    def __init__(self, root: yaml.Node | None) -> None:
        self._root = root
        self._keys: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]] = {}
        """Each mapping's keys, indexed the first time a path goes through it: a look-up in a
        mapping of thousands of pools is then one dict access, not a scan."""

    def line(self, path: Sequence[str | int]) -> int | None:
        """1-based line of the deepest key along ``path`` that the file has: a missing key's
        problem belongs to the key whose mapping lacks it."""
        node = self._root
        if node is None:
            return None
        line = node.start_mark.line + 1
        for key in path:
            if isinstance(node, yaml.MappingNode):
                pair = self._pairs(node).get(str(key))
                if pair is None:
                    break
                line, node = pair[0].start_mark.line + 1, pair[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
                if not 0 <= key < len(node.value):
                    break
                node = node.value[key]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def _pairs(self, node: yaml.MappingNode) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        pairs = self._keys.get(id(node))
        if pairs is None:
            # The last pair of a key wins, as in the mapping YAML builds: once built, a merge
            # key's (`<<`) pairs come first, and the mapping's own override them.
            pairs = {str(k.value): (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
            self._keys[id(node)] = pairs
        return pairs

    def describe(self, problems: Sequence[FieldProblem], total: int | None = None) -> list[str]:
        """ "line N: field: problem" for each, at most MAX_PROBLEMS, then how many more there
        are of ``total`` (default: all of ``problems``)."""
        lines = []
        for path, problem in problems[:MAX_PROBLEMS]:
            line = self.line(path)
            where = f"line {line}: " if line is not None else ""
            lines.append(f"{where}{'.'.join(map(str, path)) or '(top level)'}: {problem}")
        return capped(lines, len(problems) if total is None else total)


def capped(problems: list[str], total: int | None = None) -> list[str]:
    """The first MAX_PROBLEMS of ``problems`` (``total`` of them in all), then how many more."""
    more = (len(problems) if total is None else total) - MAX_PROBLEMS
    return [*problems[:MAX_PROBLEMS], f"... and {more} more problems"] if more > 0 else problems


def describe_errors(exc: ValidationError, locations: Locations, root: type[BaseModel]) -> list[str]:
    """The errors of validating ``root`` from a file, one line each (see Locations.describe)."""
    errors = exc.errors()
    # Worded for the first MAX_PROBLEMS alone: the rest are only counted.
    first = [(err["loc"], message(err, root)) for err in errors[:MAX_PROBLEMS]]
    return locations.describe(first, len(errors))


def message(err: ErrorDetails, root: type[BaseModel] | None = None) -> str:
    """What is wrong, without pydantic's "Value error, " (every validator's message had it);
    a value that should be a mapping says which (``root``: the model validated)."""
    ctx = err.get("ctx") or {}
    if err["type"] == "value_error" and "error" in ctx:
        return str(ctx["error"])
    if err["type"] == "model_type" and root is not None:
        return _not_a_mapping(err, _sections(root).get(str(ctx.get("class_name"))))
    if err["type"] == "dict_type" and root is not None:
        return _not_a_mapping(err, None)
    return err["msg"]


_SECTION_WORDS = {
    "Policy": ("`pools:` and the policy's other sections", ""),
    "PoolPolicy": ("a pool's settings", "pool"),
    "TierSettings": ("a tier's settings", "tier"),
    "TenantLimits": ("a tenant's limits", "tenant"),
}
"""For the sections a policy names by entry (pools, tiers, tenants): what their mapping holds,
and what a setting of theirs written beside its entry is missing from."""
_NAMED_ENTRIES = {
    "pools": "pool names, each with its settings",
    "tiers": "tier model names, each with its settings",
    "tenants": "tenant names, each with its limits",
}


def _not_a_mapping(err: ErrorDetails, section: type[BaseModel] | None) -> str:
    loc, got = err["loc"], _kind(err["input"])
    words = _SECTION_WORDS.get(section.__name__) if section is not None else None
    if section is None or words is None:
        # A mapping of named entries (dict_type), or a section without words of its own.
        held = _NAMED_ENTRIES.get(str(loc[-1])) if loc else None
        return (
            f"expected a mapping ({held}), got {got}"
            if held
            else (f"expected a mapping of settings, got {got}")
        )
    text = f"expected a mapping ({words[0]}), got {got}"
    if words[1] and loc and str(loc[-1]) in section.model_fields:
        # `replicas:` read as a pool's name: it is one of a pool's settings, out-dented.
        text += f": is it indented under its {words[1]}?"
    return text


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else f"a {type(value).__name__}"


@cache
def _sections(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model under ``root``, by class name (pydantic's model_type error names its class)."""
    found: dict[str, type[BaseModel]] = {}
    pending: list[Any] = [root]
    while pending:
        kind = pending.pop()
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            if kind.__name__ not in found:
                found[kind.__name__] = kind
                pending.extend(f.annotation for f in kind.model_fields.values())
        else:
            pending.extend(get_args(kind))
    return found


def errors_at(problems: Sequence[tuple[FieldPath, str, Any]]) -> ValidationError:
    """An error at each (field path, message, value): raised in a model's validator, pydantic
    prefixes each path with the model's own, so a rule over several fields names the key it is
    about, and its line, instead of "(top level)" and the file's first line."""
    # As a validator's ValueError reaches pydantic: its text is no template (braces stay), and
    # `message` words it as any other.
    errors: list[InitErrorDetails] = [
        {"type": "value_error", "loc": path, "input": value, "ctx": {"error": ValueError(text)}}
        for path, text, value in problems
    ]
    return ValidationError.from_exception_data("policy", errors)


def error_at(path: FieldPath, text: str, value: Any) -> ValidationError:
    return errors_at([(path, text, value)])
