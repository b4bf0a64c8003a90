"""bench profile's reading of py-spy's samples: which part of the request path a sample counts
for, the shares and microseconds per part, and the flame graph."""

from __future__ import annotations

from pathlib import Path

from bench.flame import IN_LOOP, LOOP_RUN, stack_tree
from bench.profile import LOOP, Profile, parse_raw, part_of, summary

ROOT = ("_run_module_as_main (<frozen runpy>:198)", f"{LOOP_RUN}:118)")
RAW = "\n".join(
    [
        ";".join((*ROOT, "FrontConnection._serve (gateway/http/front.py:280)",
                  "Forwarder.forward (gateway/relay/proxy.py:83)",
                  "_Connection.request (gateway/relay/upstream.py:192)")) + " 30",
        ";".join((*ROOT, "FrontConnection._serve (gateway/http/front.py:280)",
                  "parse_request (gateway/http/request_body.py:125)")) + " 10",
        ";".join((*ROOT, "FrontConnection.data_received (gateway/http/front.py:183)")) + " 20",
        ";".join(ROOT) + " 40",
        "not a stack line",
    ]
)  # fmt: skip


def test_a_sample_counts_for_the_part_of_its_innermost_frame_in_one() -> None:
    stacks = parse_raw(RAW)
    assert len(stacks) == 4 and sum(stacks.values()) == 100
    parts = [part_of(stack) for stack in stacks]
    assert parts == ["replica side", "parsing and routing", "client side: front", LOOP]
    # The loop's own run (asyncio/runners.py) is below every sample: not "asyncio".
    assert part_of(ROOT) == LOOP


def test_the_summary_turns_shares_into_microseconds_per_request() -> None:
    profile = Profile("non-streaming", parse_raw(RAW), cpu_us_per_request=200.0)
    shares = profile.parts()
    assert shares["replica side"] == 0.3 and shares[LOOP] == 0.4
    table = summary([profile])
    assert "| replica side | 30% (60 us) |" in table
    assert "| gateway CPU per request | 200 us |" in table


def test_the_flame_graph_is_drawn(tmp_path: Path) -> None:
    from bench.flame import draw
    from bench.profile import PARTS

    out = tmp_path / "flame.png"
    parts = [name for name, _ in PARTS] + [LOOP]
    draw([("non-streaming", parse_raw(RAW))], out, parts, part_of)
    assert out.read_bytes().startswith(b"\x89PNG")
    # The loop's own samples get a bar of their own; the frames below the loop's run none.
    tree = stack_tree(parse_raw(RAW))
    assert tree.children[IN_LOOP].samples == 40
    assert not any(frame.startswith(LOOP_RUN) for frame in tree.children)
