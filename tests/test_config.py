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
