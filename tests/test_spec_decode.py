"""Speculative decoding in the engine: lossless (greedy and sampled), leak-free, counted.

Greedy runs of the shipped model must give the very tokens of a plain run, whatever the
proposer and whatever else the engine does meanwhile (chunked prefill, prefix caching,
preemption by recompute or swap). Sampled runs of a tiny random model with an 8-token vocabulary
must keep the target's distribution: a chi-square test over thousands of samples, which a
deliberately wrong acceptance rule fails.
"""

from __future__ import annotations

import pytest

from minillm import LLM, EngineConfig, ModelConfig, SamplingParams
from minillm.engine import Engine
from minillm.llm import default_draft_path, default_model_path
from minillm.model import LlamaForCausalLM
from minillm.serve.datasets import shakespeare_passages
from minillm.spec import lossless, rejection
from minillm.spec.config import SpeculativeConfig

pytestmark = pytest.mark.ch10

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


def draft_config(k: int = 4) -> dict:
    """The shipped draft if it is there; else the target drafts for itself (all accepted)."""
    path = default_draft_path() if default_draft_path().is_dir() else default_model_path()
    return {"model": str(path), "num_speculative_tokens": k}


def prompts() -> list[str]:
    """Shakespeare passages, two sharing a long prefix (prefix caching has something to hit)."""
    passages = shakespeare_passages()[:4]
    return passages + [passages[0] + "\nOPHELIA.\n"]


def run(spec: dict | None, params: SamplingParams, **engine_args: object) -> LLM:
    llm = LLM(speculative_config=spec, max_num_seqs=8, **engine_args)
    llm.outputs = llm.generate(prompts(), params, use_tqdm=False)
    return llm


GREEDY = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
SETTINGS = {  # name: engine args; each squeezes the pool so that requests get preempted
    "chunked+hash+recompute": dict(num_kv_blocks=24, max_num_batched_tokens=32,
                                   enable_prefix_caching=True),
    "radix+swap": dict(num_kv_blocks=24, max_num_batched_tokens=64, enable_prefix_caching=True,
                       prefix_caching="radix", preemption_mode="swap", swap_space=0.01),
    "no chunking+recompute": dict(num_kv_blocks=24, enable_chunked_prefill=False,
                                  max_num_batched_tokens=512),
}


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_greedy_outputs_are_identical_with_speculation_over_a_quantized_pool(kv_cache_dtype):
    """A token's quantized K/V depend on it alone (static scales), so a verification forward
    stores what plain decode steps store, and the greedy tokens still match."""
    plain = run(None, GREEDY, num_kv_blocks=256, kv_cache_dtype=kv_cache_dtype).outputs
    llm = run(NGRAM, GREEDY, num_kv_blocks=24, kv_cache_dtype=kv_cache_dtype,
              max_num_batched_tokens=32, enable_prefix_caching=True)
    assert [o.token_ids for o in llm.outputs] == [o.token_ids for o in plain]
    assert llm.stats()["num_preemptions"] > 0 and llm.stats()["num_free_blocks"] == 24


@pytest.fixture(scope="module")
def plain() -> list[list[int]]:
    return [o.token_ids for o in run(None, GREEDY, num_kv_blocks=256).outputs]


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_outputs_are_identical_with_speculation(plain, method, setting):
    spec = NGRAM if method == "ngram" else draft_config()
    llm = run(spec, GREEDY, **SETTINGS[setting])
    assert [o.token_ids for o in llm.outputs] == plain
    stats = llm.stats()
    assert stats["num_preemptions"] > 0, "the setting should squeeze the pool"
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert stats["num_free_blocks"] == stats["num_blocks"], "a KV block leaked"
    assert stats["num_swapped"] == 0 and stats["num_running"] == 0


def test_speculation_takes_fewer_steps_and_counts_what_it_did():
    llm = run(NGRAM, GREEDY, num_kv_blocks=256)
    stats, trace = llm.stats(), llm.trace
    assert stats["spec_decode_num_draft_tokens"] == sum(r.num_draft_tokens for r in trace)
    assert stats["spec_decode_num_accepted_tokens"] == sum(r.num_accepted_tokens for r in trace)
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    # every token is a sampled row's: one per verification plus the accepted proposals
    produced = sum(len(o.token_ids) for o in llm.outputs)
    decode_rows = sum(1 for r in trace for e in r.scheduled if e.phase == "decode")
    assert produced == decode_rows + len(llm.outputs) + stats["spec_decode_num_accepted_tokens"]
    plain_steps = len(run(None, GREEDY, num_kv_blocks=256).trace)
    assert len(trace) < plain_steps
    # a decode entry is its last token plus its proposals, never more than 1 + k
    assert max(e.num_tokens for r in trace for e in r.scheduled if e.phase == "decode") <= 5


