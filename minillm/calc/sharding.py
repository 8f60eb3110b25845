"""What each GPU of a tensor x pipeline parallel layout holds: its shard of the weights and of
the K/V, how many requests and KV blocks fit beside them. The layout itself is ParallelConfig
(vLLM's tensor_parallel_size and pipeline_parallel_size; how its TP groups all-reduce).

minillm.calc.parallel prices a step on such a layout and re-exports everything here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from minillm.calc.collectives import (
    ALL_REDUCE_ALGORITHMS,
    all_reduce_time,
    group_all_reduce_time,
)
from minillm.calc.hardware import Hardware, Link, get_hardware
from minillm.calc.models import ModelLike, as_config
from minillm.model_config import ModelConfig


@dataclass(frozen=True)
class ParallelConfig:
    """t x p GPUs: tensor_parallel_size GPUs share each layer, pipeline_parallel_size stages
    hold consecutive runs of layers; all_reduce: the TP group's all-reduce algorithm, one of
    minillm.collectives.ALL_REDUCE_ALGORITHMS ("ring", the default, "hierarchical", "nvls",
    "auto"). check(model) validates the layout against a model's shape."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    all_reduce: str = "ring"

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        tp = self.tensor_parallel_size
        if tp & (tp - 1):
            raise ValueError(f"tensor_parallel_size must be a power of two (1, 2, 4, 8, ...), "
                             f"got {tp}")
        if self.all_reduce not in ALL_REDUCE_ALGORITHMS:
            raise ValueError(f"all_reduce must be one of {ALL_REDUCE_ALGORITHMS}, "
                             f"got {self.all_reduce!r}")

    @property
    def world_size(self) -> int:
        """GPUs in the layout: tensor_parallel_size * pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def check(self, model: ModelLike) -> ParallelConfig:
        """self, if model splits this way; else ValueError naming the dimension that does not.
        TP must divide the query heads and the MLP width, and divide the KV heads or be a
        multiple of them (then each KV head is replicated, vLLM's rule); PP at most the layers."""
        c, tp, pp = as_config(model), self.tensor_parallel_size, self.pipeline_parallel_size
        K, problems = c.num_key_value_heads, []
        if c.num_attention_heads % tp:
            problems.append(f"num_attention_heads={c.num_attention_heads}")
        if c.intermediate_size % tp:
            problems.append(f"intermediate_size={c.intermediate_size}")
        if K % tp and tp % K:
            problems.append(f"num_key_value_heads={K} (neither divides the other)")
        if problems:
            raise ValueError(f"tensor_parallel_size={tp} does not split {', '.join(problems)}; "
                             "pick a TP that divides them")
        if pp > c.num_hidden_layers:
            raise ValueError(f"pipeline_parallel_size={pp} exceeds num_hidden_layers="
                             f"{c.num_hidden_layers}: a stage needs at least one layer")
        return self

    def stage_layers(self, model: ModelLike) -> tuple[int, ...]:
        """Layers of each stage: as even as possible, the first L mod p stages one more."""
        layers, pp = as_config(model).num_hidden_layers, self.pipeline_parallel_size
        return tuple(layers // pp + (stage < layers % pp) for stage in range(pp))

    def tensor_link(self, hw: Hardware | str) -> Link:
        """The link a TP group's all-reduce crosses: the node's, unless the group spans nodes
        (then the ring's slowest hop, the inter-node link, sets its pace)."""
        device = get_hardware(hw)
        inside = self.tensor_parallel_size <= device.gpus_per_node
        return device.intra_node_link if inside else device.inter_node_link

    def all_reduce_time(self, nbytes: float, hw: Hardware | str) -> float:
        """Seconds of one of the TP group's all-reduces of nbytes on hw, by self.all_reduce."""
        device, tp = get_hardware(hw), self.tensor_parallel_size
        if self.all_reduce == "ring":  # the module-level name, so a lab can stand in for it
            return all_reduce_time(nbytes, tp, self.tensor_link(device))
        return group_all_reduce_time(nbytes, tp, device.gpus_per_node, device.intra_node_link,
                                     device.inter_node_link, self.all_reduce)

    def boundary_link(self, hw: Hardware | str, stage: int) -> Link:
        """The link between stage and stage + 1 when GPUs fill nodes in order: the inter-node
        link if the two stages' GPUs sit on different nodes."""
        device, tp = get_hardware(hw), self.tensor_parallel_size
        last_gpu, next_gpu = (stage + 1) * tp - 1, (stage + 1) * tp
        same_node = last_gpu // device.gpus_per_node == next_gpu // device.gpus_per_node
        return device.intra_node_link if same_node else device.inter_node_link


# --- what each GPU holds --------------------------------------------------------------------


def kv_heads_per_gpu(model: ModelLike, tensor_parallel_size: int) -> int:
    """KV heads one GPU holds: K / t, or 1 when t > K (each KV head replicated t / K times, as
    vLLM does, so every query head finds its K and V on its own GPU)."""
    return max(as_config(model).num_key_value_heads // tensor_parallel_size, 1)


@dataclass(frozen=True)
class StageShape:
    """Per-GPU constants of one stage, in parameters and elements."""

    layers: int
    stored_params: int  # what the GPU holds: layers + embedding shard + lm_head shard + norms
    read_params: int  # what a step reads in full (an embedding shard is only gathered)
    matmul_params: int  # projection weights of the stage's layers: 2 FLOPs each per token
    head_params: int  # lm_head shard on the last stage: 2 FLOPs each per sampled row
    attn_flops_per_pair: int  # 4 * (H / t) * D * layers
    kv_elems_per_token: int  # 2 * layers * kv_heads_per_gpu * D


@lru_cache(maxsize=256)
def stage_shapes_of(c: ModelConfig, tp: int, pp: int) -> tuple[StageShape, ...]:
    E, H, D, F = c.hidden_size, c.num_attention_heads, c.head_dim, c.intermediate_size
    kv = kv_heads_per_gpu(c, tp)
    # q and o split by query heads, k and v by KV heads (or replicated), gate/up/down by F;
    # the two RMSNorm weights of a layer are replicated; o_proj's bias is kept whole on each GPU.
    matmul = 2 * E * (H // tp) * D + 2 * E * kv * D + 3 * E * (F // tp)
    layer = matmul + (H // tp + 2 * kv) * D * c.qkv_bias + E * c.o_bias + 2 * E
    # Vocab-parallel embedding and lm_head (vLLM's VocabParallelEmbedding / ParallelLMHead):
    # ceil(V / t) rows each, vLLM's padding of the vocabulary to a multiple of 64 left out.
    vocab_shard = math.ceil(c.vocab_size / tp) * E
    shapes = []
    for stage, layers in enumerate(ParallelConfig(tp, pp).stage_layers(c)):
        first, last = stage == 0, stage == pp - 1
        # A tied embedding is one table when one stage holds both ends; across stages the
        # first keeps a copy to gather from and the last one to multiply by.
        embed = vocab_shard if first and not (c.tie_word_embeddings and pp == 1) else 0
        head = vocab_shard + E if last else 0  # lm_head shard and the final norm
        shapes.append(StageShape(
            layers=layers, stored_params=layers * layer + embed + head,
            read_params=layers * layer + head, matmul_params=layers * matmul,
            head_params=vocab_shard if last else 0,
            attn_flops_per_pair=4 * (H // tp) * D * layers,
            kv_elems_per_token=2 * layers * kv * D))
    return tuple(shapes)


def stage_shapes(model: ModelLike, layout: ParallelConfig) -> tuple[StageShape, ...]:
    c = as_config(model)
    layout.check(c)
    return stage_shapes_of(c, layout.tensor_parallel_size, layout.pipeline_parallel_size)


def weight_bytes_per_gpu(model: ModelLike, layout: ParallelConfig,
                         dtype_bytes: float = 2) -> float:
    """Bytes of weights on the fullest GPU of the layout (the first or last stage, which hold
    the embedding or lm_head shard): what decides whether the layout fits."""
    return max(s.stored_params for s in stage_shapes(model, layout)) * dtype_bytes


def kv_bytes_per_token_per_gpu(model: ModelLike, layout: ParallelConfig,
                               kv_dtype_bytes: float = 2) -> float:
    """Bytes of K and V one token occupies on the fullest GPU: 2 * (its stage's layers) *
    kv_heads_per_gpu * D * kv_dtype_bytes."""
    return max(s.kv_elems_per_token for s in stage_shapes(model, layout)) * kv_dtype_bytes


def max_concurrency(model: ModelLike, hw: Hardware | str, layout: ParallelConfig, seq_len: int,
                    gpu_memory_utilization: float = 1.0, dtype_bytes: float = 2, *,
                    kv_dtype_bytes: float | None = None) -> int:
    """The KV wall of a layout: sequences of seq_len tokens that fit on every GPU at once, the
    minimum over stages of floor((memory * utilization - the stage's weights per GPU) / its KV
    bytes per sequence per GPU); 0 when the weights alone do not fit. As sizing.max_concurrency
    at t = p = 1."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], "
                         f"got {gpu_memory_utilization!r}")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    budget = get_hardware(hw).memory * gpu_memory_utilization
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    walls = [(budget - s.stored_params * dtype_bytes) // (s.kv_elems_per_token * kv_bytes
                                                          * seq_len)
             for s in stage_shapes(model, layout)]
    return max(int(min(walls)), 0)


def fits(model: ModelLike, hw: Hardware | str, layout: ParallelConfig, seq_len: int,
         batch: int = 1, dtype_bytes: float = 2, kv_dtype_bytes: float | None = None,
         gpu_memory_utilization: float = 1.0) -> bool:
    """Whether the weights and the K/V of batch sequences of seq_len tokens fit on every GPU."""
    return max_concurrency(model, hw, layout, seq_len, gpu_memory_utilization, dtype_bytes,
                           kv_dtype_bytes=kv_dtype_bytes) >= batch


def kv_block_bytes_per_gpu(model: ModelLike, layout: ParallelConfig, block_size: int,
                           kv_dtype_bytes: float = 2) -> float:
    """Bytes of one KV block on the fullest GPU. A block is logical: the same block id holds
    its tokens' K/V for each GPU's own layers and heads, so the group's pool has one size."""
    return kv_bytes_per_token_per_gpu(model, layout, kv_dtype_bytes) * block_size


def num_kv_blocks(model: ModelLike, hw: Hardware | str, layout: ParallelConfig,
                  block_size: int, dtype_bytes: float = 2, gpu_memory_utilization: float = 0.9,
                  kv_dtype_bytes: float | None = None) -> int:
    """KV blocks of the layout's pool: the minimum over stages of (utilization * memory less the
    stage's weights per GPU) // its block bytes per GPU (vLLM's rule, per GPU)."""
    device = get_hardware(hw)
    kv_bytes = dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    budget = device.memory * gpu_memory_utilization
    blocks = min((budget - s.stored_params * dtype_bytes)
                 // (s.kv_elems_per_token * kv_bytes * block_size)
                 for s in stage_shapes(model, layout))
    if blocks < 1:
        raise ValueError(
            f"the weights per GPU ({weight_bytes_per_gpu(model, layout, dtype_bytes) / 1e9:.1f} "
            f"GB at {dtype_bytes} bytes, tensor_parallel_size={layout.tensor_parallel_size}, "
            f"pipeline_parallel_size={layout.pipeline_parallel_size}) leave no room for KV "
            f"blocks in gpu_memory_utilization={gpu_memory_utilization} of {device.name}'s "
            f"{device.memory / 1e9:.1f} GB; raise tensor_parallel_size or pick a bigger GPU")
    return int(blocks)


# --- the cost of a step ---------------------------------------------------------------------
