"""Sampling: the per-request parameters (params) and the batched sampler that turns logits into
tokens (sampler)."""

from minillm.sampling.params import MIN_TEMPERATURE, SEED_RANGE, SamplingParams, check_unicode
from minillm.sampling.sampler import (
    DeviceSample,
    Sampler,
    SampleResult,
    apply_top_k,
    apply_top_k_top_p,
    device_to_host,
    draw,
    exponential_race,
    filtered_probs,
    host_to_device,
    mask_eos_before_min_tokens,
    sampling_probs,
)

__all__ = ["MIN_TEMPERATURE", "SEED_RANGE", "SamplingParams", "check_unicode", "DeviceSample",
           "SampleResult", "Sampler", "apply_top_k", "apply_top_k_top_p", "device_to_host",
           "draw", "exponential_race", "filtered_probs", "host_to_device",
           "mask_eos_before_min_tokens", "sampling_probs"]
