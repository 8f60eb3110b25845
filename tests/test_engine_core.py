"""The engine core in a process of its own (minillm.serve.engine_core, core_client): what it
streams is what LLM.generate returns, token for token and text for text, though the core never
detokenizes (the server's side does, and finds stop strings there); every block comes back;
a request the core refuses fails alone; a core that cannot start says why and leaves nothing
running; a core whose server dies goes with it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import pytest

from minillm import LLM, SamplingParams
from minillm.request import Request
from minillm.serve.core_client import EngineCoreClient

SETTINGS = dict(device="cpu", max_num_seqs=4, num_kv_blocks=48, max_num_batched_tokens=64,
                enable_prefix_caching=True)


@pytest.fixture(scope="module")
def reference():
    return LLM(**SETTINGS)


@pytest.fixture(scope="module")
def client():
    core = EngineCoreClient(**SETTINGS)
    core.start()
    yield core
    core.stop()


def serve(client, prompts, params):
    """Each prompt streamed through client at once; the last output of each, in order."""
    async def one(i, prompt, p):
        request_id = client.reserve_id("t", f"r{i}")
        req = client.make_request(prompt, p, request_id, time.perf_counter())
        last = None
        async for last in client.stream(req):  # noqa: B007 - the last is the finished one
            pass
        return last

    async def all_of_them():
        return await asyncio.gather(*(one(i, pr, p) for i, (pr, p) in
                                      enumerate(zip(prompts, params))))

    return asyncio.run(all_of_them())


def idle(client, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        stats = client.stats()
        if (stats["num_free_blocks"] == stats["num_blocks"] and not stats["num_running"]
                and not client._ids and not client._aborting):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def test_streams_match_generate_with_stops_logprobs_and_seeds(client, reference):
    prompts = ["ROMEO.\n", "JULIET.\nO Romeo", "KING.\n", "HAMLET.\nTo be", "DUKE.\n", "LEAR.\n",
               "PORTIA.\nThe quality", "BRUTUS.\n"]
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    free = reference.generate(prompts, greedy, use_tqdm=False)
    # Stop strings that the greedy text reaches mid-way, so the server's side must cut there.
    params = [
        SamplingParams(max_tokens=40, temperature=0, stop=[free[0].text[12:15]]),
        SamplingParams(max_tokens=40, temperature=0, stop=[free[1].text[20:22]], min_tokens=8),
        SamplingParams(max_tokens=30, temperature=0, logprobs=3, ignore_eos=True),
        SamplingParams(max_tokens=25, temperature=0.8, top_k=20, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=40, temperature=0.9, top_p=0.9, seed=11,
                       stop=[free[4].text[5:7]]),
        SamplingParams(max_tokens=1, temperature=0),
        SamplingParams(max_tokens=35, temperature=0, ignore_eos=True,
                       stop=["no such string in the play"]),
        SamplingParams(max_tokens=40, temperature=0, stop=[free[7].text[10:13], "\n\n"]),
    ]
    want = reference.generate(prompts, params, use_tqdm=False)
    got = serve(client, prompts, params)
    assert sum(w.finish_reason == "stop" for w in want) >= 3  # the stops really cut
    for w, g in zip(want, got):
        assert (g.text, g.token_ids, g.finish_reason) == (w.text, w.token_ids, w.finish_reason)
        assert g.finished and g.prompt_token_ids == w.prompt_token_ids
        if w.logprobs is not None:
            for lw, lg in zip(w.logprobs, g.logprobs, strict=True):
                assert lw.keys() == lg.keys()
                assert all(abs(lw[t] - lg[t]) < 1e-5 for t in lw)
        m = g.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        assert len(m.token_times) == len(g.token_ids)
    assert idle(client)  # the cores' blocks all free, every id released, no abort pending


def test_a_client_that_leaves_frees_its_blocks_in_the_core(client):
    async def leave_after(n):
        req = client.make_request("ROMEO.\n", SamplingParams(max_tokens=400, ignore_eos=True),
                                  client.reserve_id("t", "leaver"), time.perf_counter())
        outputs = client.stream(req)
        async for out in outputs:
            if len(out.token_ids) >= n:
                break
        await outputs.aclose()
        return "leaver" in client._ids  # held until the core confirms it dropped the request

    assert asyncio.run(leave_after(5))
    assert idle(client)


def test_a_request_the_core_refuses_fails_alone(client, reference):
    bad = Request("bad", [1, 2, 10**6], SamplingParams(max_tokens=4), time.perf_counter())
    client.reserve_id("t", "bad")

    async def both():
        async def last(req):
            out = None
            async for out in client.stream(req):  # noqa: B007 - the last is the finished one
                pass
            return out
        good = client.make_request("KING.\n", SamplingParams(max_tokens=8, temperature=0),
                                   client.reserve_id("t", "good"), time.perf_counter())
        return await asyncio.gather(last(bad), last(good))

    refused, fine = asyncio.run(both())
    assert refused.finish_reason == "error" and "outside the vocabulary" in refused.error
    assert fine.text == reference.generate("KING.\n", SamplingParams(max_tokens=8,
                                                                    temperature=0),
                                           use_tqdm=False)[0].text
    assert idle(client)


def test_a_core_that_cannot_start_says_why_and_is_gone(tmp_path):
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineCoreClient(device="cpu", max_num_seqs=0)
    with pytest.raises(OSError, match="does not exist"):
        EngineCoreClient(tmp_path / "nowhere", device="cpu")


def test_the_core_goes_when_its_server_dies():
    script = textwrap.dedent("""
        from minillm.serve.core_client import EngineCoreClient
        core = EngineCoreClient(device="cpu", num_kv_blocks=16)
        print(core.pid, flush=True)
        import time; time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        core_pid = int(parent.stdout.readline())
        os.kill(parent.pid, 9)
        parent.wait(10)
        deadline = time.monotonic() + 20
        while os.path.exists(f"/proc/{core_pid}") and time.monotonic() < deadline:
            with open(f"/proc/{core_pid}/stat") as f:  # a zombie has exited: it only waits
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        assert time.monotonic() < deadline, "the engine core outlived its server"
    finally:
        parent.kill()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_request_that_reaches_a_stopped_engine_ends_at_once(mode):
    # stream() checks that the engine is alive; an engine that stops right after that check
    # must still end the request's stream rather than leave it waiting forever.
    from minillm.serve.engine_client import EngineDead, Sink
    from minillm.serve.engine_loop import EngineLoop

    engine = (EngineLoop(LLM(device="cpu", num_kv_blocks=16)) if mode == "thread"
              else EngineCoreClient(device="cpu", num_kv_blocks=16))
    engine.start()
    engine.stop()

    async def late():
        req = engine.make_request("KING.\n", SamplingParams(max_tokens=2),
                                  engine.reserve_id("t"), time.perf_counter())
        sink = Sink(req, asyncio.Queue(), asyncio.get_running_loop())
        engine._submit(sink)
        return await asyncio.wait_for(sink.outputs.get(), 5), req.request_id

    item, request_id = asyncio.run(late())
    assert isinstance(item, EngineDead) and "shutting down" in str(item)
    assert request_id not in engine._ids
