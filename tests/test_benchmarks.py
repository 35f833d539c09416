"""The asv suites in benchmarks/: configuration, fixtures, skips, and every benchmark run once on a tiny plate.

What the benchmarks measure is tested with the package (tests/test_crop_path.py, test_loader.py, ...)."""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common, instructions, remote, scale, track1, track2, track3, zarr_stages  # noqa: E402

#: Every module of suites (what asv collects; ``common`` holds fixtures).
SUITE_MODULES = (instructions, remote, scale, track1, track2, track3, zarr_stages)
SUITES = [track1.Fetch, track1.Decoding, track1.Stages, track2.Loader, track3.Loop]
#: The full grid's suites: skipped unless CROPBENCH_ASV_FULL=1.
FULL_SUITES = [
    track1.FullFetch,
    track1.Latency,
    track2.FullLoader,
    track2.LoaderLatency,
    track3.FullLoop,
    track3.LoopLatency,
]


def _config() -> dict[str, Any]:
    lines = (REPO / "asv.conf.json").read_text().splitlines()
    return json.loads("\n".join(line for line in lines if not line.lstrip().startswith("//")))


def test_config_installs_each_commit_without_dependencies() -> None:
    config = _config()
    assert config["repo"] == "." and config["branches"] == ["main"]
    assert (config["results_dir"], config["html_dir"], config["env_dir"]) == ("results", "html", ".asv/env")
    assert config["launch_method"] == "forkserver"
    assert config["matrix"]["req"]["torch"] == ["2.14.1"] and config["matrix"]["req"]["torchvision"] == ["0.29.1"]
    assert config["matrix"]["req"]["zarr"][0].count(".") == 2, "zarr must be pinned exactly"
    project_install, *extras = config["install_command"]
    assert all("--no-deps" in command for command in config["build_command"] + [project_install])
    assert "{wheel_file}" in project_install
    pins = {name: config["matrix"]["req"][name][0] for name in ("numpy", "zarr", "numcodecs")}
    for command in extras:
        assert "{wheel_file}" not in command, "only the first step installs the project"
        assert "--no-deps" in command or all(
            f"{name}=={version}" in command.split() for name, version in pins.items()
        ), f"an extra install step must not move the matrix's pins {pins}: {command}"
    init = (REPO / "benchmarks" / "__init__.py").read_text()
    assert "sys.path" not in init, "benchmarks/__init__.py must not put src/ on sys.path"


def test_parameters_do_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    def parameters() -> dict[str, Any]:
        modules = [importlib.reload(module) for module in (common, *SUITE_MODULES)][1:]
        return {
            f"{module.__name__}.{name}": suite.params
            for module in modules
            for name, suite in vars(module).items()
            if isinstance(suite, type) and hasattr(suite, "params")
        }

    try:
        monkeypatch.delenv(common.FULL_GRID_SWITCH, raising=False)
        default = parameters()
        monkeypatch.setenv(common.FULL_GRID_SWITCH, "1")
        assert parameters() == default
    finally:
        monkeypatch.delenv(common.FULL_GRID_SWITCH, raising=False)
        for module in (common, *SUITE_MODULES):
            importlib.reload(module)


def _as_of_an_older_commit(monkeypatch: pytest.MonkeyPatch, module: Any, missing: str) -> Any:
    """``module`` imported again as under a commit of cropbench without the module ``missing``."""
    monkeypatch.setitem(sys.modules, missing, None)
    return importlib.reload(module)


@pytest.fixture
def restore_suites(monkeypatch: pytest.MonkeyPatch) -> Any:
    """After the test, its patches undone and each suite module imported afresh (it may have imported
    them as of an older commit: a reload runs in the module's own namespace, so its classes see it too)."""
    yield
    monkeypatch.undo()
    for module in SUITE_MODULES:
        importlib.reload(module)


def test_a_module_this_commit_of_cropbench_lacks_is_a_skip_and_other_errors_are_not(
    tiny_plate: Path, monkeypatch: pytest.MonkeyPatch, restore_suites: None
) -> None:
    older = _as_of_an_older_commit(monkeypatch, track1, "cropbench.harness.crop_path")
    assert older.OLDER_COMMIT is not None and "cropbench.harness.crop_path" in older.OLDER_COMMIT
    for suite in (older.Fetch, older.Stages):
        with pytest.raises(NotImplementedError, match="lacks what the benchmark uses: .*cropbench.harness.crop_path"):
            suite().setup({"default": str(tiny_plate)}, "random", "direct", "bounded")
    older = _as_of_an_older_commit(monkeypatch, zarr_stages, "cropbench.harness.crop_path")
    with pytest.raises(NotImplementedError, match="cropbench.harness.crop_path"):
        older.ZarrStages().setup({"default": str(tiny_plate)}, "random")
    with pytest.raises(ModuleNotFoundError, match="no_such_package"):  # not cropbench's: a broken environment
        common.older_commit(ModuleNotFoundError("No module named 'no_such_package'", name="no_such_package"))
    assert "cannot import name 'NoSuchThing'" in common.older_commit(
        ImportError("cannot import name 'NoSuchThing' from 'cropbench.config'", name="cropbench.config")
    )


