"""python -m minillm.bench engine | overhead | host | serve | servers | peers | simulate |
kernels | gpu | prefix | preempt | spec | quant | chapters: side-by-side figures, and the
chapters run outside Jupyter."""

from __future__ import annotations

import argparse
import sys

import torch

from minillm.bench import (
    chapters,
    engine,
    gpu,
    host,
    kernels,
    overhead,
    peers,
    preempt,
    prefix,
    quant,
    serve,
    servers,
    simulate,
    spec,
    tiles,
)
from minillm.calc import machine

# Each command is the module that runs it: add_arguments(parser) and main(args), which returns
# an exit status or, for engine and simulate, the figures it printed (then 0). Those that time
# the Triton kernels on an NVIDIA GPU need CUDA.
COMMANDS = {"engine": engine, "overhead": overhead, "host": host, "kernels": kernels, "gpu": gpu,
            "serve": serve, "servers": servers, "peers": peers, "simulate": simulate,
            "chapters": chapters, "tiles": tiles, "prefix": prefix, "preempt": preempt,
            "spec": spec, "quant": quant}
NEEDS_CUDA = {"kernels", "gpu"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    if args.command in NEEDS_CUDA and not torch.cuda.is_available():
        print(f"`python -m minillm.bench {args.command}` needs CUDA: it measures "
              "the Triton kernels on an NVIDIA GPU, and no CUDA device is visible here. "
              "On a CPU, `python -m minillm.bench engine` runs.", file=sys.stderr)
        return 2
    # Every CPU figure is timed: on a small shared CPU, torch's threads must not stall behind
    # another process's (machine.settle_threads). On a GPU this changes nothing.
    machine.settle_threads()
    status = COMMANDS[args.command].main(args)
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
