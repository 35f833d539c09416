"""Progress bars for the long commands, and Ctrl-C: a run stops at the next case and keeps every finished row."""

from __future__ import annotations

import threading

from tqdm import tqdm

from cropbench.records import Record

#: Set by Ctrl-C; the progress callback raises at the next case while it is set.
INTERRUPTED = threading.Event()


def on_interrupt(signum: int, frame: object) -> None:
    """Ctrl-C raises KeyboardInterrupt as usual and is remembered: one that lands in a destructor or a
    callback (where Python reports and drops exceptions) still stops the run at the next case."""
    INTERRUPTED.set()
    raise KeyboardInterrupt


class ProgressBar:
    """The API's progress callback as a tqdm bar (messages as postfix, a tick per record), opened on first use
    so a request rejected before anything runs prints only its error."""

    def __init__(self, enabled: bool, desc: str, total: int | None = None) -> None:
        self.enabled, self.desc, self.total = enabled, desc, total
        self.bar: tqdm | None = None

    def __call__(self, message: str, record: Record | None) -> None:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        if not self.enabled:
            return
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc=self.desc, unit="case")
        if record is None:
            self.bar.set_postfix_str(message[:60])
        else:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
