"""Every read setting of every command reaches the measured read, or is refused in one line naming it.

The options are walked from the parser itself, so an option added later fails here until it is either
a read setting with a probe below or named in the short table of options that are not read settings.
Each probe runs the command in this process with the measuring function replaced by a stub that keeps
what it was handed (the cases a run plans, the comparison or bench a command measures, the store a plate
URL is read with) and stops there; the value given must be in it. ``run``'s crop knobs are tried with
every track it builds: each case of the track must hold the value, or the run is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cropbench import api
from cropbench.cli import main
from cropbench.cli.parser import build_parser
from cropbench.harness.runner import plan
from cropbench.objects import read_object_table
from cropbench.tracks import TRACKS

#: Commands that measure no read: they write plates or reports, or describe the machine.
NO_READ = {
    "generate": "writes a plate",
    "import": "writes a plate",
    "upload": "copies a plate into a store",
    "realism": "compares plates' statistics",
    "smoke": "its settings are the smoke preset's, none given",
    "env": "prints the environment",
    "plot": "draws rows already measured",
    "report": "writes rows already measured",
    "export": "writes rows already measured",
    "summary": "prints rows already measured",
    "scale generate": "writes a plate",
    "headline": "renders rows already measured into a page",
    "gpu-table": "renders rows already measured",
    "asv-offline-html": "rewrites a published asv site",
    "asv-site-tidy": "rewrites a published asv site",
    "release-history": "rebuilds a library's release history (git)",
    "history-spread": "compares asv results already measured",
    # asv's own runs, whose benchmarks read with the suites' fixed settings (arguments pass through to
    # the tool, which checks them):
    "asv-regression": "runs asv benchmarks at their own settings",
    "library-gate": "runs asv benchmarks at their own settings",
    "library-campaign": "runs asv benchmarks at their own settings",
}
#: Options of measuring commands that are not read settings: where rows go and how progress shows;
#: what is measured (tracks, presets, layouts, formats, readers, models, servers) rather than how it
#: is read; how long, how often and on how many processes; and the plates a sweep writes.
NOT_READ_SETTINGS = frozenset(
    {
        *("--help", "--out", "--work", "--keep", "--no-progress", "--plot", "--resume"),
        *("--plate", "--local-plate", "--layout-dir", "--traces"),
        *("--track", "--peers", "--preset", "--layout", "--layouts", "--format", "--readers", "--model", "--server"),
        "--rechunk",
        *("--repeats", "--rounds", "--max-rounds", "--budget-min", "--seconds", "--batches", "--steps"),
        *("--ranks", "--rank-timeout", "--torch-threads", "--require-cgroup", "--no-cached"),
        *("--field-size", "--distinct-fields", "--channels", "--limit-mib", "--plate-multiple", "--shard-mib"),
        *("--sizes-kib", "--p99-ms", "--links-gbit", "--epochs", "--epoch-crops", "--warmup"),
    }
)


@dataclasses.dataclass(frozen=True)
class Probe:
    """A value to give an option, the field names it may arrive under, and the value it must arrive as."""

    value: str
    names: tuple[str, ...]
    expected: Any


OBJECTS_FILE = "cells.parquet"
#: The read settings and how each is recognised where it arrives.
PROBES: dict[str, Probe] = {
    "--crop-size": Probe("40", ("crop_size",), 40),
    "--decode": Probe("zarr", ("decode",), "zarr"),
    "--dtype": Probe("float32", ("dtype",), "float32"),
    "--tier": Probe("light", ("tier",), "light"),
    "--chunk-cache-bytes": Probe("12345", ("chunk_cache_bytes",), 12345),
    "--chunk-cache-mib": Probe("3", ("chunk_cache_mib",), 3),
    "--decode-threads": Probe("3", ("decode_threads",), 3),
    "--workers": Probe("3", ("workers", "num_workers"), 3),
    "--max-workers": Probe("3", ("max_workers",), 3),
    "--batch-size": Probe("24", ("batch_size",), 24),
    "--in-flight": Probe("5", ("in_flight",), 5),
    "--coalesce-gap": Probe("4096", ("coalesce_gap_bytes",), 4096),
    "--coalesce-gap-kib": Probe("8", ("coalesce_gap_kib",), 8),
    "--timeout": Probe("7.5", ("timeout_s",), 7.5),
    "--connect-timeout": Probe("3.5", ("connect_timeout_s",), 3.5),
    "--retries": Probe("4", ("retries",), 4),
    "--latency-ms": Probe("13", ("latency_ms", "median_latency_ms", "remote_latency_ms"), 13),
    "--median-ms": Probe("13", ("median_ms", "median_latency_ms"), 13),
    "--zarr-client": Probe("fsspec", ("zarr_client",), "fsspec"),
    "--anonymous": Probe("", ("anonymous",), True),
    "--objects": Probe(OBJECTS_FILE, ("objects",), OBJECTS_FILE),
    "--samples": Probe("77", ("samples",), 77),
    "--crops": Probe("77", ("crops", "samples"), 77),
    "--seed": Probe("5", ("seed",), 5),
    "--in-place-run": Probe("8", ("in_place_run",), 8),
}
#: Where a command's option means something else than its namesake elsewhere.
COMMAND_PROBES: dict[tuple[str, str], Probe] = {
    ("scale sweep", "--objects"): Probe("1000", ("objects",), 1000),
}
PLATE_URL = "http://127.0.0.1:9/plate.zarr"


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                command = f"{prefix} {name}".strip()
                nested = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                yield from _commands(sub, command) if nested else [(command, sub)]


def _options(sub: argparse.ArgumentParser) -> list[str]:
    return [max(action.option_strings, key=len) for action in sub._actions if action.option_strings]


COMMANDS = dict(_commands(build_parser()))
PAIRS = [(command, option) for command, sub in COMMANDS.items() if command not in NO_READ for option in _options(sub)]
SETTINGS = [(command, option) for command, option in PAIRS if option not in NOT_READ_SETTINGS]


def test_every_option_of_a_measuring_command_is_a_read_setting_with_a_probe_or_named_as_none() -> None:
    assert set(NO_READ) <= set(COMMANDS), "a command named as measuring nothing is gone"
    unknown = sorted({option for _, option in SETTINGS if option not in PROBES})
    assert not unknown, f"options that are neither read settings with a probe nor named as none: {unknown}"


class Reached(Exception):
    """A stub measuring function was handed its work."""


class _Seen:
    """What the stubs were handed."""

    def __init__(self) -> None:
        self.handed: list[Any] = []
        self.cases: list[Any] | None = None

    def keep(self, *args: Any, **kwargs: Any) -> Any:
        self.handed.append((args, kwargs))
        raise Reached


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_plate: Path) -> _Seen:
    import cropbench.cli.stores as stores
    import cropbench.measure.environment as environment
    import cropbench.measure.replay_validation as replay
    import cropbench.measure.store_calibration as calibration
    import cropbench.tracks.prefetch as prefetch

    seen = _Seen()

    def planned(tracks: Any, preset: str, context: Any, *_: Any, **__: Any) -> Any:
        seen.handed.append(((context,), {}))
        seen.cases = [item.case for item in plan(tracks, preset, context)]
        raise Reached

    @contextlib.contextmanager
    def served(server: str, plate: Path, latency_ms: float) -> Iterator[tuple[str, None]]:
        seen.handed.append(((), {"latency_ms": latency_ms}))
        yield PLATE_URL, None

    run = api.run

    def running(*args: Any, **kwargs: Any) -> Any:
        seen.handed.append((args, kwargs))  # the tracks a command built, as handed to the run
        return run(*args, **kwargs)

    monkeypatch.setattr(api, "run", running)
    monkeypatch.setattr(api, "run_tracks", planned)
    monkeypatch.setattr(api, "remote_plate", seen.keep)
    monkeypatch.setattr(environment, "collect", lambda *_: {})
    for name in ("compare_layouts", "compare_layouts_in_store", "advise", "sweep_scale", "compare_out_of_memory"):
        monkeypatch.setattr(api, name, seen.keep)
    monkeypatch.setattr(prefetch, "run_prefetch", seen.keep)
    monkeypatch.setattr(replay, "measure", seen.keep)
    monkeypatch.setattr(calibration, "run_calibration", seen.keep)
    monkeypatch.setattr(stores, "_need_emulation", lambda: None)
    monkeypatch.setattr(stores, "_emulation_reason", lambda: None)
    monkeypatch.setattr(stores, "_served", served)
    read_object_table(tiny_plate).write(tmp_path / OBJECTS_FILE)
    monkeypatch.chdir(tmp_path)
    return seen


def _base(command: str, plate: Path, option: str) -> list[str]:
    """The command with what it needs to start (a plate in a store for a store option of ``run``)."""
    store_option = option in ("--in-flight", "--coalesce-gap", "--timeout", "--connect-timeout", "--retries")
    store_option |= option in ("--latency-ms", "--zarr-client", "--anonymous")
    needs = {
        "run": ["--plate", PLATE_URL if store_option else str(plate), "--no-progress"],
        "compare-layouts": ["--plate", PLATE_URL if store_option else str(plate), "--no-progress"],
        "compare-formats": ["--plate", str(plate), "--no-progress"],
        "advise": ["--plate", PLATE_URL if store_option else str(plate), "--model", "smallcnn", "--no-progress"],
        "scale sweep": ["--out", "out", "--work", "work", "--no-progress"],
        "scale out-of-memory": ["--out", "out", "--work", "work", "--no-progress"],
        "store-calibration": [],
        "prefetch-bench": ["--plate", str(plate), "--out", "out/rows.jsonl", "--batches", "6"],
        "replay-validation": ["--plate", str(plate)],
        "remote-bench": ["--plate", str(plate), "--out", "out"],
    }
    return [*command.split(), *needs[command]]


def _fields(value: Any, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Every (field name, value) inside ``value``: dataclasses, plain objects, mappings and sequences."""
    if depth > 8 or value is None or isinstance(value, (str, bytes, int, float, bool, Path, type)):
        return
    if dataclasses.is_dataclass(value):
        items: Any = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _fields(item, depth + 1)
        return
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("cropbench"):
        items = list(vars(value).items())
    else:
        return
    for name, item in items:
        yield name, item
        yield from _fields(item, depth + 1)


