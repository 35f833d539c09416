"""``python -m cropbench``.

SIGINT and SIGTERM are handled from the first line: one landing while the command line loads (torch
alone takes seconds to import) ends in the same one line as one landing later, never a traceback.
"""

import signal
import sys
from types import FrameType

_received: list[int] = []


def _stop_early(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


for _number in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(_number) is not signal.SIG_IGN:  # a job started with the signal ignored keeps it so
        signal.signal(_number, _stop_early)
try:
    from cropbench.cli import main

    _code = main()
except KeyboardInterrupt:
    _signum = _received[-1] if _received else int(signal.SIGINT)
    _name = "" if _signum == signal.SIGINT else f" ({signal.Signals(_signum).name})"
    print(f"cropbench: interrupted{_name} before any work started; nothing was written", file=sys.stderr)
    _code = 128 + _signum
raise SystemExit(_code)
