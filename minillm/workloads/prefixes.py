"""Workloads whose requests share prefixes, with their token ids spelled out, and the ceiling on
what a prefix cache can reuse from them.

- shared_prefix: every prompt is one of a few system prompts (or few-shot blocks) followed by a
  question of its own; a Workload the simulator (minillm.simulator.simulate) serves, whose specs
  also give the real engine its prompts (spec.token_ids(vocab_size) -> LLM.generate).
- multi_turn: chats whose turn k+1 prompt is turn k's prompt, turn k's answer and a new user
  message. The answer comes from the model, so a Conversation holds only what the user types;
  minillm.serve.conversations.run_conversations plays the turns against a real LLM.
- ideal_prefix_reuse / shared_token_fraction: how many prompt tokens a cache of unlimited size
  could have served, computed exactly from the token ids: the ceiling a measured hit rate is
  compared with.

Token ids are drawn from [1, vocab_size): id 0 is end-of-sequence in the shipped model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minillm.workloads.lengths import Length, as_distribution, check_int
from minillm.workloads.streams import RequestSpec, Workload, _check_rate, arrival_times


@dataclass(frozen=True)
class TokenRequestSpec(RequestSpec):
    """A RequestSpec that carries its prompt's token ids (prompt_len of them).

    token_ids(vocab_size) returns them instead of drawing a prompt from the seed, so the
    simulator and the engine see exactly these tokens. prefix_id/prefix_len, when set, say
    which shared prefix the prompt starts with (for reading a workload; nothing depends on it).
    """

    prompt_ids: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.prompt_ids) != self.prompt_len:
            raise ValueError(f"prompt_ids holds {len(self.prompt_ids)} tokens but "
                             f"prompt_len={self.prompt_len}; pass prompt_len=len(prompt_ids)")

    def token_ids(self, vocab_size: int) -> list[int]:
        """The prompt's ids; raises ValueError if one is outside the model's [0, vocab_size)."""
        check_int(vocab_size, "vocab_size", minimum=2)
        if min(self.prompt_ids) < 0 or max(self.prompt_ids) >= vocab_size:
            raise ValueError(f"the prompt holds token ids up to {max(self.prompt_ids)} but the "
                             f"model's vocab_size is {vocab_size}; build the workload with "
                             f"vocab_size={vocab_size}")
        return list(self.prompt_ids)


def random_tokens(rng: random.Random, n: int, vocab_size: int) -> tuple[int, ...]:
    """n token ids drawn uniformly from [1, vocab_size)."""
    return tuple(rng.randrange(1, vocab_size) for _ in range(n))


def zipf_weights(n: int, exponent: float) -> list[float]:
    """Weights 1 / (k + 1) ** exponent for k < n: 0 is uniform, 1 is Zipf's law (k = 0 hottest)."""
    if not (isinstance(exponent, (int, float)) and math.isfinite(exponent) and exponent >= 0):
        raise ValueError(f"zipf must be a number >= 0 (0: uniform), got {exponent!r}")
    return [1.0 / (k + 1) ** exponent for k in range(n)]


def shared_prefix(num_requests: int, num_prefixes: int, prefix_len: int, suffix_len: Length,
                  output_len: Length, rate: float = math.inf, *, vocab_size: int,
                  zipf: float = 0.0, seed: int = 0) -> Workload:
    """Open loop: each prompt is one of num_prefixes shared prefixes, then a question of its own.

    prefix_len: tokens of every shared prefix (a system prompt or a block of few-shot examples).
    suffix_len, output_len: lengths (int, (lo, hi) or a distribution, as in minillm.workload).
    rate: Poisson arrivals in requests/s; inf sends them all at 0 s.
    zipf: how skewed the choice of prefix is: prefix k is picked with probability proportional
    to 1 / (k + 1) ** zipf, so 0 is uniform and 1 makes prefix 0 as popular as Zipf's law says
    the most common word is (the usual model of a few hot system prompts and a long tail).
    vocab_size: the model's; ids are drawn from [1, vocab_size).
    Returns a Workload of TokenRequestSpec; the same arguments give the same tokens, and a
    prefix's tokens depend only on (seed, its index), not on how many requests there are.
    Unlike minillm.workload.shared_prefix, the ids are explicit (so shared_token_fraction and
    the real engine see them) and the choice of prefix may be skewed.
    """
    check_int(num_requests, "num_requests")
    check_int(num_prefixes, "num_prefixes")
    check_int(prefix_len, "prefix_len")
    check_int(vocab_size, "vocab_size", minimum=2)
    rate = _check_rate(rate)
    suffix = as_distribution(suffix_len, "suffix_len")
    output = as_distribution(output_len, "output_len")
    weights = zipf_weights(num_prefixes, zipf)
    prefixes = [random_tokens(random.Random(f"{seed}-prefix-{k}"), prefix_len, vocab_size)
                for k in range(num_prefixes)]
    rng = random.Random(seed)
    specs = []
    for i, t in enumerate(arrival_times(rng, num_requests, rate)):
        k = rng.choices(range(num_prefixes), weights=weights)[0]
        prompt = prefixes[k] + random_tokens(rng, suffix.sample(rng), vocab_size)
        specs.append(TokenRequestSpec(t, len(prompt), output.sample(rng), prefix_id=k,
                                      prefix_len=prefix_len, seed=i, prompt_ids=prompt))
    return Workload(specs, rate=rate)


