"""Regenerate the headline table of track ``targets`` in the docs from the committed rows.

    python scripts/headline.py              # the block in docs/results/decode-paths.md from measurements/targets/
    python scripts/headline.py --check      # exit 1 when the page's block is not the rows' rendering
    python scripts/headline.py --print --rows out/targets   # print the table of other rows

The table sits between ``<!-- headline:start -->`` and ``<!-- headline:end -->`` in the page; nothing
outside those markers is touched. Measure the rows with ``cropbench run --track targets --preset full
--repeats 5 --out measurements/targets/run-N`` (several runs, each alone on an idle machine).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cropbench.errors import CropbenchError
from cropbench.report.headline import PAGE, ROWS_FOLDER, block, current_block, read_rows, regenerate

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=Path, default=ROOT / ROWS_FOLDER, help=f"rows folder (default: {ROWS_FOLDER})")
    parser.add_argument("--page", type=Path, default=ROOT / PAGE, help=f"the page with the markers (default: {PAGE})")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="only say whether the page's table is current")
    action.add_argument("--print", action="store_true", help="print the table instead of writing the page")
    args = parser.parse_args(argv)
    shown = os.path.relpath(args.page)
    default_rows = args.rows.resolve() == (ROOT / ROWS_FOLDER).resolve()
    try:
        if not default_rows and not args.rows.exists():
            raise CropbenchError(f"--rows {args.rows} does not exist")
        source = ROWS_FOLDER if default_rows else str(args.rows)
        if args.print:
            print(block(read_rows(args.rows), source))
            return 0
        if args.check:
            wanted = block(read_rows(args.rows), source)
            if current_block(args.page.read_text(encoding="utf-8"), str(args.page)) != wanted:
                print(
                    f"{shown}: the headline table is not the rendering of {source}: run scripts/{Path(__file__).name}"
                )
                return 1
            print(f"{shown}: the headline table is current")
            return 0
        changed = regenerate(args.rows, args.page, source)
    except (CropbenchError, OSError) as error:
        print(f"cropbench: error: {error}", file=sys.stderr)
        return 2
    print(f"{shown}: {'headline table rewritten' if changed else 'headline table already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