def _holds(value: Any, expected: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds(item, expected) for item in value)
    if isinstance(expected, str) and isinstance(value, (str, Path)):
        return Path(value).name == expected
    return type(value) is not bool and value == expected if not isinstance(expected, bool) else value is expected


def _outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    try:
        code: Any = main(argv)
    except SystemExit as stop:
        code = stop.code
    except Reached:
        return "reached"
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.startswith("cropbench: error: ") and "\n" not in error, (argv, code, error)
    return error


def _probe(command: str, option: str) -> Probe:
    return COMMAND_PROBES.get((command, option), PROBES[option])


def _given(option: str, probe: Probe) -> list[str]:
    return [option] if probe.value == "" else [option, probe.value]


CROP_KNOBS = ("--crop-size", "--decode", "--dtype", "--tier", "--chunk-cache-bytes", "--decode-threads")
RUN_TRACKS = sorted(info.name for info in TRACKS.values() if info.runner_class is not None)


@pytest.mark.parametrize(("command", "option"), [pair for pair in SETTINGS if pair[1] in PROBES])
def test_every_read_setting_reaches_the_measured_read_or_is_refused_naming_it(
    command: str, option: str, seen: _Seen, tiny_plate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = _probe(command, option)
    tracks = RUN_TRACKS if command == "run" and option in CROP_KNOBS else [None]
    for track in tracks:
        seen.handed.clear()
        argv = [*_base(command, tiny_plate, option), *_given(option, probe)]
        argv += ["--track", track] if track is not None else []
        outcome = _outcome(argv, capsys)
        if outcome != "reached":
            assert option in outcome, f"{' '.join(argv)}: refused without naming {option}: {outcome}"
            continue
        if track is not None:  # every case the run plans holds the value
            assert seen.cases, f"{' '.join(argv)}: no case planned"
            for case in seen.cases:
                found = [v for name, v in _fields(case) if name in probe.names]
                assert any(_holds(v, probe.expected) for v in found), f"{' '.join(argv)}: {case.label} lacks it"
            continue
        found = [value for name, value in _fields([seen.handed, seen.cases]) if name in probe.names]
        assert any(_holds(value, probe.expected) for value in found), f"{' '.join(argv)}: {option} did not arrive"


def test_every_track_is_written_by_a_command_that_declares_it_and_no_command_names_another() -> None:
    """The table of tracks and the commands agree both ways: a track's rows come from ``run --track`` or
    from the command its entry names, which declares it; no command declares a track the table lacks."""
    declared = {command: sub.get_default("tracks") or () for command, sub in COMMANDS.items()}
    assert set().union(*declared.values()) == set(TRACKS), "a track no command writes, or one the table lacks"
    for info in TRACKS.values():
        if info.runner_class is not None:
            assert info.name in declared["run"], f"run --track {info.name} builds it, but run does not declare it"
        else:
            assert info.command is not None, f"track {info.name} has neither a runner nor a command"
            words = info.command.split(" --")[0]  # "compare-layouts --plate URL": the command is its words
            assert words in COMMANDS, f"track {info.name} names command {info.command!r}, which is not one"
            assert info.name in declared[words], f"`cropbench {words}` does not declare track {info.name}"
    assert declared["remote-bench"] == ("remote", "store-layouts"), "one command, two tracks"
