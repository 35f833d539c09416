"""Command line: parse, then delegate. User errors print one line and exit with code 2.

One module per command group, each registering its commands and their handlers: plates
(``generate``, ``import``, ``upload``, ``realism``), runs (``run``, ``smoke``, ``env``), comparisons
(``compare-layouts``, ``compare-formats``), ``advise``, results (``plot``, ``report``, ``export``,
``summary``), scale, stores (``store-calibration``, ``prefetch-bench``, ``replay-validation``,
``remote-bench``), and tools that work on the repository checkout (``release-history``, ``library-gate``,
``asv-regression``, ``headline``, ...: they keep their own exit codes); ``parser`` assembles them,
``options`` holds the options several share, ``progress`` the bars and Ctrl-C.

Ctrl-C and SIGTERM end every command the same way: as a KeyboardInterrupt, so each ``finally`` runs
(scratch plates and folders are removed, finished rows stay) and one line is printed.
"""

from __future__ import annotations

import signal
import sys
import threading
import warnings
from collections.abc import Sequence

from cropbench.cli.parser import EXIT_USER_ERROR, build_parser
from cropbench.cli.progress import INTERRUPTED, on_interrupt
from cropbench.errors import CropbenchError
from cropbench.report.text import one_line_safe
from cropbench.scratch import sweep_stale_scratch

#: Signals that stop a command as Ctrl-C does (SIGTERM: ``kill``, a batch scheduler, a container stop): the
#: interrupted case is dropped, finished rows kept, scratch removed by the commands' finally paths.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def one_line(error: BaseException) -> str:
    """The cause in one line: a DataLoader worker's error is unwrapped from torch's traceback text."""
    text = str(error).strip()
    if "Original Traceback" in text:  # torch re-raises a worker's exception with its whole traceback
        last = text.splitlines()[-1]
        text = last.split(": ", 1)[1] if ": " in last and "Error" in last.split(": ", 1)[0] else last
    if isinstance(error, OSError) and error.strerror:
        names = [str(n) for n in (error.filename, error.filename2) if n]
        text = f"{error.strerror}: {' -> '.join(names)}" if names else error.strerror
    lines = text.splitlines()
    return lines[0] if lines else type(error).__name__


def _format_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> str:
    """One line per warning; a warning may quote a row's text, so its control characters are escaped."""
    return f"cropbench: warning: {one_line_safe(str(message))}\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "own_exit_codes", False):  # a repository tool (cli/tools.py): its messages, signals, codes
        return int(args.handler(args))
    sweep_stale_scratch()  # what a run killed with SIGKILL left in the temporary directory
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what --ranks hands on to each rank
    warnings.formatwarning = _format_warning
    INTERRUPTED.clear()
    on_main_thread = threading.current_thread() is threading.main_thread()
    received: list[int] = []

    def stop(signum: int, frame: object) -> None:
        received.append(signum)
        on_interrupt(signum, frame)

    # SIGTERM stops a command as Ctrl-C does, so its finally paths remove scratch folders before it exits.
    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS} if on_main_thread else {}
    try:
        status = int(args.handler(args))
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        return status
    except (CropbenchError, OSError) as error:  # OSError: a user's path (missing, read-only, disk full)
        print(f"cropbench: error: {one_line_safe(one_line(error))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        number = received[-1] if received else signal.SIGINT
        name = "" if number == signal.SIGINT else f" ({signal.Signals(number).name})"
        print(f"cropbench: interrupted{name}; every finished row is kept", file=sys.stderr)
        return 128 + number
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


__all__ = ["build_parser", "main", "one_line"]