def test_a_commit_that_cannot_write_the_plates_gives_reasons_not_a_failed_setup_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generate = importlib.import_module("cropbench.plates.generate")
    monkeypatch.delattr(generate, "generate_plate")
    plates = common.make_plates()
    assert plates["default"].startswith(common.UNAVAILABLE) and "generate_plate" in plates["default"]
    with pytest.raises(NotImplementedError, match="generate_plate"):
        common.plate_for(plates, "default")
    with pytest.raises(NotImplementedError, match="was not generated"):
        common.plate_for({"default": "x"}, "sharded")


def _benchmark_methods(suite: type) -> list[str]:
    return sorted(name for name in vars(suite) if name.split("_", 1)[0] in ("time", "track", "peakmem"))


@pytest.mark.parametrize("suite", FULL_SUITES, ids=lambda s: s.__name__)
def test_full_grid_suites_skip_unless_the_full_grid_is_asked(suite: Any, tiny_plate: Path) -> None:
    first = [values[0] for values in suite.params]
    assert suite.setup_cache.__name__ == common.make_full_plates.__name__
    with pytest.raises(NotImplementedError, match="CROPBENCH_ASV_FULL=1"):
        suite().setup({layout: str(tiny_plate) for layout in common.full_layouts()}, *first)


def test_full_plates_are_written_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(common.FULL_GRID_SWITCH, raising=False)
    assert common.make_full_plates() == {}


#: Timed training steps of the Track 3 suites in the fast tier: every body runs and returns its value, nothing
#: is measured. The slow tier runs them at their own ``track3.STEPS`` as well.
FAST_STEPS = 1
EVERY_SUITE = [
    *(
        pytest.param(suite, FAST_STEPS if suite.__module__ == track3.__name__ else None, id=suite.__name__)
        for suite in SUITES + FULL_SUITES
    ),
    *(
        pytest.param(suite, None, id=f"{suite.__name__}-{track3.STEPS}-steps", marks=pytest.mark.slow)
        for suite in SUITES + FULL_SUITES
        if suite.__module__ == track3.__name__
    ),
]


