"""minillm serve with speculative decoding: the flags reach the engine, a stream says what a
plain engine says, and /metrics counts every token of a step that emitted several."""

import json

import pytest

from minillm import LLM, SamplingParams
from minillm.serve import start_server
from minillm.serve.prometheus import ServerMetrics

pytestmark = pytest.mark.ch10

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks?\n"


def test_console_script_passes_speculation_and_kv_dtype_to_the_engine(monkeypatch):
    from minillm.cli import main
    from minillm.serve.running import GracefulServer
    served = {}
    monkeypatch.setattr(GracefulServer, "run", lambda self: served.update(app=self.config.app))
    assert main(["serve", "--device", "cpu", "--port", "0", "--speculative-config",
                 json.dumps(NGRAM), "--kv-cache-dtype", "auto"]) == 0
    config = served["app"].state.server.engine.config
    assert config.speculative_config.method == "ngram"
    assert config.speculative_config.num_speculative_tokens == 4


@pytest.mark.parametrize("flag", ["{not json", "[1, 2]"])
def test_a_bad_speculative_config_flag_is_named(flag, capsys):
    from minillm.cli import main
    with pytest.raises(SystemExit):
        main(["serve", "--speculative-config", flag])
    assert "--speculative-config" in capsys.readouterr().err


def test_metrics_count_every_token_of_a_speculative_step():
    llm = LLM(device="cpu", num_kv_blocks=64, speculative_config=NGRAM)
    metrics = ServerMetrics(llm.engine, "m")
    engine = llm.engine
    engine.add_request(PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    while engine.has_unfinished_requests():
        metrics.on_step(engine.step())
    emitted = 40  # ignore_eos: max_tokens exactly
    text = metrics.exposition().decode()

    def value(name):
        line = next(x for x in text.splitlines() if x.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    stats = llm.stats()
    assert stats["spec_decode_num_accepted_tokens"] > 0  # some steps emitted several tokens
    assert value("vllm:generation_tokens_total") == emitted
    assert value("vllm:inter_token_latency_seconds_count") == emitted - 1
    assert value("vllm:spec_decode_num_accepted_tokens_total") == \
        stats["spec_decode_num_accepted_tokens"]
    assert value("vllm:spec_decode_num_drafts_total") == stats["spec_decode_num_drafts"]


def test_a_speculating_server_streams_what_a_plain_engine_generates():
    import openai

    plain = LLM(device="cpu", num_kv_blocks=64).generate(
        PROMPT, SamplingParams(max_tokens=32, temperature=0), use_tqdm=False)[0]
    with start_server(LLM(device="cpu", num_kv_blocks=64, speculative_config=NGRAM)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        stream = client.completions.create(model=server.model_name, prompt=PROMPT,
                                           max_tokens=32, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in stream if c.choices) == plain.text
