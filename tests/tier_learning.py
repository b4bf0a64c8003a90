"""Shared helpers of the learned tier classifier's tests: the shipped model, prompts whose tier
is obvious to anyone, and a tiny labelled training set of such prompts."""

from __future__ import annotations

from bench.tier_eval.evaluation import Example
from router_policies.tier_classifiers import load_learned
from tests.tiers import chat

SHIPPED = load_learned(None)

OBVIOUSLY_HARD = [
    "Find all real x such that $x^3 - 6x^2 + 11x - 6 = 0$ and prove there are no others.",
    "A train leaves at 3 pm going 60 mph; a second leaves at 4 pm going 80 mph. When does the "
    "second catch up, and how far from the station?",
    "Write a Python function that returns the longest palindromic substring of a string.",
    "def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:\n"
    '    """Merge all overlapping intervals and return them sorted."""\n',
    "Compute the sum of all integers n < 1000 such that n^2 + 1 is divisible by 5.",
]
OBVIOUSLY_EASY = [
    "hi!",
    "Good morning! How are you today?",
    "thanks, that was really helpful :)",
    "Write a short, friendly email thanking my team for their work this week.",
    "What is the capital of Australia?",
    "Summarize this paragraph in one sentence: The meeting was moved to Thursday because "
    "several people were travelling, and the agenda stays the same.",
]

TINY = [
    ("hard", "gsm", "Tom has 3 apples and buys 5 more. How many apples does he have?"),
    ("hard", "gsm", "A shop sells pens at $2 each. How much do 7 pens cost?"),
    ("hard", "gsm", "If 4 workers build a wall in 6 days, how many days do 8 workers need?"),
    ("hard", "code", "Write a python function to check whether a number is prime."),
    ("hard", "code", "Write a python function to sort a list of tuples by the second item."),
    ("hard", "code", "def add(a, b):\n    '''Return the sum of a and b.'''\n"),
    ("easy", "chat", "Write a haiku about the sea."),
    ("easy", "chat", "Suggest a name for my new puppy."),
    ("easy", "chat", "Rewrite this sentence to sound more polite: send it now."),
    ("easy", "chat", "What is a good gift for my mother's birthday?"),
    ("easy", "chat", "Translate 'good morning' into French."),
    ("easy", "chat", "Tell me a fun fact about penguins."),
]


def tiny_examples() -> list[Example]:
    return [
        Example(id=f"t{i}", label=label, category=src, body=chat(text), source=src)
        for i, (label, src, text) in enumerate(TINY)
    ]
