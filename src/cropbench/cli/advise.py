"""``cropbench advise``: one answer a lab can act on for a plate and a model, verified by running it."""

from __future__ import annotations

import argparse
from pathlib import Path

from cropbench.cli.options import Commands, add_crop_size, add_store_knobs, store_config, whole_number
from cropbench.cli.progress import ProgressBar
from cropbench.cli.runs import URL_SCHEME
from cropbench.config import MAX_WORKERS
from cropbench.errors import ConfigError

#: The longest budget ``--budget-min`` accepts: a day.
MAX_BUDGET_MIN = 24 * 60
#: The most rounds a question may be asked to run at least (``tracks.training.advise.MAX_ROUNDS``).
MAX_LEAST_ROUNDS = 24


def cmd_advise(args: argparse.Namespace) -> int:
    for option, path in (("--plate", args.plate), ("--objects", args.objects)):
        if path is not None and not URL_SCHEME.match(path) and not Path(path).exists():
            raise ConfigError(f"{option} {path} does not exist")
    from cropbench import api

    bar = ProgressBar(not args.no_progress, "advise")
    try:
        done = api.advise(
            args.plate,
            args.model,
            args.out,
            budget_min=args.budget_min,
            batch_size=args.batch_size,
            crop_size=args.crop_size,
            max_workers=args.max_workers,
            epoch_crops=args.epoch_crops,
            rounds=args.rounds,
            max_rounds=max(args.max_rounds, args.rounds),
            steps=args.steps,
            objects=args.objects,
            store=store_config(args),
            work_dir=args.work,
            progress=bar,
        )
    finally:
        bar.close()
    print(done.text)
    print(f"wrote {done.advice_path} (rows in {Path(args.out) / 'results.jsonl'})")
    return 0


def add_advise_commands(commands: Commands) -> None:
    """Register ``advise``."""
    parser = commands.add_parser(
        "advise",
        help="what to do with this plate and this model: read path, workers, batch, convert or read",
        description="Measures what each decision needs within the budget (whole epochs read in turns), "
        "recommends read path, workers, batch, prefetch, pinning and convert-or-read, runs the recommendation "
        "once more as a Track 3 loop, and writes OUT/advice.json beside the rows in OUT/results.jsonl.",
    )
    parser.add_argument("--plate", required=True, help="the plate (a path, or a URL: s3://, http(s)://)")
    parser.add_argument(
        "--model",
        required=True,
        help="resnet18, smallcnn, emulated:MS (an accelerator step of MS ms at --batch-size) or "
        "path/to/file.py:factory (factory(channels, classes) returns a torch module taking the crops)",
    )
    parser.add_argument(
        "--budget-min",
        type=whole_number(1, MAX_BUDGET_MIN),
        default=10,
        help="minutes the measurements may take; an open question gets more rounds while they last (default: "
        "%(default)s)",
    )
    parser.add_argument("--out", default="out/advise", help="output directory (default: %(default)s)")
    parser.add_argument(
        "--batch-size", type=whole_number(1, 4096), default=64, help="the training batch (default: %(default)s)"
    )
    add_crop_size(parser)
    parser.add_argument(
        "--max-workers",
        type=whole_number(0, MAX_WORKERS),
        help="most DataLoader workers tried (default: as many as the cores allow)",
    )
    parser.add_argument(
        "--epoch-crops", type=whole_number(1), help="crops per epoch (default: every object of the plate)"
    )
    parser.add_argument(
        "--rounds",
        type=whole_number(2, MAX_LEAST_ROUNDS),
        default=3,
        help="least rounds (one epoch per option each) per question (default: %(default)s)",
    )
    parser.add_argument(
        "--max-rounds",
        type=whole_number(2, MAX_LEAST_ROUNDS),
        default=MAX_LEAST_ROUNDS,
        help="most rounds per question, however open it stays (default: %(default)s)",
    )
    parser.add_argument(
        "--steps",
        type=whole_number(1, 100_000),
        default=16,
        help="timed steps of the model's compute-only rate (default: %(default)s)",
    )
    parser.add_argument("--objects", help="object table (Parquet/CSV) for plates without cropbench's table")
    parser.add_argument("--work", help="where training-format stores are written (default: OUT/crops)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_store_knobs(parser)
    parser.set_defaults(handler=cmd_advise)
