"""Progress bars for the long commands, and Ctrl-C: a run stops at the next case and keeps every finished row."""

from __future__ import annotations

import threading
import time

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
    total, with the runner's estimate of the time left (from what the cases cost so far), counted down
    every :data:`TICK_S` while a long case runs.
    """

    #: Seconds between refreshes of the time left while a case runs.
    TICK_S = 2.0
    #: The bar without tqdm's own time left, which counts cases as if each cost the same.
    CASES_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self, enabled: bool, desc: str, total: int | None = None) -> None:
        self.enabled, self.desc, self.total = enabled, desc, total
        self.bar: tqdm | None = None
        self.counting_cases = False
        self.message = ""
        self.left: tuple[float, float, float] | None = None  # (seconds left, of which this case's, when)
        self.closed = threading.Event()
        self.ticker: threading.Thread | None = None

    def _open(self) -> tqdm:
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc=self.desc, unit="case")
        return self.bar

    def _postfix(self) -> str:
        parts = []
        if self.left is not None:
            left, case, since = self.left
            running = time.monotonic() - since
            # A case past its estimate is taken to be halfway: it has as long again to go as half its time.
            seconds = left - case + max(case - running, running / 2)
            parts.append(f"about {tqdm.format_interval(seconds)} left")
        if self.message:
            parts.append(self.message[:60])
        return ", ".join(parts)

    def _tick(self) -> None:
        while not self.closed.wait(self.TICK_S):
            bar = self.bar
            if bar is not None:
                bar.set_postfix_str(self._postfix())

    def cases(self, done: int, total: int, left_s: float | None = None, case_s: float | None = None) -> None:
        """``done`` of ``total`` planned cases are measured; ``left_s``: the seconds the rest should take,
        ``case_s`` of them the case starting now's."""
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        self.counting_cases = True
        if not self.enabled:
            return
        bar = self._open()
        bar.bar_format = self.CASES_FORMAT
        if bar.total != total:
            bar.total = total
        bar.n = done
        self.left = None if left_s is None else (left_s, case_s or 0.0, time.monotonic())
        bar.set_postfix_str(self._postfix())
        if self.ticker is None:
            self.ticker = threading.Thread(target=self._tick, name="progress-ticker", daemon=True)
            self.ticker.start()

    def __call__(self, message: str, record: Record | None) -> None:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        if not self.enabled:
            return
        bar = self._open()
        if record is None:
            self.message = message
            bar.set_postfix_str(self._postfix())
        elif not self.counting_cases:
            bar.update(1)

    def close(self) -> None:
        self.closed.set()
        if self.ticker is not None:
            self.ticker.join()
        if self.bar is not None:
            self.bar.close()
