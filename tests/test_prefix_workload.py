"""Prefix-sharing workloads (minillm.prefix_workload): their shapes, that what should be shared
is shared token for token, reproducibility, and the ideal-reuse ceiling, checked by hand on
small cases and against the engine's and the simulator's own prefix-cache counters."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from minillm import LLM, default_model_path
from minillm.model_config import ModelConfig
from minillm.request import RequestOutput
from minillm.sampling import SamplingParams
from minillm.serve.conversations import run_conversations
from minillm.sim.simulator import simulate
from minillm.workloads.prefixes import (
    Conversation,
    TokenRequestSpec,
    ideal_prefix_reuse,
    in_issue_order,
    multi_turn,
    shared_prefix,
    shared_token_fraction,
)
from minillm.workloads.streams import RequestSpec

V = ModelConfig.from_pretrained(default_model_path()).vocab_size


def test_shared_prefix_shapes_lengths_and_sharing() -> None:
    work = shared_prefix(60, 3, 32, (4, 12), (2, 6), vocab_size=V, seed=5)
    assert len(work) == 60 and all(s.arrival_time == 0.0 for s in work)  # rate inf: a burst
    prefixes = {}
    for spec in work:
        ids = spec.token_ids(V)
        assert len(ids) == spec.prompt_len and 32 + 4 <= spec.prompt_len <= 32 + 12
        assert 2 <= spec.output_len <= 6 and all(1 <= t < V for t in ids)
        assert spec.prefix_len == 32
        prefixes.setdefault(spec.prefix_id, ids[:32])
        assert ids[:32] == prefixes[spec.prefix_id]  # same prefix id: same tokens
    assert sorted(prefixes) == [0, 1, 2]
    assert len({tuple(p) for p in prefixes.values()}) == 3  # and different ids differ
    # Questions are the requests' own: no two share their first suffix block.
    assert len({tuple(s.token_ids(V)[32:36]) for s in work}) == 60


def test_shared_prefix_is_reproducible_and_prefixes_do_not_depend_on_the_count() -> None:
    a = shared_prefix(20, 2, 16, 8, 4, rate=5.0, vocab_size=V, seed=3)
    b = shared_prefix(20, 2, 16, 8, 4, rate=5.0, vocab_size=V, seed=3)
    c = shared_prefix(20, 2, 16, 8, 4, rate=5.0, vocab_size=V, seed=4)
    assert [s.token_ids(V) for s in a] == [s.token_ids(V) for s in b]
    assert [s.arrival_time for s in a] == [s.arrival_time for s in b]
    assert [s.token_ids(V) for s in a] != [s.token_ids(V) for s in c]
    longer = shared_prefix(50, 2, 16, 8, 4, vocab_size=V, seed=3)
    first = {s.prefix_id: s.token_ids(V)[:16] for s in a}
    assert all(s.token_ids(V)[:16] == first[s.prefix_id] for s in longer)
    times = [s.arrival_time for s in a]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0


def test_zipf_makes_the_first_prefix_hot_and_zero_is_uniform() -> None:
    # Weights 1, 1/8, 1/27, 1/64 give prefix 0 a probability of 0.85 at zipf=3.
    skewed = Counter(s.prefix_id for s in shared_prefix(400, 4, 8, 2, 1, vocab_size=V, zipf=3))
    assert 0.78 <= skewed[0] / 400 <= 0.92 and skewed[0] > skewed[1] > skewed[3]
    uniform = Counter(s.prefix_id for s in shared_prefix(400, 4, 8, 2, 1, vocab_size=V))
    assert all(70 <= uniform[k] <= 130 for k in range(4))  # 100 each, +-3 standard deviations


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match="zipf"):
        shared_prefix(4, 2, 8, 2, 1, vocab_size=V, zipf=-1)
    with pytest.raises(ValueError, match="vocab_size"):
        shared_prefix(4, 2, 8, 2, 1, vocab_size=1)
    with pytest.raises(ValueError, match="num_prefixes"):
        shared_prefix(4, 0, 8, 2, 1, vocab_size=V)
    with pytest.raises(ValueError, match="prompt_len=3"):
        TokenRequestSpec(0.0, 3, 1, prompt_ids=(1, 2))
    spec = TokenRequestSpec(0.0, 2, 1, prompt_ids=(1, 500))
    with pytest.raises(ValueError, match="vocab_size=100"):
        spec.token_ids(100)
    with pytest.raises(ValueError, match="pass vocab_size"):
        shared_token_fraction([RequestSpec(0.0, 8, 1, seed=1)])
    with pytest.raises(ValueError, match="list of token ids"):
        shared_token_fraction(["not tokens"])  # type: ignore[list-item]


def test_shared_token_fraction_by_hand() -> None:
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [1, 2, 3, 4, 5, 6, 7], [8, 8]]
    # LCPs with anything earlier: 0; 4 (1 2 3 4); 6 (the whole first prompt); 0. The ceiling
    # leaves each prompt's last token to compute: min(4, 5) + min(6, 6) = 10 of 21 tokens.
    assert shared_token_fraction(prompts) == pytest.approx(10 / 21)
    # In blocks of 4: 1 block of the second, 1 of the third (tokens 4..5 are a partial block).
    reuse = ideal_prefix_reuse(prompts, block_size=4)
    assert (reuse.reusable_tokens, reuse.reusable_blocks) == (8, 2)
    assert reuse.queried_blocks == 1 + 1 + 1 + 0  # (len - 1) // 4 each
    assert reuse.fraction == pytest.approx(8 / 21) and reuse.block_hit_rate == pytest.approx(2 / 3)
    assert reuse.queried_tokens == 21 - 4 and reuse.token_hit_rate == pytest.approx(8 / 17)
    # A finished turn leaves its answer cached too (all but its last token).
    turn = RequestOutput("0", None, [1, 2, 3], "", [7, 7, 7], "length", None, None, True)
    follow_up = [1, 2, 3, 7, 7, 7, 5]
    assert ideal_prefix_reuse([turn, follow_up]).reusable_tokens == 5  # 1 2 3 7 7
    assert math.isnan(shared_token_fraction([]))


@pytest.mark.parametrize("design", ["hash", "radix"])
def test_the_ceiling_is_what_the_simulator_hits_when_requests_never_overlap(design: str) -> None:
    # 2 requests/s against millisecond requests: each is done before the next, and the pool
    # (512 blocks) keeps everything, so either cache design reaches the ideal exactly.
    work = shared_prefix(30, 3, 64, (5, 40), 4, rate=2.0, vocab_size=V, seed=2)
    stats = simulate(ModelConfig.from_pretrained(default_model_path()), "H100-SXM", work,
                     block_size=8, num_kv_blocks=512, enable_prefix_caching=True,
                     prefix_caching=design).stats
    ideal = ideal_prefix_reuse(work, block_size=8)
    assert stats["prefix_cache_hits"] == ideal.reusable_blocks > 0
    assert stats["prefix_cache_queries"] == ideal.queried_blocks
    assert stats["prefix_cache_hit_tokens"] == ideal.reusable_tokens
    assert stats["prefix_cache_query_tokens"] == ideal.queried_tokens


def test_multi_turn_conversations_build_each_prompt_from_the_answers() -> None:
    chats = multi_turn(3, 4, (10, 20), (3, 6), (2, 5), vocab_size=V, seed=1)
    assert chats == multi_turn(3, 4, (10, 20), (3, 6), (2, 5), vocab_size=V, seed=1)
    for chat in chats:
        assert chat.num_turns == 4 and len(chat.output_lens) == 4
        assert 10 <= len(chat.first_prompt) <= 20
        assert all(3 <= len(u) <= 6 for u in chat.user_turns)
    with_system = multi_turn(3, 2, 10, 3, 2, vocab_size=V, system_prompt_len=24, seed=1)
    assert len({c.first_prompt[:24] for c in with_system}) == 1  # one system prompt for all
    assert len({c.first_prompt[24:] for c in with_system}) == 3  # and each its own message
    assert all(len(c.first_prompt) == 34 for c in with_system)
    chat = Conversation((1, 2), ((3,), (4, 4)), (1, 1, 1))
    assert chat.prompt(0, []) == [1, 2]
    assert chat.prompt(2, [[9], [8, 8]]) == [1, 2, 9, 3, 8, 8, 4, 4]
    with pytest.raises(ValueError, match="needs the 2 answers"):
        chat.prompt(2, [[9]])
    with pytest.raises(ValueError, match="output_lens"):
        Conversation((1,), ((2,),), (1,))


class EchoLLM:
    """A stand-in LLM: answers with the prompt's last tokens reversed; records each call."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]
                 ) -> list[RequestOutput]:
        self.calls.append(prompts)
        return [RequestOutput(str(i), None, p, "", p[::-1][:sp.max_tokens], "length", None,
                              None, True) for i, (p, sp) in enumerate(zip(prompts, params))]


