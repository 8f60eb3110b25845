"""python -m minillm.bench serve: serving runs at increasing rates, the goodput curve and its knee.

With --base-url it measures any OpenAI-compatible server over HTTP (minillm.serve.client, as
vLLM's benchmark does: `minillm bench serve --base-url http://HOST:PORT`); without, it replays
the workload against the real engine in-process (minillm.serving). Both give a ServingResult.
The knee is the offered rate past which goodput stops rising. This module is the command line:
its flags, the workload they describe, the report and the result JSON; the sweep and its curve
are rate_sweep.py's (SweepResult, sweep).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from minillm.bench.rate_sweep import SweepResult as SweepResult
from minillm.bench.rate_sweep import sweep
from minillm.llm import LLM, default_model_path
from minillm.serve.serving import (
    DEFAULT_PERCENTILES,
    PERCENTILE_METRICS,
    ServingResult,
    format_slo,
    json_safe,
    parse_slo,
    run_serving,
)
from minillm.tokenizer import load_tokenizer
from minillm.workloads.streams import Length, Workload, poisson, shared_prefix


def _parse_length(text: str) -> Length:
    """'32' -> 32 tokens; '16:64' -> (16, 64), uniform."""
    lo, sep, hi = text.partition(":")
    try:
        return (int(lo), int(hi)) if sep else int(lo)
    except ValueError:
        raise ValueError(f"a length is N or LO:HI tokens, got {text!r}") from None


def _parse_rates(text: str) -> list[float]:
    try:
        return [float(r) for r in text.split(",")]
    except ValueError:
        raise ValueError(f"rates are requests/s like 1,2,4, got {text!r}") from None


def _parse_names(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(","))
        bad = [n for n in names if n not in choices]
        if bad:
            raise ValueError(f"unknown metric {bad[0]!r}; use some of {','.join(choices)}")
        return names
    return parse


def _parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        qs = tuple(float(q) for q in text.split(","))
    except ValueError:
        raise ValueError(f"percentiles are numbers like 50,90,99, got {text!r}") from None
    if not all(0 < q < 100 for q in qs):
        raise ValueError(f"percentiles must lie in (0, 100), got {text!r}")
    return qs


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """parse as an argparse type whose error message reaches the user."""
    def parse_arg(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """vLLM's `vllm bench serve` flags where they exist (older minillm spellings as aliases)."""
    add = parser.add_argument
    add("--base-url", default=None, help="measure this OpenAI-compatible server over HTTP, e.g. "
        "http://127.0.0.1:8000 (default: replay in-process on the engine, no HTTP)")
    add("--endpoint", default="/v1/completions", choices=["/v1/completions",
                                                          "/v1/chat/completions"])
    add("--model", default=None, help="HTTP: the served model name (default: ask /v1/models); "
        "in-process: the checkpoint folder (default: the shipped model)")
    add("--tokenizer", type=Path, default=None, help="the server's tokenizer folder, for vocab "
        "size and token counts (default: --model if a folder, else the shipped model)")
    add("--dataset-name", default="random", choices=["random", "shakespeare", "sharegpt"])
    add("--dataset-path", type=Path, default=None, help="ShareGPT JSON, or a prompt file")
    add("--num-prompts", "--num-requests", dest="num_prompts", type=int, default=40)
    add("--random-input-len", type=int, default=40)
    add("--random-output-len", type=int, default=20)
    add("--random-range-ratio", type=float, default=0.6,
        help="lengths uniform in [L(1-r), L(1+r)]")
    length = _arg(_parse_length)
    add("--prompt-len", type=length, default=None, help="tokens: N or LO:HI (overrides --random-*)")
    add("--output-len", type=length, default=None, help="tokens: N or LO:HI (overrides --random-*)")
    add("--sharegpt-output-len", type=int, default=None)
    add("--request-rate", type=float, default=math.inf, help="requests/s (inf: all at once)")
    add("--burstiness", type=float, default=1.0, help="gamma shape of the gaps; 1 = Poisson")
    add("--max-concurrency", "--concurrency", dest="max_concurrency", type=int, default=None,
        help="at most this many requests in flight (with rate inf: a closed loop)")
    add("--sweep-rates", "--rates", dest="sweep_rates", type=_arg(_parse_rates), default=None,
        help="offered rates in requests/s, e.g. 1,2,4,8: the goodput curve and its knee")
    add("--prefix-len", type=int, default=0,
        help="random prompts share a system prompt this long (with --num-prefixes of them)")
    add("--num-prefixes", type=int, default=1)
    add("--enable-prefix-caching", action="store_true", help="in-process engine only")
    add("--max-num-seqs", type=int, default=16, help="in-process engine only")
    add("--goodput", "--slo", dest="goodput", nargs="+", type=_arg(parse_slo), default=None,
        help="SLO bounds in ms, e.g. ttft:500 tpot:50 e2el:2000 (also itl)")
    add("--percentile-metrics", type=_arg(_parse_names(PERCENTILE_METRICS)),
        default=("ttft", "tpot", "itl"), help="of ttft,tpot,itl,e2el")
    add("--metric-percentiles", type=_arg(_parse_percentiles), default=(99.0,),
        help="e.g. 50,90,99")
    add("--num-warmups", type=int, default=2, help="requests run first, left out of the figures")
    add("--result-json", type=Path, default=None, help="write vLLM's result keys and records")
    add("--plot", type=Path, default=None, help="save the goodput curve here (a sweep)")
    add("--disable-tqdm", action="store_true")
    add("--seed", type=int, default=0)


