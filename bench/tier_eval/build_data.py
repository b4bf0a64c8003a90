"""Builds the tier classifier's public training sets, bench/data/tier_train/*.jsonl, from the
upstream files (see bench/data/README.md for each source, its licence and its label rule).

    python -m bench.tier_eval.build_data RAW_DIR [--out bench/data/tier_train] [--only NAME ...]

RAW_DIR holds the upstream files under the names listed below (each comes from the public
repository and path given beside it); with ``--only``, those of the named sets alone. The
output is deterministic: same inputs, same bytes.

Not used, on purpose: self-instruct's 252 user-oriented instructions (they are part of the
AlpacaEval set, reserved for independent evaluation), StrategyQA (yes/no questions that a
bag of words cannot tell from trivia: labelled hard by category, they taught the model that short
questions are hard and wrecked the held-out split with NQ trivia).

Labels are by category, not by what a small model got wrong (no such labels exist for these
sets): maths problems, programs to write, planning and reasoning puzzles are ``hard``; general
instructions, chit-chat, writing, extraction, reading-comprehension QA, summarisation, one-step
maths drills and programming questions one line of code answers are ``easy``.
"""

from __future__ import annotations

import argparse
import csv
import functools
import gzip
import io
import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).parent.parent / "data" / "tier_train"
MAX_CHARS = 8000
"""Longer prompts are cut here (the classifier reads at most the first 3 KB and last 1 KB)."""
SEED = 9

# Upstream files, by the name expected in RAW_DIR:
#   gsm8k_train.jsonl          openai/grade-school-math grade_school_math/data/train.jsonl (MIT)
#   math_test.jsonl            MATH test problems (hendrycks/math, MIT), 1000-problem copy in
#                              cmu-mind/RISE data/math/test.jsonl
#   HumanEval.jsonl.gz         openai/human-eval data/HumanEval.jsonl.gz (MIT)
#   mbpp.jsonl                 google-research/google-research mbpp/mbpp.jsonl (CC-BY-4.0)
#   selfinstruct_seed_tasks.jsonl     yizhongw/self-instruct data/seed_tasks.jsonl (Apache-2.0)
#   theoremqa_test.json        wenhuchen/TheoremQA theoremqa_test.json (MIT)
#   nq_open_dev.jsonl          google-research-datasets/natural-questions nq_open/NQ-open.dev.jsonl
#                              (CC-BY-SA-3.0)
#   clinc_data_full.json       clinc/oos-eval data/data_full.json (CC-BY-3.0)
#   banking77_train.csv        PolyAI-LDN/task-specific-datasets banking_data/train.csv (CC-BY-4.0)
#   t0/<template>.jsonl        yizhongw/self-instruct data/finetuning/t0_train_50k/data_per_template
#                              (P3 prompts; promptsource templates Apache-2.0; only datasets
#                              whose own licence allows redistribution are used, see P3_SETS)
#   acpbench/<task>/*.json[.gz]  IBM/ACPBench dataset/ (CDLA-Permissive-2.0), 2ed9c92
#   prontoqa_dev.json          ProntoQA (asaparov/prontoqa, Apache-2.0), the 500-problem copy in
#                              teacherpeterpan/Logic-LLM data/ProntoQA/dev.json (MIT), d29f1e5
#   multilogieval/<depth>/<logic>/*.json   Mihir3009/Multi-LogiEval data/ (MIT), 6d55ade
#   proofwriter_train.json     ProofWriter (AllenAI, CC-BY-4.0), the depth-5 copy in
#                              teacherpeterpan/Logic-LLM data/ProofWriter/train.json (MIT), d29f1e5
#   mathematics/train-easy/<module>.txt  google-deepmind/mathematics_dataset's generator
#                              (Apache-2.0; pip package mathematics_dataset 1.0.1 with sympy
#                              1.5.1 and numpy 1.26, the aliases np.object, np.int, np.bool and
#                              np.float it still uses set back to the builtins before it is
#                              imported): `python -m mathematics_dataset.generate_to_file
#                              --output_dir=mathematics --per_train_module=300 --filter=MODULE`
#                              for each of MATH_DRILL_MODULES (the generator draws at random:
#                              a new generation gives other questions of the same kinds)
#   conala_train.json, conala_test.json   CoNaLa's curated intents (conala-corpus, Stack
#                              Overflow questions, CC-BY-SA-4.0), the copy in yuxiang2/CoNaLa
#                              corpus/ (ef779b8)

