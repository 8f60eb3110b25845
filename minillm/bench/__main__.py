"""python -m minillm.bench engine: figures measured side by side in one run."""

from __future__ import annotations

import argparse
import sys

from minillm.bench import engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    engine.add_arguments(sub.add_parser("engine", help=engine.__doc__.splitlines()[0]))
    for name in ("kernels", "gpu", "serve", "simulate"):
        sub.add_parser(name, help="not built yet")
    args = parser.parse_args(argv)
    if args.command == "engine":
        engine.main(args)
        return 0
    print(f"`python -m minillm.bench {args.command}` is not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