def _workload_maker(args: argparse.Namespace, tokenizer: Any) -> Callable[[float], Workload]:
    """make_workload(rate) for the arguments: the data set at that rate, closed loop when
    --max-concurrency comes with rate inf in-process (where the engine has no semaphore)."""
    from minillm.serve.datasets import length_range, load_dataset  # the server's imports: lazy

    prompt = args.prompt_len or length_range(args.random_input_len, args.random_range_ratio)
    output = args.output_len or length_range(args.random_output_len, args.random_range_ratio)

    def make(rate: float) -> Workload:
        if args.dataset_name == "random" and args.prefix_len:
            w = shared_prefix(args.num_prompts, rate, args.prefix_len, args.num_prefixes,
                              prompt, output, args.seed)
        elif args.dataset_name == "random":
            w = poisson(args.num_prompts, rate, prompt, output, args.seed, args.burstiness)
        else:
            w = load_dataset(args.dataset_name, args.num_prompts, tokenizer=tokenizer,
                             dataset_path=args.dataset_path, output_len=args.random_output_len,
                             range_ratio=args.random_range_ratio, rate=rate,
                             burstiness=args.burstiness, seed=args.seed,
                             sharegpt_output_len=args.sharegpt_output_len)
        if args.base_url is None and args.max_concurrency is not None:
            if rate != math.inf:
                raise SystemExit("in-process, --max-concurrency runs a closed loop: use it with "
                                 "--request-rate inf, or measure a server with --base-url")
            w = Workload(list(w), concurrency=args.max_concurrency)
        return w
    return make


def main(args: argparse.Namespace) -> int:
    slo = {k: v for item in args.goodput or [] for k, v in item.items()} or None
    rates = args.sweep_rates or [args.request_rate]
    if len(rates) > 1 and slo is None:
        slo = parse_slo("ttft:500,tpot:50")
        print(f"a sweep judges goodput against an SLO: using {format_slo(slo)} (--goodput)")
    if args.base_url is None:
        model = Path(args.model) if args.model else default_model_path()
        llm: LLM | None = LLM(model, max_num_seqs=args.max_num_seqs,
                              enable_prefix_caching=args.enable_prefix_caching)
        tokenizer = llm.tokenizer
        print(f"in-process: model {model.name} on {llm.engine.device} "
              f"({torch.get_num_threads()} threads), max_num_seqs {args.max_num_seqs}, "
              f"prefix caching {'on' if args.enable_prefix_caching else 'off'}")
    else:
        llm = None
        folder = args.tokenizer or (Path(args.model) if args.model and Path(args.model).is_dir()
                                    else default_model_path())
        tokenizer = load_tokenizer(folder)
    make_workload = _workload_maker(args, tokenizer)
    client_args = dict(model=args.model, tokenizer=tokenizer,
                       max_concurrency=args.max_concurrency, num_warmups=args.num_warmups,
                       progress=not args.disable_tqdm, endpoint=args.endpoint)
    if args.max_concurrency is not None:
        print(f"maximum request concurrency: {args.max_concurrency}")
    if len(rates) == 1:
        result = _run_once(llm, args, make_workload(rates[0]), slo, client_args)
        print(result.report(args.metric_percentiles, args.percentile_metrics))
        if args.result_json is not None:
            result.save_json(args.result_json, _json_percentiles(args), **_run_info(args, rates[0]))
            print(f"results written to {args.result_json}")
        if args.plot is not None:
            print("--plot draws a rate sweep: give two or more --sweep-rates", file=sys.stderr)
        return 0
    target = llm if llm is not None else args.base_url
    sweep_result = sweep(target, rates, make_workload, slo or {},
                         progress=not args.disable_tqdm,
                         **({} if llm is not None else
                            {k: v for k, v in client_args.items() if k != "progress"}))
    print(sweep_result.table())
    if args.result_json is not None:
        runs = [r.result_json(_json_percentiles(args)) for r in sweep_result.results]
        args.result_json.write_text(json.dumps(json_safe(
            {**_run_info(args, None), "rates": sweep_result.rates, "knee": sweep_result.knee,
             "goodput": sweep_result.goodput, "runs": runs}), indent=1))
        print(f"results written to {args.result_json}")
    if args.plot is not None and sweep_result.plot(args.plot) is not None:
        print(f"goodput curve saved to {args.plot}")
    return 0


def _run_once(llm: LLM | None, args: argparse.Namespace, workload: Workload,
              slo: dict[str, float] | None, client_args: dict[str, Any]) -> ServingResult:
    if llm is not None:
        return run_serving(llm, workload, slo, warmup=args.num_warmups > 0)
    from minillm.serve.client import benchmark

    return benchmark(args.base_url, workload, slo=slo, **client_args)


def _json_percentiles(args: argparse.Namespace) -> tuple[float, ...]:
    """The result JSON holds p50, p90, p95, p99 and whatever --metric-percentiles adds."""
    return tuple(sorted({*DEFAULT_PERCENTILES, *args.metric_percentiles}))


def _run_info(args: argparse.Namespace, rate: float | None) -> dict[str, Any]:
    """The run's settings under vLLM's result-JSON names."""
    return {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai",
            "base_url": args.base_url, "model_id": args.model,
            "tokenizer_id": str(args.tokenizer) if args.tokenizer else None,
            "dataset_name": args.dataset_name, "num_prompts": args.num_prompts,
            "request_rate": "inf" if rate == math.inf else rate, "burstiness": args.burstiness,
            "max_concurrency": args.max_concurrency, "seed": args.seed}