SEED_TASKS_HARD = frozenset(
    {
        "fun_math_question", "find_subset_of_numbers_with_target_sum", "perfect_numbers",
        "write_comments_in_python", "complete_python_code", "solving_equation", "code_todo",
        "regular_expression_generation", "math_word_problem_with_reasoning", "text_to_sql",
        "htlm_task", "python_code_generation", "python_sorting", "chess_puzzle",
        "solving_math_problem", "word_math_with_algebra", "code_for_bitcoin_price",
        "program_for_summation", "javascript_date_and_time", "python_leetcode",
        "solve_equation_system", "syllogism", "code_syntax_error",
    }
)  # fmt: skip
"""Self-instruct seed tasks whose category is coding, maths or a reasoning puzzle."""
P3_SETS = {
    # dataset prefix: (licence, part). Part A and part B never share a dataset.
    "adversarial_qa": ("CC-BY-SA-3.0", "a"),
    "duorc": ("MIT", "a"),
    "cosmos_qa": ("CC-BY-4.0", "a"),
    "commonsense_qa": ("MIT", "a"),
    "common_gen": ("MIT", "a"),
    "dbpedia_14": ("CC-BY-SA-3.0", "a"),
    "quoref": ("CC-BY-4.0", "b"),
    "ropes": ("CC-BY-4.0", "b"),
    "cnn_dailymail": ("Apache-2.0", "b"),
    "wiki_bio": ("CC-BY-SA-3.0", "b"),
    "quartz": ("CC-BY-4.0", "b"),
    "qasc": ("CC-BY-4.0", "b"),
    "quarel": ("CC-BY-4.0", "b"),
}
P3_PER_TEMPLATE = 12
ACP_HELD_OUT_DOMAINS = (
    "This is a blocksworld domain",
    "There are several cities",  # logistics
    "This is a depot domain",
)
"""ACPBench's blocksworld, logistics and depot (blocks and logistics combined) are left out:
PlanBench, a held-out set (bench/data/tier_heldout/), asks about the same two domains, and a
model that saw them would be tested on what it was trained on."""
MATH_DRILL_MODULES = (
    "arithmetic__add_or_sub", "arithmetic__mul", "arithmetic__div",
    "arithmetic__add_sub_multiple", "arithmetic__mul_div_multiple", "algebra__linear_1d",
    "calculus__differentiate", "comparison__pair", "comparison__sort",
    "measurement__conversion", "measurement__time", "numbers__round_number",
    "numbers__place_value", "numbers__gcd", "numbers__lcm", "numbers__div_remainder",
    "polynomials__evaluate",
)  # fmt: skip
"""The mathematics dataset's one-operation drills (a sum, a unit conversion, a rounding, a
linear equation in one unknown, a polynomial's derivative), at its easiest level: the easy
maths a general assistant is asked. Chosen by kind before any score was seen; its composed,
multi-step modules, systems of equations, probability and primality of large numbers are left
out. Two sets, like P3's: arithmetic and comparisons (part A), the rest (part B)."""
MATH_DRILL_SAMPLE = 500
"""Drills kept in each part."""
GSM8K_SAMPLE = 2000
SAMPLE = 1000
"""Prompts kept from each of the larger sets (NQ-open, CLINC150, BANKING77, ACPBench,
Multi-LogiEval, ProofWriter, CoNaLa)."""


def _body(text: str) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": text[:MAX_CHARS].strip()}]}


def _record(source: str, i: int, label: str, category: str, text: str) -> dict[str, Any]:
    return {
        "id": f"{source}-{i:05d}",
        "label": label,
        "category": category,
        "source": source,
        "body": _body(text),
    }


def _open(path: Path) -> io.BufferedIOBase:
    """The file's bytes, gunzipped where its name ends in .gz."""
    return gzip.open(path) if path.suffix == ".gz" else path.open("rb")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with _open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line.decode("utf-8"))


def gsm8k(raw: Path) -> list[dict[str, Any]]:
    rows = list(read_jsonl(raw / "gsm8k_train.jsonl"))
    random.Random(SEED).shuffle(rows)
    return [
        _record("gsm8k", i, "hard", "math_word_problem", r["question"])
        for i, r in enumerate(rows[:GSM8K_SAMPLE])
    ]


