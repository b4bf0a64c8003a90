"""Seeded, reproducible shared-prefix workloads, as conversations of chat requests.

A workload is a list of conversations. Each conversation belongs to a group (the groups have
their own long system prompts) and has one or more rounds. Round k's messages repeat the
system prompt, every earlier question AND the assistant's real answers to them, so a driver
runs a conversation's rounds in order and feeds each answer back in (``Conversation.request``).
Single-shot workloads are conversations of one round.

Text is pseudo-random words, cut to ``4 x tokens`` characters (~4 characters per token, the
sim's tokenizer and llm-d's estimate). Every string comes from a ``random.Random`` seeded by
(seed, group, user), so a group's system prompt does not change when users or rounds are added.

Arrival times are a separate schedule (``poisson_arrivals``) that the driver follows, so the
same conversations can be sent closed-loop or open-loop. Open-loop workloads that come with
their own times (overload phases, trace replay) are lists of (arrival, conversation) pairs
(``Schedule``); ``split_schedule`` gives the driver its two arguments.

More workloads live beside this module: ``workloads_agents`` (long-context tool-calling
agents), ``workloads_overload`` (phases over and under the fleet's capacity) and
``workloads_mooncake`` (replay of Mooncake's public traces).
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4

Message = dict[str, Any]
"""One OpenAI chat message (role, content, and for agents tool_calls or tool_call_id)."""
Tool = dict[str, Any]

_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd")


def _word(rng: random.Random) -> str:
    syllables = rng.randint(1, 3)
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    )


def random_text(rng: random.Random, tokens: int, lead: str = "") -> str:
    """``lead`` followed by pseudo-random words, exactly ``tokens x 4`` characters long."""
    return random_chars(rng, tokens * CHARS_PER_TOKEN, lead)


def random_chars(rng: random.Random, size: int, lead: str = "") -> str:
    """``lead`` followed by pseudo-random words, exactly ``size`` characters long."""
    words = [lead] if lead else []
    length = len(lead)
    while length < size:
        word = _word(rng)
        length += len(word) + (1 if words else 0)  # the joining space
        words.append(word)
    return " ".join(words)[:size]


@functools.cache
def word_pool(size: int = 4096) -> tuple[str, ...]:
    """A fixed list of pseudo-random words, the same in every process."""
    rng = random.Random("word-pool")
    return tuple(_word(rng) for _ in range(size))


def pool_chars(rng: random.Random, size: int, lead: str = "") -> str:
    """``random_chars`` at a fraction of its cost, for long texts: words drawn from
    ``word_pool`` (one ``choices`` call instead of a generator loop per word)."""
    room = max(size - len(lead), 0)
    # Pool words average over 6 characters with their space: this many always suffice.
    words = rng.choices(word_pool(), k=room // 3 + 1)
    return (lead + " " + " ".join(words) if lead else " ".join(words))[:size]


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One chat request of a conversation, ready to send."""

    conversation: str
    group: int
    round: int
    messages: tuple[Message, ...]
    max_tokens: int
    tools: tuple[Tool, ...] = ()
    """Tool definitions to send with the request (the body's ``tools``); none when empty."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """One user's conversation: a system prompt shared by the group, then its questions."""

    id: str
    group: int
    system: str
    questions: tuple[str, ...]
    max_tokens: int

    @property
    def rounds(self) -> int:
        return len(self.questions)

    def request(self, round_: int, answers: Sequence[str]) -> RequestSpec:
        """Round ``round_`` (0-based), given the assistant's answers to every earlier round."""
        if not 0 <= round_ < self.rounds:
            raise IndexError(f"conversation {self.id} has no round {round_}")
        if len(answers) != round_:
            raise ValueError(f"round {round_} needs {round_} earlier answers, got {len(answers)}")
        # An empty system prompt sends none (trace replay: the whole prompt is the user's).
        messages: list[Message] = (
            [{"role": "system", "content": self.system}] if self.system else []
        )
        for question, answer in zip(self.questions, answers, strict=False):
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": self.questions[round_]})
        return RequestSpec(self.id, self.group, round_, tuple(messages), self.max_tokens)


def total_requests(workload: Sequence[Conversation]) -> int:
    return sum(conversation.rounds for conversation in workload)


def _system_prompt(seed: int, group: int, tokens: int) -> str:
    # A boilerplate opening shared by all groups, as real system prompts have; shorter than one
    # KV block (16 tokens = 64 characters), so no group gets cache hits from another's prompt.
    lead = f"You are the assistant of team {group + 1}."
    return random_text(random.Random(f"{seed}:system:{group}"), tokens, lead)


def _questions(seed: int, group: int, user: int, count: int, tokens: int) -> tuple[str, ...]:
    rng = random.Random(f"{seed}:user:{group}:{user}")
    return tuple(random_text(rng, tokens) for _ in range(count))


def _shuffled(conversations: list[Conversation], seed: int) -> list[Conversation]:
    # Arrival order mixes the groups, as real traffic does; group-by-group arrival would hand
    # any policy a locality that real traffic does not have.
    random.Random(f"{seed}:order").shuffle(conversations)
    return conversations


