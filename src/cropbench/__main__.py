"""``python -m cropbench``."""

from cropbench.cli import main

raise SystemExit(main())
