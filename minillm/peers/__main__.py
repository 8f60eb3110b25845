"""python -m minillm.peers setup vllm [--folder DIR] | status: other engines on this machine.

`setup vllm` makes vLLM's CPU build a virtual environment of its own from the package index,
applies the workarounds it needs here (each said as it is made) and checks that it serves the
shipped model as minillm does; `status` says what is set up and where.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minillm.peers import vllm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help="set up a peer engine in its own environment")
    setup.add_argument("engine", choices=["vllm"])
    setup.add_argument("--folder", type=Path, default=None,
                       help=f"where (default: ${vllm.FOLDER_ENV}, else "
                            f"{vllm.default_folder()})")
    setup.add_argument("--no-check", action="store_true",
                       help="skip serving the shipped model once at the end")
    sub.add_parser("status", help="which peers are set up, and where")
    args = parser.parse_args(argv)
    if args.command == "status":
        folder = vllm.default_folder()
        print(f"vLLM ({vllm.PACKAGE} {vllm.VERSION}): set up in {folder}"
              if vllm.is_set_up(folder) else vllm.not_set_up(folder))
        return 0
    try:
        report = vllm.setup(args.folder, check=not args.no_check)
    except (RuntimeError, OSError) as e:
        print(f"python -m minillm.peers setup vllm: {e}", file=sys.stderr)
        return 1
    return 0 if report is None or report.matches_minillm else 1


if __name__ == "__main__":
    sys.exit(main())
