"""The `minillm` console script: `minillm serve ...` and `minillm bench ...`."""

from __future__ import annotations

import sys

USAGE = """usage: minillm serve [MODEL] [--port 8000] [engine flags]   an OpenAI-compatible server
       minillm bench {engine,serve,simulate,prefix,preempt,spec,quant,kernels,gpu,chapters} ...
                                                   side-by-side figures
Run `minillm serve --help` or `minillm bench --help` for the flags."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "serve":
        from minillm.serve.__main__ import main as serve
        return serve(args[1:])
    if args and args[0] == "bench":
        from minillm.bench.__main__ import main as bench
        return bench(args[1:])
    print(USAGE, file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
    return 0 if args and args[0] in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
