"""Single-turn prompts as the first turn of a two-turn conversation: the prompt, a short
assistant reply, and a follow-up that says nothing of the task ("Can you make that shorter?").

The classifier has to find a conversation's task in its first message. The public training
sets are single prompts, so training also sees a share of them as conversations, each with a
follow-up drawn from ``TRAIN_FOLLOW_UPS``, under the prompt's own label; the evaluation turns
every held-out prompt into one with ``EVAL_FOLLOW_UPS``, a list training never saw. The
follow-ups were written for this project and are neutral between easy and hard by design:
each list is applied to both labels alike, so none of their words can carry a label.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from bench.tier_eval.evaluation import Example

TRAIN_FOLLOW_UPS = (
    "Thanks. Can you make that shorter?",
    "Could you explain the second part again?",
    "Please rewrite it in a more formal tone.",
    "What would change if we did it the other way around?",
    "Give me another example.",
    "Can you double-check that?",
    "OK, and what is the next step?",
    "Put that in a table, please.",
    "Summarise your answer in two sentences.",
    "Why?",
    "Are you sure about that?",
    "Now do the same for the second case.",
    "Translate your answer into Spanish.",
    "How confident are you?",
    "Expand on the first point.",
    "Make it simpler, please.",
    "Could you list the steps as bullet points?",
    "What are the caveats?",
    "Thanks, that helps. Can you add a short conclusion?",
    "Write it again, but for a ten-year-old.",
)
EVAL_FOLLOW_UPS = (
    "Hmm, try a different approach.",
    "Can you shorten it to one paragraph?",
    "Please go over it once more, slowly.",
    "And in the opposite case?",
    "Great. Add a brief explanation for each part.",
    "What did you assume there?",
    "Repeat that as a numbered list.",
    "Can you check your answer?",
    "Now change one detail and redo it.",
    "Thanks!",
)
REPLIES = (
    "Sure, here it is.",
    "Certainly. Let me work through it step by step.",
    "Here is my answer.",
    "Good question. In short:",
)


def as_conversation(example: Example, follow_up: str, reply: str) -> Example:
    """The example's prompt as the first user turn, then ``reply`` and ``follow_up``."""
    messages = list(example.body.get("messages") or [])
    if not messages:  # a completion prompt
        messages = [{"role": "user", "content": str(example.body.get("prompt", ""))}]
    turns = [*messages, {"role": "assistant", "content": reply}]
    turns.append({"role": "user", "content": follow_up})
    body = {k: v for k, v in example.body.items() if k != "prompt"}
    return replace(example, id=example.id + "+turn2", body={**body, "messages": turns})


def conversations(
    examples: Sequence[Example], follow_ups: Sequence[str], share: float, seed: int
) -> list[Example]:
    """A seeded ``share`` of the examples (all of them at 1.0) as two-turn conversations."""
    rng = random.Random(seed)
    out = []
    for example in examples:
        if share >= 1.0 or rng.random() < share:
            out.append(as_conversation(example, rng.choice(follow_ups), rng.choice(REPLIES)))
    return out
