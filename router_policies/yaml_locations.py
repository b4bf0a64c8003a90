"""Line numbers for validation errors: where in the operator's file a field path points."""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from router_policies.policy_yaml import compose_policy_yaml


def line_of(text: str, path: Sequence[str | int]) -> int | None:
    """1-based line of the deepest node along `path` that exists in the YAML text."""
    try:
        node = compose_policy_yaml(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in path:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(key)), None)
            if node is None:
                # The key is missing: the error belongs to the mapping that lacks it.
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
    if node is not None:
        line = node.start_mark.line + 1
    return line