def test_run_conversations_interleaves_turns_and_feeds_back_the_actual_answers() -> None:
    chats = [Conversation((1, 2, 3), ((4,), (5,)), (2, 2, 2)), Conversation((6,), (), (1,))]
    llm = EchoLLM()
    out = run_conversations(llm, chats)
    # Round 0 holds both chats' first turns; later rounds only the chat that goes on.
    assert llm.calls == [[[1, 2, 3], [6]],
                         [[1, 2, 3, 3, 2, 4]],
                         [[1, 2, 3, 3, 2, 4, 4, 2, 5]]]
    assert [len(turns) for turns in out] == [3, 1]
    assert in_issue_order(out) == [out[0][0], out[1][0], out[0][1], out[0][2]]
    assert out[0][1].token_ids == [4, 2]


@pytest.mark.parametrize("design", ["hash", "radix"])
def test_multi_turn_reuse_in_the_engine_equals_the_ideal_in_blocks(design: str) -> None:
    # Each follow-up reuses its chat's earlier prompt and answer; nothing is evicted in a pool
    # of 256 blocks, and chats share nothing with each other, so hits are exactly the ideal's.
    chats = multi_turn(3, 3, (20, 40), (4, 10), (5, 12), vocab_size=V, seed=0)
    llm = LLM(device="cpu", dtype="float32", block_size=4, num_kv_blocks=256,
              enable_prefix_caching=True, prefix_caching=design)
    out = run_conversations(llm, chats)
    issued = in_issue_order(out)
    assert [o.prompt_token_ids for o in issued[:3]] == [list(c.first_prompt) for c in chats]
    ideal = ideal_prefix_reuse(issued, block_size=4)
    stats = llm.stats()
    assert stats["prefix_cache_hits"] == ideal.reusable_blocks > 0
    assert stats["prefix_cache_queries"] == ideal.queried_blocks
    assert stats["prefix_cache_hit_tokens"] == ideal.reusable_tokens
    # Turn 1 of chat 0 carries turn 0's whole prompt and answer.
    first, second = out[0][0], out[0][1]
    assert second.prompt_token_ids[:len(first.prompt_token_ids) + len(first.token_ids)] == \
        first.prompt_token_ids + first.token_ids
