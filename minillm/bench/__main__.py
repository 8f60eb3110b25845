"""python -m minillm.bench engine | host | serve | simulate | kernels | gpu | prefix | preempt |
spec | quant | chapters: side-by-side figures, and the chapters run outside Jupyter."""

from __future__ import annotations

import argparse
import sys

import torch

from minillm import machine
from minillm.bench import (
    chapters,
    engine,
    gpu,
    host,
    kernels,
    preempt,
    prefix,
    quant,
    serve,
    simulate,
    spec,
    tiles,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    engine.add_arguments(sub.add_parser("engine", help=engine.__doc__.splitlines()[0]))
    host.add_arguments(sub.add_parser("host", help=host.__doc__.splitlines()[0]))
    kernels.add_arguments(sub.add_parser("kernels", help=kernels.__doc__.splitlines()[0]))
    gpu.add_arguments(sub.add_parser("gpu", help=gpu.__doc__.splitlines()[0]))
    serve.add_arguments(sub.add_parser("serve", help=serve.__doc__.splitlines()[0]))
    simulate.add_arguments(sub.add_parser("simulate", help=simulate.__doc__.splitlines()[0]))
    chapters.add_arguments(sub.add_parser("chapters", help=chapters.__doc__.splitlines()[0]))
    tiles.add_arguments(sub.add_parser("tiles", help=tiles.__doc__.splitlines()[0]))
    prefix.add_arguments(sub.add_parser("prefix", help=prefix.__doc__.splitlines()[0]))
    preempt.add_arguments(sub.add_parser("preempt", help=preempt.__doc__.splitlines()[0]))
    spec.add_arguments(sub.add_parser("spec", help=spec.__doc__.splitlines()[0]))
    quant.add_arguments(sub.add_parser("quant", help=quant.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    # Every CPU figure is timed: on a small shared CPU, torch's threads must not stall behind
    # another process's (machine.settle_threads). On a GPU this changes nothing.
    machine.settle_threads()
    if args.command == "engine":
        engine.main(args)
        return 0
    if args.command == "host":
        host.main(args)
        return 0
    if args.command == "serve":
        return serve.main(args)
    if args.command == "chapters":
        return chapters.main(args)
    if args.command == "tiles":
        return tiles.main(args)
    if args.command == "prefix":
        return prefix.main(args)
    if args.command == "preempt":
        return preempt.main(args)
    if args.command == "spec":
        return spec.main(args)
    if args.command == "quant":
        return quant.main(args)
    if args.command == "simulate":
        simulate.main(args)
        return 0
    if args.command in ("kernels", "gpu"):
        if not torch.cuda.is_available():
            print(f"`python -m minillm.bench {args.command}` needs CUDA: it measures "
                  "the Triton kernels on an NVIDIA GPU, and no CUDA device is visible here. "
                  "On a CPU, `python -m minillm.bench engine` runs.", file=sys.stderr)
            return 2
        return (kernels if args.command == "kernels" else gpu).main(args)
    print(f"`python -m minillm.bench {args.command}` is not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