@dataclass(frozen=True)
class Conversation:
    """What a user types in one chat: the first prompt, then one message per later turn.

    Turn 0's prompt is first_prompt; turn k + 1's is turn k's prompt + turn k's answer +
    user_turns[k]. output_lens[k]: the answer length asked for at turn k (tokens).
    """

    first_prompt: tuple[int, ...] = field(repr=False)
    user_turns: tuple[tuple[int, ...], ...] = field(repr=False)
    output_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.first_prompt or not all(self.user_turns):
            raise ValueError("a Conversation's first prompt and user turns must be non-empty")
        if len(self.output_lens) != self.num_turns:
            raise ValueError(f"output_lens has {len(self.output_lens)} entries for "
                             f"{self.num_turns} turns; give one per turn")

    @property
    def num_turns(self) -> int:
        return 1 + len(self.user_turns)

    def prompt(self, turn: int, answers: Sequence[Sequence[int]]) -> list[int]:
        """Turn turn's prompt, given the answers (output token ids) of the turns before it."""
        if not 0 <= turn < self.num_turns or len(answers) < turn:
            raise ValueError(f"turn {turn} of a {self.num_turns}-turn conversation needs the "
                             f"{turn} answers before it, got {len(answers)}")
        tokens = list(self.first_prompt)
        for k in range(turn):
            tokens += list(answers[k]) + list(self.user_turns[k])
        return tokens


def multi_turn(num_conversations: int, num_turns: int, first_len: Length, turn_len: Length,
               output_len: Length, *, vocab_size: int, system_prompt_len: int = 0,
               seed: int = 0) -> list[Conversation]:
    """num_conversations chats of num_turns turns each (the model's answers are not drawn).

    first_len: tokens of the opening user message; turn_len: of each later one; output_len: of
    each answer asked for. system_prompt_len: tokens of a system prompt that opens every chat
    (the same tokens in all; 0: none). Lengths are as in minillm.workload; ids in
    [1, vocab_size).
    """
    check_int(num_conversations, "num_conversations")
    check_int(num_turns, "num_turns")
    check_int(vocab_size, "vocab_size", minimum=2)
    check_int(system_prompt_len, "system_prompt_len", minimum=0)
    first, turn, output = (as_distribution(first_len, "first_len"),
                           as_distribution(turn_len, "turn_len"),
                           as_distribution(output_len, "output_len"))
    system = random_tokens(random.Random(f"{seed}-system"), system_prompt_len, vocab_size)
    rng = random.Random(seed)
    return [Conversation(system + random_tokens(rng, first.sample(rng), vocab_size),
                         tuple(random_tokens(rng, turn.sample(rng), vocab_size)
                               for _ in range(num_turns - 1)),
                         tuple(output.sample(rng) for _ in range(num_turns)))
            for _ in range(num_conversations)]


def in_issue_order(outputs: Sequence[Sequence[RequestOutput]]) -> list[RequestOutput]:
    """run_conversations' outputs (minillm.serve.conversations; per chat, per turn) in the
    order they were sent: turn 0 of every chat, then turn 1, ...; the order ideal_prefix_reuse
    must see them in."""
    rounds = max((len(turns) for turns in outputs), default=0)
    return [turns[k] for k in range(rounds) for turns in outputs if k < len(turns)]


