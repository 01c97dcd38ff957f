"""psflow.parse_flags: psflow's flags (parsed by psflow's C++ flag code) and the script's own
argparse flags, in one namespace.

    parser = argparse.ArgumentParser(description="char GRU")
    parser.add_argument("--seq_len", type=int, default=64)
    flags = psflow.parse_flags(parser, defaults={"batch_size": 32})
    flags.seq_len, flags.batch_size, flags.sync_replicas      # the script's and psflow's

Ownership: psflow's flags are the psflow.Flags object's own attributes (one per row of the flag
table, src/train/flags.cc; the layering of psflow/cli/flags.h); the arguments psflow does not
know go to the script's parser, whose results are set on the same object as plain attributes.
A script's argument named like a psflow flag is refused (one line), never shadowed.
"""
import argparse

from . import _psflow
from .threads import set_compute_threads

_PSFLOW_FLAG_NAMES = tuple(_psflow.Flags().as_dict().keys())


def _help_epilog():
    names = ", ".join(f"--{n}" for n in _PSFLOW_FLAG_NAMES)
    return (f"psflow's flags are accepted too (see `psflow train --help` for their meaning): {names}. "
            "Precedence, lowest first: psflow's defaults, the script's defaults, $PSFLOW_FLAGS (psflow "
            "local), the command line.")


def parse_flags(parser=None, argv=None, defaults=None):
    """parse_flags(parser=None, argv=None, defaults=None) -> psflow.Flags

    parser:   the script's own argparse.ArgumentParser (optional). The arguments psflow does not
              know are parsed by it (strictly: an argument neither knows exits 2 with argparse's
              message), and its results become attributes of the returned object beside psflow's
              flags. -h/--help prints the script's help, with psflow's flags listed after it.
    argv:     the command line without the program (default sys.argv[1:]).
    defaults: the script's defaults for psflow's flags, e.g. {"batch_size": 100}.

    Without a parser, the arguments psflow does not know are left in .unparsed (as before).
    For compatibility, parse_flags(list_of_args, defaults=...) treats the list as argv.
    """
    if isinstance(parser, (list, tuple)):
        if argv is not None:
            raise _psflow.InvalidArgumentError("parse_flags: give argv once (the first argument is the parser)")
        parser, argv = None, list(parser)
    if parser is not None and not isinstance(parser, argparse.ArgumentParser):
        raise _psflow.InvalidArgumentError(
            f"parse_flags: parser must be an argparse.ArgumentParser, got {type(parser).__name__}")
    flags = _psflow._parse_flags(argv=None if argv is None else [str(a) for a in argv], defaults=defaults)
    # The compute threads before the script's first op (the model's initialization included).
    set_compute_threads(flags.intra_op_threads, import_torch=False)
    if parser is None:
        return flags
    clashes = [a.dest for a in parser._actions if a.dest in _PSFLOW_FLAG_NAMES]
    if clashes:
        raise _psflow.InvalidArgumentError(
            f"the script's argument '{clashes[0]}' has the name of a psflow flag (--{clashes[0]}); rename it, "
            f"or drop it and read psflow's as flags.{clashes[0]}")
    if any(a in ("-h", "--help") for a in flags.unparsed):
        epilog = _help_epilog()
        parser.epilog = f"{parser.epilog}\n\n{epilog}" if parser.epilog else epilog
    script = parser.parse_args(flags.unparsed)  # exits 2 with argparse's own message on a bad argument
    for name, value in vars(script).items():
        setattr(flags, name, value)
    flags.unparsed = []
    return flags
