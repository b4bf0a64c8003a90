"""Builds the tier classifier's public held-out sets, bench/data/tier_heldout/*.jsonl: kinds
of request the training sets lack, kept for evaluation only (no model is fitted to them).

    python -m bench.tier_eval.build_heldout RAW_DIR [--out bench/data/tier_heldout]

- Reasoning and planning, in words (hard): FOLIO's logic problems, PlanBench's plan-generation
  prompts, TravelPlanner's trip requests, the System Design Primer's design questions.
- Conversations (multi-turn), labelled by the conversation's task: MathDial's maths tutoring
  (hard); the Schema-Guided Dialogue's and Taskmaster-4's bookings and orders, Topical-Chat's
  chit-chat (easy). Each is cut after a seeded user turn from the second on, so the latest
  message is often a follow-up ("yes", "three beds") that says nothing of the task.

RAW_DIR holds the upstream files under the names in ``FILES``; bench/data/README.md gives each
source's repository, commit and licence. Same inputs, same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from bench.tier_eval.build_data import MAX_CHARS, SEED, read_jsonl

DEFAULT_OUT = Path(__file__).parent.parent / "data" / "tier_heldout"
PER_SOURCE = 300
"""Items kept per source (seeded sample): enough for a per-source ROC AUC, small to ship."""

# Upstream files, by the name expected in RAW_DIR:
#   folio-train.jsonl, folio-validation.jsonl   Yale-LILY/FOLIO data/v0.0/ (CC-BY-SA-4.0)
#   planbench/<domain>/task_1_*.json   karthikv792/LLMs-Planning llm_planning_analysis/results/
#                                      <domain>/gpt-4_chat/ (MIT; the prompts, not the answers)
#   std_travelplanner.jsonl            OSU-NLP-Group/TravelPlanner finetuning_data/ (MIT)
#   sysdesign/README.md, sysdesign/solutions/system_design/*/README.md
#                                      donnemartin/system-design-primer (CC-BY-4.0)
#   mathdial_test.jsonl                eth-nlped/mathdial data/test.jsonl (CC-BY-SA-4.0)
#   sgd/dialogues_*.json               google-research-datasets/dstc8-schema-guided-dialogue
#                                      train/ (CC-BY-SA-4.0)
#   taskmaster/data_*.json             google-research-datasets/Taskmaster TM-4-2024/data/
#                                      (CC-BY-4.0)
#   topicalchat_valid_freq.json, topicalchat_valid_rare.json
#                                      alexa/Topical-Chat conversations/valid_*.json
#                                      (CDLA-Sharing-1.0)

Message = dict[str, str]
_FOLIO_ASKS = (
    "Based only on these premises, is the following conclusion true, false or uncertain?",
    "Given the statements above, does it follow that the conclusion below holds?",
    "Assume all of the above. Is this conclusion true, false, or impossible to tell?",
    "From these facts alone, decide whether the conclusion is true, false or unknown.",
)
"""FOLIO has premises and a conclusion, no question: one of these is asked, seeded (one fixed
wording would be a tell of the set rather than of the task)."""


def _user(text: str) -> list[Message]:
    return [{"role": "user", "content": text}]


def _write(
    out: Path, source: str, label: str, category: str, conversations: Iterable[list[Message]]
) -> int:
    seen: set[str] = set()
    kept = []
    for messages in conversations:
        key = json.dumps(messages)
        if key in seen or sum(len(m["content"]) for m in messages) > MAX_CHARS:
            continue
        seen.add(key)
        kept.append(messages)
    rng = random.Random(SEED)
    chosen = rng.sample(kept, min(PER_SOURCE, len(kept)))
    with (out / f"{source}.jsonl").open("w", encoding="utf-8") as f:
        for i, messages in enumerate(chosen):
            body = {"model": "auto", "messages": messages}
            record = {"id": f"{source}-{i:05d}", "label": label, "category": category}
            f.write(json.dumps({**record, "source": source, "body": body}, ensure_ascii=False))
            f.write("\n")
    return len(chosen)


def cut(turns: Iterable[tuple[str, str]], rng: random.Random) -> list[Message] | None:
    """A dialogue's turns (role, text), consecutive ones of a speaker joined, cut after a
    seeded user turn from the second on; None with fewer than two user turns."""
    merged: list[Message] = []
    for role, text in turns:
        text = (text or "").strip()
        if not text:
            continue
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"] += "\n" + text
        else:
            merged.append({"role": role, "content": text})
    users = [i for i, m in enumerate(merged) if m["role"] == "user"]
    if len(users) < 2:
        return None
    return merged[: rng.choice(users[1:]) + 1]


def folio(raw: Path) -> Iterator[list[Message]]:
    rng = random.Random(SEED)
    for name in ("folio-train.jsonl", "folio-validation.jsonl"):
        for row in read_jsonl(raw / name):
            # Premises as bullets: numbering them would put digits in every prompt.
            premises = "\n".join(f"- {p.strip()}" for p in row["premises"])
            ask = rng.choice(_FOLIO_ASKS)
            yield _user(f"{premises}\n\n{ask}\nConclusion: {row['conclusion'].strip()}")


def planbench(raw: Path) -> Iterator[list[Message]]:
    for path in sorted((raw / "planbench").glob("*/task_1_*.json")):
        for instance in json.loads(path.read_text(encoding="utf-8")).get("instances", []):
            if instance.get("query", "").strip():
                yield _user(instance["query"].strip())


def travelplanner(raw: Path) -> Iterator[list[Message]]:
    for row in read_jsonl(raw / "std_travelplanner.jsonl"):
        asked = next(m["content"] for m in row["messages"] if m["role"] == "user")
        yield _user(asked.rsplit("Query:", 1)[1].strip())


def sysdesign(raw: Path) -> Iterator[list[Message]]:
    readme = (raw / "sysdesign" / "README.md").read_text(encoding="utf-8")
    row = re.compile(r"^\| (Design [^|]+?|Return the top k [^|]+?) \| \[[^\]]+\]\(([^)]*)\)", re.M)
    for question, link in row.findall(readme):
        yield _user(question.strip() + ".")
        solution = raw / "sysdesign" / link
        if link.startswith("solutions/system_design/") and solution.is_file():
            # The worked solution's scope: the version of the question a user pastes in.
            text = solution.read_text(encoding="utf-8")
            start = text.find("### Use cases")
            end = min(i for i in (text.find("#### Calculate usage"), len(text)) if i >= 0)
            if 0 < start < end:
                scope = text[start:end].replace("**", "").strip()
                ask = "Propose a high-level design, its core components and how it scales."
                yield _user(f"{question.strip()}.\n\n{scope}\n\n{ask}")


def mathdial(raw: Path) -> Iterator[list[Message]]:
    rng = random.Random(SEED)
    said = re.compile(r"^(Teacher|Student)\s*:\s*(?:\([a-z_ ]*\))?\s*(.*)$", re.S)
    for row in read_jsonl(raw / "mathdial_test.jsonl"):
        # The student opens with the problem and their (wrong) solution, as the set records.
        turns = [("user", f"{row['question'].strip()}\n\n{row['student_incorrect_solution']}")]
        for part in row["conversation"].split("|EOM|"):
            found = said.match(part.strip())
            if found:
                turns.append(("assistant" if found[1] == "Teacher" else "user", found[2]))
        if (messages := cut(turns, rng)) is not None:
            yield messages


def _dialogues(
    paths: Iterable[Path], turns_of: Callable[[Any], Iterable[tuple[str, str]]], listed: bool
) -> Iterator[list[Message]]:
    rng = random.Random(SEED)
    for path in paths:
        loaded = json.loads(path.read_text(encoding="utf-8"))
        for dialogue in loaded if listed else (loaded[k] for k in sorted(loaded)):
            if (messages := cut(turns_of(dialogue), rng)) is not None:
                yield messages


def sgd(raw: Path) -> Iterator[list[Message]]:
    def turns(d: Any) -> Iterator[tuple[str, str]]:
        for t in d["turns"]:
            yield ("user" if t["speaker"] == "USER" else "assistant", t["utterance"])

    return _dialogues(sorted((raw / "sgd").glob("dialogues_*.json")), turns, listed=True)


def taskmaster(raw: Path) -> Iterator[list[Message]]:
    def turns(d: Any) -> Iterator[tuple[str, str]]:
        for u in d["utterances"]:
            yield ("user" if u["speaker"] == "user" else "assistant", u["text"])

    return _dialogues(sorted((raw / "taskmaster").glob("*.json")), turns, listed=True)


def topicalchat(raw: Path) -> Iterator[list[Message]]:
    def turns(d: Any) -> Iterator[tuple[str, str]]:
        for t in d["content"]:
            yield ("user" if t["agent"] == "agent_1" else "assistant", t["message"])

    names = ("topicalchat_valid_freq.json", "topicalchat_valid_rare.json")
    return _dialogues([raw / n for n in names], turns, listed=False)


SOURCES: dict[str, tuple[str, str, Callable[[Path], Iterable[list[Message]]]]] = {
    "folio": ("hard", "logic_reasoning", folio),
    "planbench": ("hard", "planning", planbench),
    "travelplanner": ("hard", "planning", travelplanner),
    "sysdesign": ("hard", "system_design", sysdesign),
    "mathdial": ("hard", "math_tutoring_dialogue", mathdial),
    "sgd": ("easy", "task_dialogue", sgd),
    "taskmaster": ("easy", "task_dialogue", taskmaster),
    "topicalchat": ("easy", "chit_chat_dialogue", topicalchat),
}
REASONING = ("folio", "planbench", "travelplanner", "sysdesign")
DIALOGUES = ("mathdial", "sgd", "taskmaster", "topicalchat")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tier_eval.build_heldout")
    parser.add_argument("raw", type=Path, help="folder with the upstream files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (label, category, build) in SOURCES.items():
        print(f"{name:<14} {_write(args.out, name, label, category, build(args.raw)):>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
