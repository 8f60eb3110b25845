"""Chats played against a real engine, turn by turn: the answers come from the model.

minillm.workloads.prefixes.multi_turn draws what the users type (a Conversation); only a model
can say what it answers, so turn k+1's prompt, built from turn k's answer, exists only once the
engine has run turn k. run_conversations is that loop; in_issue_order (in workloads) puts its
outputs in the order they were sent, for ideal_prefix_reuse.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from minillm.sampling import SamplingParams

if TYPE_CHECKING:
    from minillm.request import RequestOutput
    from minillm.workloads.prefixes import Conversation


class TokenPromptLLM(Protocol):
    """Anything whose generate takes token-id prompts and one SamplingParams each, and returns
    outputs (with .token_ids) in prompt order, as minillm.LLM.generate does."""

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]
                 ) -> list[RequestOutput]: ...


def run_conversations(llm: TokenPromptLLM, conversations: Sequence[Conversation],
                      sampling_params: SamplingParams | None = None) -> list[list[RequestOutput]]:
    """Play every conversation against llm, turn by turn; outputs[c][k] is turn k of chat c.

    Round k sends turn k of every conversation that has one in one generate call, each prompt
    built from that chat's actual answers so far, so chats share the batch and compete for the
    cache as users of one server do. sampling_params: used for every turn (its max_tokens rules);
    None: greedy, ignore_eos, max_tokens each conversation's output_lens[k].
    """
    answers: list[list[list[int]]] = [[] for _ in conversations]
    outputs: list[list[RequestOutput]] = [[] for _ in conversations]
    quiet = "use_tqdm" in inspect.signature(llm.generate).parameters
    for k in range(max((c.num_turns for c in conversations), default=0)):
        active = [i for i, c in enumerate(conversations) if k < c.num_turns]
        prompts = [conversations[i].prompt(k, answers[i]) for i in active]
        params = [sampling_params or SamplingParams(
            max_tokens=conversations[i].output_lens[k], temperature=0.0, ignore_eos=True)
            for i in active]
        results = (llm.generate(prompts, params, use_tqdm=False) if quiet
                   else llm.generate(prompts, params))
        for i, out in zip(active, results):
            answers[i].append(list(out.token_ids))
            outputs[i].append(out)
    return outputs