def multi_turn_shared_prefix(
    groups: int,
    users_per_group: int,
    rounds: int,
    system_tokens: int,
    question_tokens: int,
    answer_tokens: int,
    seed: int = 0,
) -> list[Conversation]:
    """Multi-round QA with shared system prompts (vLLM production-stack's benchmark, grouped).

    Each group has its own ``system_tokens``-long system prompt; each of its users asks
    ``rounds`` questions of ``question_tokens``, each answered with ``answer_tokens``, and every
    round resends the whole history, so a user's prompt grows by about
    question_tokens + answer_tokens per round.
    """
    systems = [_system_prompt(seed, group, system_tokens) for group in range(groups)]
    conversations = [
        Conversation(
            id=f"g{group:03d}-u{user:03d}",
            group=group,
            system=systems[group],
            questions=_questions(seed, group, user, rounds, question_tokens),
            max_tokens=answer_tokens,
        )
        for group in range(groups)
        for user in range(users_per_group)
    ]
    return _shuffled(conversations, seed)


def generated_shared_prefix(
    groups: int = 64,
    prompts_per_group: int = 16,
    system_tokens: int = 2048,
    question_tokens: int = 128,
    output_tokens: int = 256,
    seed: int = 0,
) -> list[Conversation]:
    """SGLang's generated-shared-prefix workload: one-round requests, one system prompt per group.

    The defaults are SGLang's (64 groups x 16 prompts, 2,048-token system prompt, 128-token
    question, 256-token output).
    """
    systems = [_system_prompt(seed, group, system_tokens) for group in range(groups)]
    conversations = [
        Conversation(
            id=f"g{group:03d}-p{prompt:03d}",
            group=group,
            system=systems[group],
            questions=_questions(seed, group, prompt, 1, question_tokens),
            max_tokens=output_tokens,
        )
        for group in range(groups)
        for prompt in range(prompts_per_group)
    ]
    return _shuffled(conversations, seed)


def low_sharing(
    groups: int = 64,
    prompts_per_group: int = 16,
    shared_tokens: int = 128,
    unique_tokens: int = 2048,
    output_tokens: int = 256,
    seed: int = 0,
) -> list[Conversation]:
    """llm-d's low-sharing control: a short part shared by a group, then a long unique part.

    The shape of ``generated_shared_prefix`` with the lengths swapped (SGLang's 2,048 shared and
    128 unique become 128 shared and 2,048 unique), so the two read side by side: here prefix
    affinity can save little, and a prefix-aware router must not lose to a load-only one.
    """
    return generated_shared_prefix(
        groups, prompts_per_group, shared_tokens, unique_tokens, output_tokens, seed
    )


def zipf_weights(groups: int, exponent: float) -> list[float]:
    """Zipf popularity of ``groups`` ranks: rank k (1-based) weighs k^-exponent; the sum is 1."""
    if groups < 1:
        raise ValueError("zipf_weights needs at least one group")
    raw = [rank**-exponent for rank in range(1, groups + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def zipf_groups(
    groups: int = 64,
    requests: int = 1024,
    exponent: float = 1.0,
    system_tokens: int = 2048,
    question_tokens: int = 128,
    output_tokens: int = 256,
    seed: int = 0,
) -> list[Conversation]:
    """Skewed popularity: each one-round request picks its group from a Zipf distribution.

    Group 0 is the hot system prompt (with ``exponent`` 1 and 64 groups it gets ~21% of the
    requests, 1.7x the share of one replica in 8); the lengths are generated-shared-prefix's.
    Pinning every request of a prefix to one replica would overload that replica here.
    """
    weights = zipf_weights(groups, exponent)
    rng = random.Random(f"{seed}:zipf")
    picks = rng.choices(range(groups), weights=weights, k=requests)
    systems = {group: _system_prompt(seed, group, system_tokens) for group in sorted(set(picks))}
    counters = dict.fromkeys(systems, 0)
    conversations = []
    for group in picks:
        index = counters[group]
        counters[group] += 1
        conversations.append(
            Conversation(
                id=f"g{group:03d}-z{index:04d}",
                group=group,
                system=systems[group],
                questions=_questions(seed, group, index, 1, question_tokens),
                max_tokens=output_tokens,
            )
        )
    return conversations  # the draws are already in random order


Schedule = list[tuple[float, Conversation]]
"""An open-loop workload: (start offset in seconds, conversation) pairs in arrival order."""


def split_schedule(schedule: Schedule) -> tuple[list[float], list[Conversation]]:
    """The arrival offsets and the conversations, as ``driver.run_conversations`` takes them
    (``run_conversations(url, conversations, arrivals=arrivals, ...)``)."""
    return [at for at, _ in schedule], [conversation for _, conversation in schedule]


def poisson_arrivals(count: int, rate: float, seed: int = 0) -> list[float]:
    """Start offsets in seconds of ``count`` arrivals of a Poisson process at ``rate`` per second.

    The first arrival is at 0; the gaps are exponential with mean 1 / rate (open-loop load, as
    llm-d's and vLLM's benchmarks send it). Seeded, so every target gets the same schedule.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(f"{seed}:arrivals")
    gaps = [0.0] + [rng.expovariate(rate) for _ in range(count - 1)]
    return list(itertools.accumulate(gaps))[:count]