@dataclass(frozen=True)
class PrefixReuse:
    """What a cache of unlimited size could reuse from a sequence of requests (in tokens).

    prompt_tokens: all prompt tokens. reusable_tokens: those an ideal cache serves, in whole
    blocks. queried_tokens, queried_blocks, reusable_blocks: lookups and hits counted as the
    engine counts them (each prompt but its last token; its full blocks), so the engine's
    stats() hit rates can be set against block_hit_rate and token_hit_rate directly.
    """

    prompt_tokens: int
    reusable_tokens: int
    queried_tokens: int
    queried_blocks: int
    reusable_blocks: int

    @property
    def fraction(self) -> float:
        """reusable_tokens / prompt_tokens: the ceiling on the share of prefill a cache saves."""
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else math.nan

    @property
    def token_hit_rate(self) -> float:
        """reusable_tokens / queried_tokens: the ceiling on the engine's token hit rate."""
        return self.reusable_tokens / self.queried_tokens if self.queried_tokens else math.nan

    @property
    def block_hit_rate(self) -> float:
        """reusable_blocks / queried_blocks: the ceiling on the engine's block hit rate."""
        return self.reusable_blocks / self.queried_blocks if self.queried_blocks else math.nan


if TYPE_CHECKING:  # a finished request is read by its fields: workloads sit below the engine
    from minillm.request import RequestOutput

    ReuseItem = RequestSpec | RequestOutput | Sequence[int]


def _prompt_and_left(item: ReuseItem, vocab_size: int | None) -> tuple[list[int], list[int]]:
    """An item's prompt ids, and the ids whose K/V it leaves computed (hence cacheable)."""
    if isinstance(item, TokenRequestSpec):
        return list(item.prompt_ids), list(item.prompt_ids)
    if isinstance(item, RequestSpec):
        if vocab_size is None:
            raise ValueError("a RequestSpec without explicit ids draws its prompt from the "
                             "model's vocabulary: pass vocab_size")
        prompt = item.token_ids(vocab_size)
        return prompt, prompt
    if hasattr(item, "prompt_token_ids") and hasattr(item, "token_ids"):
        prompt = list(item.prompt_token_ids)  # the last output token never goes through a step
        return prompt, prompt + list(item.token_ids)[:-1]
    if isinstance(item, Sequence) and all(isinstance(t, int) for t in item):
        return list(item), list(item)
    raise ValueError(f"expected a RequestSpec, a RequestOutput or a list of token ids, "
                     f"got {item!r:.80}")


def ideal_prefix_reuse(requests: Sequence[ReuseItem], block_size: int = 1, *,
                       vocab_size: int | None = None) -> PrefixReuse:
    """What a cache that never evicts could reuse, serving requests one after the other.

    Request i reuses the longest common prefix of its prompt with anything an earlier request
    computed, less its own last token (the step must compute that one to sample from it), rounded
    down to whole blocks of block_size tokens: the engine's rule, with no eviction and no two
    requests in flight at once. An item is a RequestSpec (vocab_size needed unless it carries
    its ids), a prompt as token ids, or a RequestOutput (a finished turn: its prompt and its
    answer but the last token stay cached, which is what multi-turn chat reuses).
    """
    check_int(block_size, "block_size")
    trie: dict[int, dict] = {}  # token -> the trie of what followed it
    prompt_tokens = queried_tokens = reusable = queried = 0
    for item in requests:
        prompt, left = _prompt_and_left(item, vocab_size)
        node, common = trie, 0
        while common < len(prompt) and prompt[common] in node:
            node, common = node[prompt[common]], common + 1
        blocks = min(common, len(prompt) - 1) // block_size
        prompt_tokens += len(prompt)
        queried_tokens += len(prompt) - 1
        reusable += blocks
        queried += (len(prompt) - 1) // block_size
        node = trie
        for token in left:
            node = node.setdefault(token, {})
    return PrefixReuse(prompt_tokens, reusable * block_size, queried_tokens, queried, reusable)


def shared_token_fraction(requests: Sequence[ReuseItem], block_size: int = 1, *,
                          vocab_size: int | None = None) -> float:
    """The share of prompt tokens an ideal cache reuses: ideal_prefix_reuse(...).fraction.

    With block_size 1 it is the share of tokens that are shared at all; a real cache of block
    size P reuses only whole blocks, so the ceiling falls as P grows.
    """
    return ideal_prefix_reuse(requests, block_size, vocab_size=vocab_size).fraction
