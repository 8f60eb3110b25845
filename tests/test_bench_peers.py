"""bench peers: minillm serve and vLLM serve side by side under both clients. Without vLLM it
says how to set it up; the command vLLM's client runs; the contenders' shared settings."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from minillm.bench import peers, peers_offline, servers
from minillm.bench.__main__ import main
from minillm.peers import vllm


def test_without_vllm_it_says_how_to_set_it_up(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(vllm.FOLDER_ENV, str(tmp_path / "none"))
    assert main(["peers"]) == 2
    assert vllm.SETUP_COMMAND in capsys.readouterr().out


def test_both_servers_get_the_same_scheduler_settings():
    found = peers.contenders(["auto", "float32"])
    assert [c.name for c in found] == ["minillm", "vLLM", "vLLM float32"]
    flags = dict(zip(peers.SHARED_FLAGS[::2], peers.SHARED_FLAGS[1::2]))
    assert flags["--block-size"] == "32"  # vLLM's CPU attention takes multiples of 32
    assert {"--max-num-seqs", "--max-num-batched-tokens", "--max-model-len"} <= set(flags)


def test_vllms_client_gets_the_loads_shape_and_its_json_is_read(monkeypatch):
    seen = {}

    def fake_run(command, **kwargs):
        seen["command"], seen["env"] = command, kwargs["env"]
        out = Path(command[command.index("--result-dir") + 1])
        (out / "result.json").write_text(json.dumps({"median_tpot_ms": 5.0, "failed": 0}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    closed = servers.loads(20, 8.0, 4, 64, 32, seed=3)[1]
    figures = peers.vllm_client()("http://127.0.0.1:9", closed)
    assert figures["median_tpot_ms"] == 5.0
    command = seen["command"]
    args = dict(zip(command[3:], command[4:]))
    assert command[1:3] == ["bench", "serve"]
    assert (args["--random-input-len"], args["--random-output-len"], args["--num-prompts"],
            args["--max-concurrency"], args["--seed"]) == ("64", "32", "20", "4", "3")
    assert "--ignore-eos" in command and args["--temperature"] == "0"
    assert args["--dataset-name"] == "random"
    goodput = command.index("--goodput")
    assert command[goodput + 1:goodput + 3] == ["ttft:500", "tpot:50"]  # vLLM's form, in ms
    assert seen["env"]["VLLM_TARGET_DEVICE"] == "cpu"


def test_a_profile_is_split_by_what_each_operator_does():
    found = {"wall_us": 10_000.0, "ops": {
        "aten::mm": 3000.0, "_C::onednn_mm": 1000.0,  # minillm's matmul, vLLM's
        "aten::_scaled_dot_product_flash_attention_for_cpu": 1000.0, "aten::index_select": 500.0,
        "_C::cpu_attention_with_kv_cache": 700.0, "_C::cpu_attn_reshape_and_cache": 100.0,
        "aten::mul": 400.0, "## Call CompiledFxGraph None ##": 300.0}}
    ms = peers_offline.split_profile(found)
    assert ms == pytest.approx({"matmuls": 4.0, "attention": 2.3, "other": 0.7, "between": 3.0,
                                "wall": 10.0})


def test_vllms_client_gets_the_shared_prefix_load_as_its_prefix_repetition_dataset(monkeypatch):
    seen = {}

    def fake_run(command, **kwargs):
        seen["command"] = command
        out = Path(command[command.index("--result-dir") + 1])
        (out / "result.json").write_text(json.dumps({"failed": 0}))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    shared = servers.loads(20, 8.0, 4, 64, 32, seed=3, prefixes=(256, 4))[-1]
    peers.vllm_client()("http://127.0.0.1:9", shared)
    args = dict(zip(seen["command"][3:], seen["command"][4:]))
    assert args["--dataset-name"] == "prefix_repetition"
    assert (args["--prefix-repetition-prefix-len"], args["--prefix-repetition-suffix-len"],
            args["--prefix-repetition-num-prefixes"], args["--prefix-repetition-output-len"]
            ) == ("256", "64", "4", "32")
    assert "--random-input-len" not in args