def math(raw: Path) -> list[dict[str, Any]]:
    def category(kind: str) -> str:
        return "math_" + kind.lower().replace(" & ", "_").replace(" ", "_")

    return [
        _record("math", i, "hard", category(r["type"]), r["problem"])
        for i, r in enumerate(read_jsonl(raw / "math_test.jsonl"))
    ]


def humaneval(raw: Path) -> list[dict[str, Any]]:
    # The prompt as the benchmark gives it: a signature and a docstring to complete.
    return [
        _record("humaneval", i, "hard", "code_completion", r["prompt"])
        for i, r in enumerate(read_jsonl(raw / "HumanEval.jsonl.gz"))
    ]


def mbpp(raw: Path) -> list[dict[str, Any]]:
    # The prompt format of the MBPP paper, without its few-shot examples.
    return [
        _record(
            "mbpp", i, "hard", "code_generation",
            f"{r['text']} Your code should pass these tests:\n\n" + "\n".join(r["test_list"]),
        )
        for i, r in enumerate(read_jsonl(raw / "mbpp.jsonl"))
    ]  # fmt: skip


def _instruction_text(task: dict[str, Any]) -> str:
    instances = task.get("instances") or [{}]
    extra = str(instances[0].get("input", "")).strip()
    return str(task["instruction"]).strip() + (f"\n\n{extra}" if extra else "")


def selfinstruct_seed(raw: Path) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(read_jsonl(raw / "selfinstruct_seed_tasks.jsonl")):
        hard = t["name"] in SEED_TASKS_HARD
        category = "code_math_puzzle" if hard else "general_instruction"
        out.append(
            _record("selfinstruct_seed", i, "hard" if hard else "easy", category,
                    _instruction_text(t))
        )  # fmt: skip
    return out


def p3(raw: Path, part: str) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    out: list[dict[str, Any]] = []
    source = f"p3_{part}"
    for path in sorted((raw / "t0").glob("*.jsonl")):
        dataset = next((d for d in P3_SETS if path.stem.startswith(d)), None)
        if dataset is None or P3_SETS[dataset][1] != part:
            continue
        rows = list(read_jsonl(path))
        for r in rng.sample(rows, min(P3_PER_TEMPLATE, len(rows))):
            out.append(_record(source, len(out), "easy", dataset, r["prompt"]))
    return out


def _sample(rows: list[Any], size: int = SAMPLE) -> list[Any]:
    return random.Random(SEED).sample(rows, min(size, len(rows)))


def theoremqa(raw: Path) -> list[dict[str, Any]]:
    rows = json.loads((raw / "theoremqa_test.json").read_text(encoding="utf-8"))
    return [
        _record("theoremqa", i, "hard", "stem_" + str(r["field"]).lower(), r["Question"])
        for i, r in enumerate(r for r in rows if not r.get("Picture"))
    ]


def nq_open(raw: Path) -> list[dict[str, Any]]:
    rows = list(read_jsonl(raw / "nq_open_dev.jsonl"))
    return [
        _record("nq_open", i, "easy", "trivia", r["question"].strip().capitalize() + "?")
        for i, r in enumerate(_sample(rows))
    ]


def clinc(raw: Path) -> list[dict[str, Any]]:
    # Queries to a personal assistant, in 150 intents (timers, translation, small sums, ...).
    rows = json.loads((raw / "clinc_data_full.json").read_text(encoding="utf-8"))["train"]
    return [
        _record("clinc", i, "easy", "assistant_" + intent, text)
        for i, (text, intent) in enumerate(_sample(rows))
    ]


def banking77(raw: Path) -> list[dict[str, Any]]:
    # Customer-support questions to a bank.
    with (raw / "banking77_train.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return [
        _record("banking77", i, "easy", "customer_support", r["text"])
        for i, r in enumerate(_sample(rows))
    ]


def _json(path: Path) -> Any:
    with _open(path) as f:
        data = f.read()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:  # three of Multi-LogiEval's files are cp1252
        return json.loads(data.decode("cp1252"))


def acpbench(raw: Path) -> list[dict[str, Any]]:
    # Planning in words: a domain, a state and a goal, and a question about actions or plans.
    seen: dict[str, str] = {}
    for path in sorted((raw / "acpbench").glob("*/*.json*")):
        for r in _json(path):
            context = str(r["context"]).strip()
            if context.startswith(ACP_HELD_OUT_DOMAINS):
                continue
            text = f"{context}\n\n{str(r['question']).strip()}"
            seen.setdefault(text, "planning_" + str(r["group"]))
    rows = _sample(sorted(seen.items()))
    return [_record("acpbench", i, "hard", group, text) for i, (text, group) in enumerate(rows)]


