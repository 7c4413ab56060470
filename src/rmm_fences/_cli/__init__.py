# SPDX-License-Identifier: Apache-2.0
"""The ``rmm-fences`` command line (also ``python -m rmm_fences``): ``doctor`` and ``reduce``.
Each subcommand module holds HELP, add_arguments(parser) and run(args); the modules import
CuPy and rmm only when they run."""

from __future__ import annotations

import argparse
import sys

from rmm_fences._cli import doctor, reduce

#: name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS = {
    "doctor": (doctor.HELP, doctor.add_arguments, doctor.run),
    "reduce": (reduce.HELP, reduce.add_arguments, reduce.run),
}
DESCRIPTIONS = {
    name: module.DESCRIPTION for name, module in (("doctor", doctor), ("reduce", reduce))
}
#: name -> preflight(args): a problem found before the run starts (bad paths, a missing extra)
PREFLIGHTS = {"doctor": doctor.preflight}


def _version() -> str:
    from rmm_fences._version import __version__

    return __version__


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="rmm-fences",
        description="RMM resources that make freeing GPU memory safe without a host sync.",
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = top.add_subparsers(dest="command", required=True)
    for name, (help_, add_arguments, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_, description=DESCRIPTIONS.get(name)))
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from rmm_fences._cli._args import spec_error

    error = spec_error(args)
    if error:
        print(f"rmm-fences {args.command}: bad --resource: {error}", file=sys.stderr)
        return 2
    problem = PREFLIGHTS.get(args.command, lambda _: None)(args)
    if problem:
        print(f"rmm-fences {args.command}: {problem}", file=sys.stderr)
        return 2
    from rmm_fences._cuda import device_count, no_device_reason

    if device_count() == 0:
        print(
            f"rmm-fences {args.command}: {no_device_reason()}; this command needs a CUDA GPU.",
            file=sys.stderr,
        )
        return 2
    return COMMANDS[args.command][2](args)
