"""Track ``training`` (Track 3, ``--track 3``): an end-to-end loop of fixed steps — does the loader keep the model fed?

Three model kinds answer different questions (see docs/explanation/measurement.md):
- ``resnet18``: does this loader starve a standard model on this machine? (on CPU: never)
- ``smallcnn``: a light model whose steps are short enough for the loader to matter on CPU.
- ``emulated``: a fixed compute time per step with the CPU left idle, as MLPerf Storage's DLIO does:
  could this loader feed an accelerator that needs a batch every N ms?

:class:`WorkerSearch` raises ``num_workers`` until the data-wait fraction falls below 10% (MLPerf
Storage's accelerator-utilisation threshold) and reports the smallest such count. :class:`ThreadSplit`
shares one core count out as workers × decode threads per worker and reports the split that ran fastest.

One module per job: the cases, searches and splits (``cases``), one step of the model's compute
(``compute``), the timed loop against its compute-only baseline (``loop``), the searches' order and
answers (``search``), the presets and the runner's track (``track``), and the models (``models``).
"""

from __future__ import annotations

from cropbench.tracks.training.cases import AU_THRESHOLD, ThreadSplit, TrainingCase, WorkerSearch
from cropbench.tracks.training.loop import compute_key, run_case, stall_crosscheck
from cropbench.tracks.training.search import run_search, split_summary
from cropbench.tracks.training.track import Training, preset_items

__all__ = [
    "AU_THRESHOLD",
    "ThreadSplit",
    "TrainingCase",
    "Training",
    "WorkerSearch",
    "compute_key",
    "preset_items",
    "run_case",
    "run_search",
    "split_summary",
    "stall_crosscheck",
]