def prontoqa(raw: Path) -> list[dict[str, Any]]:
    # Chains of deduction over made-up categories ("Every wumpus is an impus."): no world
    # knowledge to lean on.
    return [
        _record("prontoqa", i, "hard", "deductive_reasoning",
                f"{r['context'].strip()}\n\n{r['question'].strip()}")
        for i, r in enumerate(_json(raw / "prontoqa_dev.json"))
    ]  # fmt: skip


def proofwriter(raw: Path) -> list[dict[str, Any]]:
    # Facts and rules over people and animals, five steps of deduction deep, and a
    # true / false / unknown question.
    texts = {
        f"{str(r['context']).strip()}\n\n{str(r['question']).strip()}"
        for r in _json(raw / "proofwriter_train.json")
    }
    return [
        _record("proofwriter", i, "hard", "deductive_reasoning", text)
        for i, text in enumerate(_sample(sorted(texts)))
    ]


def multilogieval(raw: Path) -> list[dict[str, Any]]:
    # Everyday rules chained one to five steps deep, and a yes/no question on them.
    rows = []
    for path in sorted((raw / "multilogieval").glob("**/*.json")):
        data = _json(path)
        category = f"logic_{data['logic']}_{data['depth']}"
        for r in data["samples"]:
            rows.append((f"{r['context'].strip()}\n\n{r['question'].strip()}", category))
    return [
        _record("multilogieval", i, "hard", category, text)
        for i, (text, category) in enumerate(_sample(rows))
    ]


def math_drills(raw: Path, part: str) -> list[dict[str, Any]]:
    # One-step maths drills ("What is 515 plus -0.3?", "Solve 3*x = 12 for x."): the file
    # alternates question and answer lines.
    rows: dict[str, str] = {}
    for module in MATH_DRILL_MODULES:
        if module.startswith(("arithmetic__", "comparison__")) != (part == "a"):
            continue
        lines = (raw / "mathematics" / "train-easy" / f"{module}.txt").read_text().splitlines()
        for question in lines[::2]:
            rows.setdefault(question.strip(), "math_drill_" + module.split("__")[1])
    name = f"math_drills_{part}"
    chosen = _sample(sorted(rows.items()), MATH_DRILL_SAMPLE)
    return [_record(name, i, "easy", category, text) for i, (text, category) in enumerate(chosen)]


def conala(raw: Path) -> list[dict[str, Any]]:
    # Programming questions a line of Python answers ("sort list `x` in reverse order",
    # "How to delete a record in Django models?"), as curated from Stack Overflow.
    intents = {
        str(r["intent"]).strip()
        for name in ("conala_train.json", "conala_test.json")
        for r in _json(raw / name)
    }
    return [
        _record("conala", i, "easy", "code_one_liner", text)
        for i, text in enumerate(_sample(sorted(intents)))
    ]


BUILDERS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    "gsm8k": gsm8k,
    "math": math,
    "humaneval": humaneval,
    "mbpp": mbpp,
    "selfinstruct_seed": selfinstruct_seed,
    "p3_a": functools.partial(p3, part="a"),
    "p3_b": functools.partial(p3, part="b"),
    "theoremqa": theoremqa,
    "nq_open": nq_open,
    "clinc": clinc,
    "banking77": banking77,
    "acpbench": acpbench,
    "prontoqa": prontoqa,
    "multilogieval": multilogieval,
    "proofwriter": proofwriter,
    "math_drills_a": functools.partial(math_drills, part="a"),
    "math_drills_b": functools.partial(math_drills, part="b"),
    "conala": conala,
}


def build(raw: Path, out: Path, only: Sequence[str] = ()) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, builder in BUILDERS.items():
        if only and name not in only:
            continue
        records = builder(raw)
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        counts[name] = len(records)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tier_eval.build_data")
    parser.add_argument("raw", type=Path, help="folder with the upstream files")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="+", choices=sorted(BUILDERS), default=(),
                        help="build these sets only (RAW_DIR needs only their files)")  # fmt: skip
    args = parser.parse_args(argv)
    for name, n in build(args.raw, args.out, args.only).items():
        print(f"{name:<20} {n:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
