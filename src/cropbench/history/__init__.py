"""asv over release histories, and the gates built on it: tools that work on the repository itself.

- :mod:`~cropbench.history.releases` builds a git history of a format library's releases from its sdists
  (``cropbench release-history``);
- :mod:`~cropbench.history.regression` is cropbench's own pull-request gate and its detection campaign
  (``cropbench asv-regression``);
- :mod:`~cropbench.history.library_gate` gates a format library's change on its own read path
  (``cropbench library-gate``), and :mod:`~cropbench.history.campaign` measures that gate's detection
  (``cropbench library-campaign``);
- :mod:`~cropbench.history.spread` sets two runs of a release history side by side, per release
  (``cropbench history-spread``);
- :mod:`~cropbench.history.offline_html` and :mod:`~cropbench.history.site_tidy` make asv's published
  site work offline and draw every benchmark (``cropbench asv-offline-html``, ``cropbench asv-site-tidy``).

They read the asv configurations, the benchmarks, ``vendor/`` and the patches under ``scripts/`` from
:data:`REPO`, the checkout this package runs from (``src/cropbench`` in it), as the scripts that preceded
them did; each command keeps its own exit codes and one-line messages.
"""

from __future__ import annotations

from pathlib import Path

#: The repository checkout the package runs from: the folder holding ``src/cropbench``.
REPO = Path(__file__).resolve().parents[3]