def test_a_draft_equal_to_the_target_is_always_accepted():
    spec = {"model": str(default_model_path()), "num_speculative_tokens": 3}
    sampled = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=1)
    stats = run(spec, sampled, num_kv_blocks=256).stats()
    assert stats["spec_decode_num_accepted_tokens"] == stats["spec_decode_num_draft_tokens"] > 0


def test_stops_logprobs_and_lengths_match_a_plain_run():
    params = SamplingParams(max_tokens=40, temperature=0, stop=["\n\n"], logprobs=2)
    plain = run(None, params, num_kv_blocks=256).outputs
    spec = run(NGRAM, params, num_kv_blocks=256).outputs
    for a, b in zip(plain, spec):
        assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason)
        assert len(a.logprobs) == len(b.logprobs) == len(a.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys()
            assert all(abs(x[t] - y[t]) < 1e-3 for t in x)


# ---- the sampled distribution (minillm.spec.lossless: a tiny random model, 8 tokens) ---------

NUM_SAMPLES = 3000


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_sampled_outputs_keep_the_target_distribution(method):
    engine = lossless.tiny_engine(method)
    counts = lossless.sample_pairs(engine, NUM_SAMPLES)
    stats = engine.stats()
    accepted = stats["spec_decode_num_accepted_tokens"]
    drafted = stats["spec_decode_num_draft_tokens"]
    assert drafted >= NUM_SAMPLES // 10 and 0 < accepted < drafted  # both branches ran
    exact = lossless.exact_pairs()
    assert not lossless.chi_square(counts, exact).rejects
    # and it has the power to see a 5% shift of the mass
    assert lossless.chi_square(counts, lossless.shift_mass(exact, 0.05)).rejects


def test_the_test_catches_a_biased_acceptance_rule(monkeypatch):
    """Accepting every proposal (the proposer's choices leak into the output) must fail."""
    real = rejection.verify

    def accept_all(logits, proposals, draft_probs, params, generators):
        emitted = real(logits, proposals, draft_probs, params, generators)
        return [d + e[len(d):][:1] if d else e for d, e in zip(proposals, emitted)]

    monkeypatch.setattr("minillm.spec.decoder.verify", accept_all)
    counts = lossless.sample_pairs(lossless.tiny_engine("ngram"), NUM_SAMPLES)
    assert lossless.chi_square(counts, lossless.exact_pairs()).rejects


# ---- settings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "'medusa'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4}, "exceeds"),
    ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "typo"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
    ({"model": "/no/such/folder", "num_speculative_tokens": 2}, "does not exist"),
])
def test_bad_speculative_configs_are_named(spec, message):
    with pytest.raises((ValueError, OSError), match=message):
        EngineConfig(speculative_config=spec)


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    other = LlamaForCausalLM.random(ModelConfig(**{**lossless.TINY.__dict__, "vocab_size": 16}))
    config = EngineConfig(num_kv_blocks=64, max_model_len=64, speculative_config=SpeculativeConfig(
        "draft_model", num_speculative_tokens=2, model=str(tmp_path)))
    with pytest.raises(ValueError, match="vocabulary"):
        Engine(lossless.tiny_random_model(0), None, config, draft_model=other)


def test_the_triton_backend_verifies_as_the_reference_does():
    """The verification forward runs through the extend kernel (decode rows of 1 + k tokens)."""
    shape = ModelConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, max_position_embeddings=128)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    plain = LLM(shape, num_kv_blocks=16, attention_backend="torch")
    spec = LLM(shape, num_kv_blocks=16, attention_backend="triton", speculative_config=NGRAM)
    want = plain.generate([prompt], params, use_tqdm=False)[0].token_ids
    assert spec.generate([prompt], params, use_tqdm=False)[0].token_ids == want
    assert spec.stats()["spec_decode_num_draft_tokens"] > 0
