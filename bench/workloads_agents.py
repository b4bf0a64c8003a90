"""Long-context agents: conversations that grow by tool calls and tool results.

Each agent has a long shared lead, its system prompt plus its tool schemas (the body's
``tools``), ~40 KB by default; each of its conversations starts from a task of its own and then
grows, turn after turn, by the assistant's tool call and the tool's result, to ~200 KB over
10-20 turns. A prefix router must tell the conversations of one agent apart well past the lead
(a fingerprint that stops at 32 KB sees them all as one prompt), and must keep each
conversation on the replica that holds its own history.

Round k (0-based) of a conversation sends: the system prompt, the task, then for each earlier
round j the assistant's message (its real answer as content, as the driver feeds answers back,
plus tool call j) and tool j's result. All text is seeded by (seed, agent, conversation) and
sized in characters: the lead (system prompt + the tools' JSON, as the sim renders it) is
exactly ``lead_chars``, and the last round's content (lead, task, tool calls' JSON and results,
leaving out the model's own answers) is exactly ``final_chars``. At the sim's 4 characters per
token the default last round is ~50k tokens: run it on replicas with ``max_model_len`` and KV
capacity above that (e.g. ``--max-model-len 65536 --num-blocks 16384``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from bench.workloads import Conversation, Message, RequestSpec, Tool, pool_chars

TOOLS_PER_AGENT = 12


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool call the assistant makes after a round, and the result the tool returns."""

    call: Tool
    result: str


@dataclass(frozen=True, slots=True)
class AgentConversation(Conversation):
    """A conversation of one agent: ``questions`` holds its task; it grows by ``steps``."""

    tools: tuple[Tool, ...] = ()
    steps: tuple[ToolStep, ...] = ()

    @property
    def rounds(self) -> int:
        return 1 + len(self.steps)

    def request(self, round_: int, answers: Sequence[str]) -> RequestSpec:
        if not 0 <= round_ < self.rounds:
            raise IndexError(f"conversation {self.id} has no round {round_}")
        if len(answers) != round_:
            raise ValueError(f"round {round_} needs {round_} earlier answers, got {len(answers)}")
        messages: list[Message] = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.questions[0]},
        ]
        for step, answer in zip(self.steps, answers, strict=False):
            messages.append({"role": "assistant", "content": answer, "tool_calls": [step.call]})
            messages.append(
                {"role": "tool", "tool_call_id": step.call["id"], "content": step.result}
            )
        return RequestSpec(
            self.id, self.group, round_, tuple(messages), self.max_tokens, tools=self.tools
        )


def tools_json_chars(tools: Sequence[Tool]) -> int:
    """Characters of the tools as the sim's chat template renders them (compact JSON)."""
    return len(orjson.dumps(list(tools)))


def _tool(name: str, description: str, argument: str) -> Tool:
    parameters = {
        "type": "object",
        "properties": {argument: {"type": "string"}},
        "required": [argument],
    }
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def agent_tools(seed: int, agent: int, chars: int, count: int = TOOLS_PER_AGENT) -> list[Tool]:
    """``count`` function tools whose JSON is exactly ``chars`` characters long."""
    rng = random.Random(f"{seed}:tools:{agent}")
    names = [f"agent{agent}_tool{i}" for i in range(count)]
    skeleton = tools_json_chars([_tool(name, "", "query") for name in names])
    room = chars - skeleton
    if room < count:
        raise ValueError(f"{chars} characters cannot hold {count} tool schemas")
    sizes = [room // count] * count
    sizes[-1] += room - sum(sizes)
    # Descriptions are plain words: JSON escapes none of their characters.
    return [
        _tool(name, pool_chars(rng, size), "query") for name, size in zip(names, sizes, strict=True)
    ]


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    """``total`` split into ``parts`` positive sizes that vary by up to +-50%."""
    weights = [rng.uniform(0.5, 1.5) for _ in range(parts)]
    scale = total / sum(weights)
    sizes = [max(1, int(w * scale)) for w in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def _steps(
    rng: random.Random, tag: str, tools: Sequence[Tool], count: int, result_chars: int, call: int
) -> tuple[ToolStep, ...]:
    if count == 0:
        return ()
    calls: list[Tool] = []
    for k in range(count):
        name = rng.choice(tools)["function"]["name"]
        arguments = orjson.dumps({"query": pool_chars(rng, call)}).decode()
        function = {"name": name, "arguments": arguments}
        calls.append({"id": f"call_{tag}_{k}", "type": "function", "function": function})
    room = result_chars - sum(tools_json_chars([c]) for c in calls)
    if room < count:
        raise ValueError("final_chars leaves no room for the tool results")
    sizes = _split(room, count, rng)
    return tuple(ToolStep(c, pool_chars(rng, size)) for c, size in zip(calls, sizes, strict=True))


def long_context_agents(
    agents: int = 8,
    conversations: int = 32,
    lead_chars: int = 40_000,
    tools_share: float = 0.5,
    final_chars: int = 200_000,
    min_turns: int = 10,
    max_turns: int = 20,
    task_chars: int = 1_000,
    call_chars: int = 200,
    answer_tokens: int = 32,
    seed: int = 0,
) -> list[AgentConversation]:
    """``conversations`` spread evenly over ``agents``, each of ``min_turns``-``max_turns``
    requests (drawn per conversation), shuffled so that the agents' arrivals mix.

    ``tools_share`` of each lead is tool schemas, the rest the system prompt; ``answer_tokens``
    is each request's ``max_tokens``.
    """
    if not 1 <= min_turns <= max_turns:
        raise ValueError("need 1 <= min_turns <= max_turns")
    tools_chars = int(lead_chars * tools_share)
    result: list[AgentConversation] = []
    for agent in range(agents):
        tools = agent_tools(seed, agent, tools_chars)
        lead = f"You are agent {agent + 1} of the build team. "
        system = pool_chars(random.Random(f"{seed}:agent:{agent}"), lead_chars - tools_chars, lead)
        mine = range(agent, conversations, agents)
        for index, number in enumerate(mine):
            rng = random.Random(f"{seed}:agent:{agent}:conversation:{index}")
            task = pool_chars(rng, task_chars, f"Task {number}: ")
            turns = rng.randint(min_turns, max_turns)
            growth = final_chars - lead_chars - task_chars
            steps = _steps(rng, f"{agent}_{index}", tools, turns - 1, growth, call_chars)
            result.append(
                AgentConversation(
                    id=f"a{agent:02d}-c{index:03d}",
                    group=agent,
                    system=system,
                    questions=(task,),
                    max_tokens=answer_tokens,
                    tools=tuple(tools),
                    steps=steps,
                )
            )
    random.Random(f"{seed}:agents:order").shuffle(result)
    return result


def content_chars(spec: RequestSpec) -> int:
    """The characters a request's prompt carries, template markers left out: its tools' JSON,
    each message's content and each tool call's JSON."""
    chars = tools_json_chars(spec.tools) if spec.tools else 0
    for message in spec.messages:
        chars += len(message.get("content") or "")
        chars += sum(tools_json_chars([call]) for call in message.get("tool_calls") or ())
    return chars
