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
    so a request rejected before anything runs prints only its error.

    Told the planned cases (:meth:`cases`, from the runner), it counts cases instead of records: done out of
    total, with the time left at the rate so far.
    """

    def __init__(self, enabled: bool, desc: str, total: int | None = None) -> None:
        self.enabled, self.desc, self.total = enabled, desc, total
        self.bar: tqdm | None = None
        self.counting_cases = False

    def _open(self) -> tqdm:
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc=self.desc, unit="case")
        return self.bar

    def cases(self, done: int, total: int) -> None:
        """``done`` of ``total`` planned cases are measured."""
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        self.counting_cases = True
        if not self.enabled:
            return
        bar = self._open()
        if bar.total != total:
            bar.total = total
        bar.n = done
        bar.refresh()

    def __call__(self, message: str, record: Record | None) -> None:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        if not self.enabled:
            return
        bar = self._open()
        if record is None:
            bar.set_postfix_str(message[:60])
        elif not self.counting_cases:
            bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
