"""EngineConfig validation: every bad value is named in the error."""

import pytest

from minillm.config import EngineConfig


@pytest.mark.parametrize("kwargs, name", [
    ({"block_size": 3}, "block_size"), ({"block_size": 0}, "block_size"),
    ({"block_size": 12}, "block_size"), ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"scheduling": "fifo"}, "scheduling"), ({"attention_backend": "cuda"}, "attention_backend"),
    ({"num_kv_blocks": 0}, "num_kv_blocks"), ({"gpu_memory_utilization": 0}, "gpu_memory"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory"), ({"max_model_len": 0}, "max_model_len"),
])
def test_bad_values_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        EngineConfig(**kwargs)


@pytest.mark.parametrize("block_size", [1, 2, 16, 128])
def test_powers_of_two_are_fine(block_size):
    assert EngineConfig(block_size=block_size).block_size == block_size


def test_every_choice_field_takes_exactly_its_literal_values():
    """The Literal types are the one list of each choice: every value they name is accepted,
    anything else is refused with the field, its choices and the value."""
    import dataclasses
    import typing

    from minillm.config import literal_choices

    hints = typing.get_type_hints(EngineConfig)
    choice_fields = {f.name: literal_choices(hints[f.name])
                     for f in dataclasses.fields(EngineConfig)
                     if literal_choices(hints[f.name]) is not None}
    assert set(choice_fields) == {
        "scheduling", "attention_backend", "prefix_caching", "scheduling_policy",
        "preemption_mode", "priority_preemption", "quantization", "kv_cache_dtype"}
    assert choice_fields["quantization"] == (None, "int8")
    needs = {"prefix_caching": {"enable_prefix_caching": True},
             "scheduling_policy": {"enable_prefix_caching": True},
             "priority_preemption": {"scheduling_policy": "priority"}}
    for name, choices in choice_fields.items():
        for value in choices:
            assert getattr(EngineConfig(**{name: value}, **needs.get(name, {})), name) == value
        with pytest.raises(ValueError, match=f"{name} must be .*'{choices[-1]}'.*got 'bogus'"):
            EngineConfig(**{name: "bogus"})
