"""Reading a policy file's YAML: the one loader, which refuses keys YAML would silently change.

YAML readers keep the last of two equal keys in a mapping, so a pool or a tenant pasted twice,
or a setting written twice, would replace the first without a word. And YAML 1.1 (PyYAML's)
reads a plain ``on``, ``off``, ``yes`` or ``no`` as a boolean and ``70`` as a number, so a pool
named ``on`` would become ``True`` and fail validation as a "valid string" it never looked like.
Every key in a policy file is a name, so both are refused here, one line per key, with the line
it is on and what to write instead. The document is then validated against the schema, and each
mistake named with the line of its key from the same parse (router_policies/yaml_locations.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from router_policies.yaml_locations import Locations, capped, describe_errors

_MERGE = "tag:yaml.org,2002:merge"
_NOT_NAMES = {
    "tag:yaml.org,2002:bool": "a boolean (YAML 1.1)",
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:null": "null",
}
"""The tags a plain (unquoted) key resolves to that no policy key can take, and what YAML read."""


class KeyProblems(yaml.YAMLError):
    """Keys a policy cannot take as written; ``problems`` says each on a line of its own."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class PolicyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping, and a key that is not a name.

    The keys are checked on the composed document, before anything is built from it: a mapping
    built by PyYAML has already lost the first of two equal keys, and the nodes still know the
    path and the line of each."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            problems = list(_key_problems(node, (), set()))
            if problems:
                raise KeyProblems(problems)
        return node


def read_policy_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """The document in ``text`` and its node tree (the line of every key), from one parse: a
    file is parsed once however many mistakes are looked up in it. Raises KeyProblems, or
    another yaml.YAMLError."""
    loader = PolicyLoader(text)
    try:
        node = loader.get_single_node()
        # Built from the tree, which building changes only by expanding merge keys (`<<`).
        return (None if node is None else loader.construct_document(node)), node
    finally:
        loader.dispose()


def _key_problems(node: yaml.Node, path: tuple[str, ...], visited: set[int]) -> Iterator[str]:
    # An alias is the node it names, once more: each node is checked once, and a recursive
    # anchor (which SafeLoader accepts) does not recurse forever.
    if id(node) in visited:
        return
    visited.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _key_problems(item, (*path, str(i)), visited)
        return
    if not isinstance(node, yaml.MappingNode):
        return
    first_line: dict[tuple[str, str], int] = {}
    for key, value in node.value:
        if key.tag == _MERGE:
            # `<<: *defaults` and then a key of the mapping's own is an override, which is
            # what merge keys are for: only keys written in this mapping are compared.
            yield from _key_problems(value, path, visited)
            continue
        line = key.start_mark.line + 1
        name = str(key.value) if isinstance(key, yaml.ScalarNode) else "[key]"
        name = name or "~"  # an empty key is YAML's null
        field = ".".join((*path, name))
        if key.tag in _NOT_NAMES:
            yield (
                f"line {line}: {field}: YAML reads the unquoted key {name} as "
                f"{_NOT_NAMES[key.tag]}, not a name: quote it ('{name}')"
            )
        elif isinstance(key, yaml.ScalarNode):
            # By tag and text: `a` and 'a' are one key, as in the mapping YAML would build.
            identity = (key.tag, name)
            if identity in first_line:
                yield (
                    f"line {line}: {field}: given twice in one mapping (first on line "
                    f"{first_line[identity]}); YAML would keep only the last: remove one"
                )
            else:
                first_line[identity] = line
        yield from _key_problems(value, (*path, name), visited)


class InvalidPolicy(ValueError):
    """A policy file that does not validate; `problems` name the line, the field and the issue."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML found wrong, and where: never its own message, which quotes the offending
    line, and that line is as likely as any to hold a Redis password or a pasted API key (it
    reaches check-policy's output, the serve log and the /admin/reload answer)."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses: its code only
        return f"character {exc.position + 1}: not valid YAML: {exc.reason}"
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"not valid YAML ({type(exc).__name__})"
    where = ""
    if exc.problem_mark is not None:
        where = f"line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}: "
    what = exc.problem or "a syntax error"
    if exc.context is not None and exc.context_mark is not None:
        mark = exc.context_mark
        what = f"{what}, {exc.context} (line {mark.line + 1}, column {mark.column + 1})"
    elif exc.context is not None:
        what = f"{what}, {exc.context}"
    # The problem and context quote tokens too (an undefined alias, an unknown tag): a
    # password that starts with "*" or "!" would be printed whole.
    return f"{where}not valid YAML: {_QUOTED.sub(_token_or_hidden, what)}"


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_SYNTAX = re.compile(r"'([^\w\s]|<[a-z ]+>)'")
"""What PyYAML quotes that is syntax, not the file's text: one punctuation mark, a token name."""


def _token_or_hidden(quoted: re.Match[str]) -> str:
    return quoted[0] if _SYNTAX.fullmatch(quoted[0]) else "'...'"


EMPTY_FILE = "the file is empty (no settings, at most comments): a policy needs a `pools:` mapping"

Model = TypeVar("Model", bound=BaseModel)


def read_validated(
    text: str, model: type[Model], context: dict[str, Any] | None = None
) -> tuple[Model, Locations]:
    """``model`` validated from the YAML in ``text`` (with pydantic's validation ``context``),
    and where each of its keys is, from one parse; raises InvalidPolicy, naming the line and
    the field of each mistake."""
    try:
        data, root = read_policy_yaml(text)
    except KeyProblems as exc:
        raise InvalidPolicy(capped(exc.problems)) from None
    except yaml.YAMLError as exc:
        raise InvalidPolicy([_yaml_problem(exc)]) from None
    if data is None:
        raise InvalidPolicy([EMPTY_FILE])
    locations = Locations(root)
    try:
        return model.model_validate(data, context=context), locations
    except ValidationError as exc:
        raise InvalidPolicy(describe_errors(exc, locations, model)) from None
