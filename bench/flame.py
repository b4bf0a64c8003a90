"""Flame graphs of sampled stacks, drawn with matplotlib: ``bench profile``'s picture.

Each bar is a frame, as wide as the share of the samples it was on the stack for, above the
frame that called it; its colour is the part of the request path it belongs to
(the caller's grouping). The frames every sample shares below the event loop's run are
left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

LOOP_RUN = "Runner.run (asyncio/runners.py"
"""The last frame every sample shares: the event loop's run, below the callbacks."""
IN_LOOP = "(the event loop itself: polling, socket reads, callbacks' C code)"
"""What a sample shows when no Python frame runs above the loop's."""
MIN_WIDTH = 0.002
"""Frames on fewer of the samples than this are not drawn."""
LABEL_WIDTH = 0.035
COLOURS = (
    "#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f", "#8cd17d", "#b6992d", "#d4d4d4",
)  # fmt: skip


class StackNode:
    """A frame: the samples it was on the stack for, and its callees by name."""

    __slots__ = ("children", "samples")

    def __init__(self) -> None:
        self.samples = 0
        self.children: dict[str, StackNode] = {}


def above_loop(stack: Iterable[str]) -> list[str]:
    """A sample's frames above the event loop's run (all of them if it has none)."""
    frames = list(stack)
    for i, frame in enumerate(frames):
        if frame.startswith(LOOP_RUN):
            return frames[i + 1 :]
    return frames


def stack_tree(stacks: Mapping[tuple[str, ...], int]) -> StackNode:
    """The samples as a tree of frames, from the first frame above the event loop's run."""
    root = StackNode()
    for stack, samples in stacks.items():
        frames = above_loop(stack) or [IN_LOOP]
        root.samples += samples
        node = root
        for frame in frames:
            node = node.children.setdefault(frame, StackNode())
            node.samples += samples
    return root


def _place(
    node: StackNode, total: int, x: float, depth: int, bar: Callable[[str, float, float, int], None]
) -> int:
    """Draws ``node``'s callees from ``x`` at ``depth``, and theirs above; the deepest level
    drawn."""
    deepest = depth - 1
    for frame, child in sorted(node.children.items()):
        width = child.samples / total
        if width >= MIN_WIDTH:
            bar(frame, x, width, depth)
            deepest = max(deepest, depth, _place(child, total, x, depth + 1, bar))
        x += width
    return deepest


def draw(
    profiles: Sequence[tuple[str, Mapping[tuple[str, ...], int]]],
    out: Path,
    parts: Sequence[str],
    part_of: Callable[[tuple[str, ...]], str],
) -> None:
    """One flame graph per (title, stacks); each frame coloured by ``part_of`` (one of
    ``parts``, at most len(COLOURS))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.axes import Axes
    from matplotlib.patches import Patch

    colour = dict(zip(parts, COLOURS, strict=False))
    fig, axes = plt.subplots(len(profiles), 1, figsize=(18, 6.5 * len(profiles)), squeeze=False)
    for ax, (title, stacks) in zip(axes[:, 0], profiles, strict=True):
        root = stack_tree(stacks)
        total = root.samples or 1

        def bar(frame: str, x: float, width: float, depth: int, ax: Axes = ax) -> None:
            ax.barh(depth, width, left=x, height=0.9, align="edge", linewidth=0.3,
                    color=colour[part_of((frame,))], edgecolor="white")  # fmt: skip
            if width >= LABEL_WIDTH:
                label = frame.split(" (")[0][: int(width * 180)]
                ax.text(x + 0.002, depth + 0.45, label, va="center", fontsize=7)

        deepest = _place(root, total, 0.0, 0, bar)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, deepest + 1)
        ax.set_yticks([])
        ax.set_xlabel("share of the gateway's samples")
        ax.set_title(f"{title}: {total} samples, callers below their callees")
    handles = [Patch(color=colour[n], label=n) for n in parts]
    fig.legend(handles=handles, loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