@pytest.mark.parametrize(("suite", "steps"), EVERY_SUITE)
def test_every_benchmark_runs_on_the_first_parameters(
    suite: Any,
    steps: int | None,
    tiny_plate: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(common.FULL_GRID_SWITCH, "1")
    if steps is not None:
        monkeypatch.setattr(track3, "STEPS", steps)
    assert len(suite.params) == len(suite.param_names)
    first = [values[0] for values in suite.params]
    instance = suite()
    plates = {layout: str(tiny_plate) for layout in common.full_layouts()}
    instance.setup(plates, *first)  # on this checkout every symbol must be there
    for name in _benchmark_methods(suite):
        value = getattr(instance, name)(*first)
        if name.startswith("track_"):
            assert isinstance(value, float) and value >= 0.0, name
            assert getattr(getattr(suite, name), "unit", None) or getattr(suite, "unit", None), f"{name} has no unit"


def test_cuda_cases_are_skipped_without_a_gpu(tiny_plate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv(common.FULL_GRID_SWITCH, "1")
    with pytest.raises(NotImplementedError, match="CUDA"):
        track3.FullLoop().setup({"default": str(tiny_plate)}, "smallcnn", 0, "cuda", "default")


@pytest.mark.parametrize("suite", [track1.Decoding, track1.Stages], ids=lambda s: s.__name__)
def test_uninstrumented_zarr_path_skips_rather_than_reporting_zero(suite: Any, tiny_plate: Path) -> None:
    with pytest.raises(NotImplementedError, match="only 'direct'"):
        suite().setup({"default": str(tiny_plate)}, "random", "zarr", "bounded")


def test_asv_check_finds_no_problems() -> None:
    environment = {k: v for k, v in os.environ.items() if k != common.FULL_GRID_SWITCH}
    result = subprocess.run(
        [sys.executable, "-m", "asv", "check", "--python=same"],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No problems found" in result.stdout


def test_arrow_cases_skip_and_say_why_without_ome_arrow() -> None:
    if importlib.util.find_spec("ome_arrow") is not None:
        pytest.skip("ome-arrow is installed here")
    plates = common.make_arrow_plates()
    assert plates["ome-arrow"].startswith(common.UNAVAILABLE)
    with pytest.raises(NotImplementedError, match="ome-arrow is not installed"):
        track1.ArrowFetch().setup(plates, "random", "direct")


def _suite_classes() -> list[tuple[str, str]]:
    """(module, class) of every class with benchmarks in every module of benchmarks/ (what asv collects)."""
    return [
        (module.__name__, name)
        for module in SUITE_MODULES
        for name, suite in sorted(vars(module).items())
        if isinstance(suite, type) and suite.__module__ == module.__name__ and _benchmark_methods(suite)
    ]


@pytest.mark.parametrize(("module_name", "class_name"), _suite_classes(), ids=lambda name: name.split(".")[-1])
def test_every_teardown_tolerates_a_setup_that_skipped(
    module_name: str, class_name: str, monkeypatch: pytest.MonkeyPatch, restore_suites: None
) -> None:
    """asv calls ``teardown`` after a ``setup`` that raised NotImplementedError; a teardown error is a failure."""
    monkeypatch.delenv(common.FULL_GRID_SWITCH, raising=False)

    # No plate was generated and no cropbench module is there (an old commit): every case skips.
    real_import = builtins.__import__

    def older_commit(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("cropbench"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", older_commit)
    suite = getattr(importlib.reload(sys.modules[module_name]), class_name)
    params = [values[0] for values in getattr(suite, "params", ())]
    instance = suite()
    with pytest.raises(NotImplementedError):
        instance.setup({}, *params)
    teardown = getattr(instance, "teardown", None)
    if teardown is not None:
        teardown({}, *params)


def test_the_remote_teardown_runs_after_the_skip_of_a_missing_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "CLIENT_PACKAGES", {"direct": (), "zarr": ()})
    monkeypatch.setattr(remote, "nginx_binary", lambda: None)
    store = remote.Store()
    with pytest.raises(NotImplementedError, match="nginx is not installed"):
        store.setup({"default": "unused"}, "direct")
    store.teardown({"default": "unused"}, "direct")


@pytest.mark.parametrize("suite_name", ["ZarrStages", "ZarrCounts"])
def test_zarr_stage_benchmarks_run_and_split_the_zarr_path(
    suite_name: str, tiny_plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zarr_stages, "RELATIVE_BLOCKS", 3)  # the real 120 blocks of zarr crops take minutes
    monkeypatch.setattr(zarr_stages, "COUNTED_CROPS", 40)
    suite = getattr(zarr_stages, suite_name)
    assert len(suite.params) == len(suite.param_names)
    for access in suite.params[0]:
        instance = suite()
        instance.setup({"default": str(tiny_plate)}, access)
        values = {name: getattr(instance, name)(access) for name in _benchmark_methods(suite)}
        assert all(isinstance(value, float) and value > 0.0 for value in values.values()), values
        assert all(getattr(getattr(suite, name), "unit", None) or getattr(suite, "unit", None) for name in values)
        if suite_name == "ZarrCounts":
            again = {name: getattr(instance, name)(access) for name in _benchmark_methods(suite)}
            assert again == values, "counts do not depend on the clock"


@pytest.mark.parametrize(
    ("suite_name", "params", "decode"),
    [("ZarrReads", ("grouped-field",), "zarr"), ("DirectReads", ("random",), "direct")],
)
def test_instruction_benchmarks_count_their_workload(
    suite_name: str, params: tuple[str, ...], decode: str, tiny_plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body reports the measure's instructions per crop of its workload (the count: test_instructions)."""
    measure = importlib.import_module("cropbench.measure.instructions")
    monkeypatch.setattr(instructions.shutil, "which", lambda name: f"/usr/bin/{name}")
    suite = getattr(instructions, suite_name)
    assert suite.params == (list(suite.params[0]),) and len(suite.params) == len(suite.param_names)
    instance = suite()
    instance.setup({"default": str(tiny_plate)}, *params)
    assert (instance.workload.decode, instance.workload.access) == (decode, params[0])
    assert instance.workload.crops == instructions.CROPS[decode]
    counted: list[Any] = []

    def count(workload: Any) -> Any:
        counted.append(workload)
        return measure.InstructionCount(100, 900, 20, 100)

    monkeypatch.setattr(instructions, "measure_instructions", count)
    assert instance.track_instructions_per_crop(*params) == 10.0
    assert counted == [instance.workload]
    assert suite.unit == measure.UNIT


def test_instruction_benchmarks_skip_without_valgrind_or_ome_arrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    with pytest.raises(NotImplementedError, match="valgrind is not installed: apt-get install -y valgrind"):
        instructions.ZarrReads().setup({"default": "plate.zarr"}, "random")
    unavailable = {"ome-arrow": common.UNAVAILABLE + "ome-arrow is not installed"}
    with pytest.raises(NotImplementedError, match="ome-arrow is not installed"):
        instructions.ArrowReads().setup(unavailable, "direct")
