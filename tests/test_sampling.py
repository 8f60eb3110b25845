"""Sampler and SamplingParams: validation, greedy, top-k / top-p masks, per-request seeds."""

import math

import pytest
import torch

from minillm.sampling import Sampler, SamplingParams, apply_top_k_top_p


@pytest.mark.parametrize("kwargs, name", [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": -3}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"),
    ({"logprobs": -1}, "logprobs"), ({"stop": ""}, "stop"), ({"stop": ["ok", ""]}, "stop"),
])
def test_bad_params_name_the_value(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_defaults_are_vllms():
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p) == (16, 1.0, 0, 1.0)
    assert SamplingParams(stop="x").stop_strings == ["x"] and p.stop_strings == []


def test_top_k_keeps_exactly_k_best():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(out).tolist() == [[False, True, False, True, False]]
    assert out[0, 1] == 3.0 and out[0, 3] == 2.0


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = lambda p: torch.isfinite(  # noqa: E731
        apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([p]))).tolist()[0]
    assert kept(0.5) == [True, False, False, False]
    assert kept(0.6) == [True, True, False, False]
    assert kept(0.8) == [True, True, False, False]
    assert kept(0.81) == [True, True, True, False]
    assert kept(1.0) == [True, True, True, True]
    assert kept(1e-6) == [True, False, False, False]  # the best token always survives


def test_rows_use_their_own_settings():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 2)
    out = apply_top_k_top_p(logits, torch.tensor([1, 0]), torch.tensor([1.0, 1.0]))
    assert torch.isfinite(out).sum(dim=1).tolist() == [1, 4]


def test_greedy_is_argmax_and_logprobs_are_the_models():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0, logprobs=3)] * 3
    res = Sampler()(logits, params, [None] * 3)
    assert res.token_ids == logits.argmax(-1).tolist()
    ref = logits.log_softmax(-1)
    for i, lp in enumerate(res.logprobs):
        top = ref[i].topk(3)
        assert set(lp) == set(top.indices.tolist())
        for t, v in lp.items():
            assert v == pytest.approx(ref[i, t].item(), abs=1e-6)


def test_seeded_sampling_is_reproducible_and_batch_independent():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=1.0, seed=7)

    def draw(rows):
        gens = [torch.Generator().manual_seed(7) for _ in rows]
        return [Sampler()(logits[rows], [p] * len(rows), gens).token_ids for _ in range(1)][0]

    alone = draw([2])
    in_batch = draw([0, 1, 2, 3])
    assert alone[0] == in_batch[2]


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.7, 0.2, 0.1])
    logits = probs.log()[None].repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    params = [SamplingParams(temperature=1.0)] * 4000
    counts = torch.bincount(torch.tensor(Sampler()(logits, params, [gen] * 4000).token_ids),
                            minlength=3)
    assert torch.allclose(counts / 4000, probs, atol=0.03)


def test_top_k_one_equals_greedy():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(3))
    gens = [torch.Generator().manual_seed(i) for i in range(5)]
    res = Sampler()(logits, [SamplingParams(temperature=0.8, top_k=1)] * 5, gens)
    assert res.token_ids == logits.argmax(-1).tolist()
