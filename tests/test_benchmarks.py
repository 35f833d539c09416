"""The asv suites in benchmarks/: configuration, helpers, and every benchmark run once on a tiny plate."""

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

from benchmarks import common, track1, track2, track3, zarr_stages  # noqa: E402
from cropbench.config import plate_preset  # noqa: E402
from cropbench.measure import protocol  # noqa: E402

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
        modules = [importlib.reload(module) for module in (common, track1, track2, track3)][1:]
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
        for module in (common, track1, track2, track3):
            importlib.reload(module)


def test_cache_parameter_bounds_the_chunk_cache_far_below_the_smoke_plate() -> None:
    assert common.cache_knobs("default") == {}
    assert common.cache_knobs("bounded") == {"chunk_cache_bytes": common.BOUNDED_CACHE_BYTES}
    smoke = plate_preset("smoke")
    fields = smoke.rows * smoke.columns * smoke.fields_per_well
    decoded_bytes = fields * smoke.channels * smoke.field_height * smoke.field_width * 2
    assert decoded_bytes > common.BOUNDED_CACHE_BYTES * 8
    with pytest.raises(ValueError, match="bounded"):
        common.cache_knobs("tiny")


@common.skips_older_commits()
def _setup_importing(module: str) -> None:
    importlib.import_module(module)


def test_a_name_this_commit_of_cropbench_lacks_is_a_skip_and_other_errors_are_not() -> None:
    with pytest.raises(NotImplementedError, match="lacks what the benchmark uses: No module named 'cropbench.track9'"):
        _setup_importing("cropbench.track9")
    with pytest.raises(ModuleNotFoundError, match="no_such_package"):  # not cropbench's: a broken environment
        _setup_importing("no_such_package")

    @common.skips_older_commits()
    def setup_importing_a_name() -> None:
        from cropbench.config import NoSuchThing  # type: ignore[attr-defined]  # noqa: F401

    with pytest.raises(NotImplementedError, match="cannot import name 'NoSuchThing'"):
        setup_importing_a_name()

    @common.skips_older_commits()
    def setup_using_a_name_wrongly() -> None:
        _ = protocol.NoSuchThing  # type: ignore[attr-defined]

    with pytest.raises(AttributeError):  # only imports skip: a name used wrongly fails, however old the commit
        setup_using_a_name_wrongly()


def test_a_suite_skips_on_a_commit_without_a_name_only_its_bodies_use(
    tiny_plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bodies' measure is imported in setup, so its absence is asv's skip, not a failed benchmark."""
    monkeypatch.delattr(protocol, "relative_cost")
    with pytest.raises(NotImplementedError, match="cannot import name 'relative_cost'"):
        track1.Fetch().setup({"default": str(tiny_plate)}, "random", "direct", "bounded")
    monkeypatch.undo()
    monkeypatch.delattr(protocol, "Stopwatch")
    with pytest.raises(NotImplementedError, match="cannot import name 'Stopwatch'"):
        track1.Stages().setup({"default": str(tiny_plate)}, "random", "direct", "bounded")


def test_a_commit_without_the_shared_in_memory_reference_skips_what_divides_by_it(
    tiny_plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cropbench.harness.memory_reference", None)
    for suite in (track1.Fetch, track1.Stages):
        with pytest.raises(NotImplementedError, match="cropbench.harness.memory_reference"):
            suite().setup({"default": str(tiny_plate)}, "random", "direct", "bounded")
    with pytest.raises(NotImplementedError, match="cropbench.harness.memory_reference"):
        zarr_stages.ZarrStages().setup({"default": str(tiny_plate)}, "random")


@pytest.mark.parametrize("piece", sorted(common.TRACK_MODULES))
def test_every_track_module_the_suites_call_is_in_this_checkout(piece: str) -> None:
    assert common.import_track_piece(piece).__name__ == common.TRACK_MODULES[piece]


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


def test_the_relative_costs_reference_is_the_datasets_crops_border_crops_included(tiny_plate: Path) -> None:
    dataset = common.crop_dataset(tiny_plate, common.crop_config(crop_size=64, dtype="float32"))
    reference = common.memory_reference(dataset)
    assert reference.padded.any(), "no border crop tested"
    for index in range(len(dataset)):
        assert torch.equal(reference(index), dataset[index]["image"])


def test_relative_cost_rises_with_a_slower_crop_path(tiny_plate: Path) -> None:
    dataset = common.crop_dataset(tiny_plate, common.crop_config(crop_size=64))
    ceiling = common.memory_reference(dataset)
    indices = common.access_order(dataset, "random", common.BLOCK * 20)

    def ten_times(index: int) -> None:
        for _ in range(10):
            ceiling(index)

    # Ten times the work, not three: with two busy loops beside the test, whichever of the pair reads a
    # block first pays cold CPU caches, and a mean of per-block ratios then put identical paths at 2.35
    # and three-fold work at only 1.2 times that. Ten-fold work stays clear of that noise.
    same = common.relative_cost(ceiling, ceiling, indices)
    slower = common.relative_cost(ten_times, ceiling, indices)
    assert slower > 1.5 * same


def test_trimmed_mean_drops_the_extremes() -> None:
    assert protocol.trimmed_mean([1.0] * 8 + [100.0, -100.0], 0.1) == 1.0
    assert protocol.trimmed_mean([1.0, 2.0, 3.0], 0.0) == 2.0


def test_access_order_continues_into_further_epochs(tiny_plate: Path) -> None:
    dataset = common.crop_dataset(tiny_plate, common.crop_config(crop_size=64))
    order = common.access_order(dataset, "grouped-field", 2 * len(dataset) + 3)
    assert len(order) == 2 * len(dataset) + 3
    assert sorted(order[: len(dataset)]) == list(range(len(dataset)))


def _benchmark_methods(suite: type) -> list[str]:
    return sorted(name for name in vars(suite) if name.split("_", 1)[0] in ("time", "track", "peakmem"))


@pytest.mark.parametrize("suite", FULL_SUITES, ids=lambda s: s.__name__)
def test_full_grid_suites_skip_unless_the_full_grid_is_asked(suite: Any, tiny_plate: Path) -> None:
    first = [values[0] for values in suite.params]
    assert suite.setup_cache is not common.Suite.setup_cache
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
            assert getattr(suite, name).unit, f"{name} has no unit"


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


def test_sampler_stream_yields_the_access_order_across_epochs(tiny_plate: Path) -> None:
    dataset = common.crop_dataset(tiny_plate, common.crop_config(crop_size=64))
    for access in ("random", "grouped-field"):
        order = common.access_order(dataset, access, 2 * len(dataset) + 5)
        seen: list[int] = []
        get = common.sampled(seen.append, dataset, access)
        for expected in order:
            get(expected)
        assert seen == order


def test_decode_work_counts_a_chunk_decoded_twice(tiny_plate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stats count each chunk once however often it is decoded; the decode step's counters count the work."""
    crop = common.crop_config(crop_size=64, chunk_cache_bytes=0)
    dataset = common.crop_dataset(tiny_plate, crop)
    indices = common.access_order(dataset, "random", len(dataset))
    once = common.decode_work(str(tiny_plate), crop, "random", indices)
    loader = importlib.import_module("cropbench.formats.direct.loads").ChunkLoader
    load = loader.load

    def twice(self: Any, reads: Any, *copies: Any) -> Any:
        load(self, reads, *copies)
        return load(self, reads, *copies)

    monkeypatch.setattr(loader, "load", twice)
    doubled = common.decode_work(str(tiny_plate), crop, "random", indices)
    assert once.decode_calls > 0 and doubled.stats.bytes_decoded == once.stats.bytes_decoded
    assert (doubled.decode_calls, doubled.decoded_bytes) == (2 * once.decode_calls, 2 * once.decoded_bytes)


def test_stage_costs_are_parts_of_the_relative_cost(tiny_plate: Path) -> None:
    crop = common.crop_config(crop_size=64, chunk_cache_bytes=0)
    dataset = common.stage_timed_dataset(str(tiny_plate), crop)
    indices = common.access_order(dataset, "random", common.BLOCK * 10)
    costs = common.stage_costs(dataset, dataset.__getitem__, common.memory_reference(dataset), indices)
    assert sorted(costs) == ["assemble", "decode", "fetch"]
    assert all(cost > 0.0 for cost in costs.values()), costs


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


def _suite_classes() -> list[type]:
    """Every class with benchmarks in every module of benchmarks/ (what asv collects)."""
    suites = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        if path.stem in ("__init__", "common"):
            continue
        module = importlib.import_module(f"benchmarks.{path.stem}")
        for _name, suite in sorted(vars(module).items()):
            if isinstance(suite, type) and suite.__module__ == module.__name__ and _benchmark_methods(suite):
                suites.append(suite)
    return suites


@pytest.mark.parametrize("suite", _suite_classes(), ids=lambda s: f"{s.__module__}.{s.__name__}")
def test_every_teardown_tolerates_a_setup_that_skipped(suite: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """asv calls ``teardown`` after a ``setup`` that raised NotImplementedError; a teardown error is a failure."""
    monkeypatch.delenv(common.FULL_GRID_SWITCH, raising=False)

    # No plate was generated and no cropbench module is there (an old commit): every case skips.
    real_import = builtins.__import__

    def older_commit(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("cropbench"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", older_commit)
    monkeypatch.setattr(common, "TRACK_MODULES", dict.fromkeys(common.TRACK_MODULES, "cropbench.not_yet"))
    params = [values[0] for values in getattr(suite, "params", ())]
    instance = suite()
    with pytest.raises(NotImplementedError):
        instance.setup({}, *params)
    teardown = getattr(instance, "teardown", None)
    if teardown is not None:
        teardown({}, *params)


def test_the_remote_teardown_runs_after_the_skip_of_a_missing_server(monkeypatch: pytest.MonkeyPatch) -> None:
    remote = importlib.import_module("benchmarks.remote")
    monkeypatch.setattr(remote, "CLIENT_PACKAGES", {"direct": (), "zarr": ()})
    endpoints = importlib.import_module("cropbench.measure.endpoints")
    monkeypatch.setattr(endpoints, "nginx_binary", lambda: None)
    store = remote.Store()
    with pytest.raises(NotImplementedError, match="nginx is not installed"):
        store.setup({"default": "unused"}, "direct")
    store.teardown({"default": "unused"}, "direct")


@pytest.mark.parametrize("suite_name", ["ZarrStages", "ZarrCounts"])
def test_zarr_stage_benchmarks_run_and_split_the_zarr_path(
    suite_name: str, tiny_plate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zarr_stages = importlib.import_module("benchmarks.zarr_stages")
    monkeypatch.setattr(zarr_stages, "RELATIVE_BLOCKS", 3)  # the real 120 blocks of zarr crops take minutes
    monkeypatch.setattr(zarr_stages, "COUNTED_CROPS", 40)
    suite = getattr(zarr_stages, suite_name)
    assert len(suite.params) == len(suite.param_names)
    for access in suite.params[0]:
        instance = suite()
        instance.setup({"default": str(tiny_plate)}, access)
        values = {name: getattr(instance, name)(access) for name in _benchmark_methods(suite)}
        assert all(isinstance(value, float) and value > 0.0 for value in values.values()), values
        assert all(getattr(suite, name).unit for name in values)
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
    instructions = importlib.import_module("benchmarks.instructions")
    measure = importlib.import_module("cropbench.measure.instructions")
    monkeypatch.setattr(instructions.shutil, "which", lambda name: f"/usr/bin/{name}")
    suite = getattr(instructions, suite_name)
    assert suite.params == (list(suite.params[0]),) and len(suite.params) == len(suite.param_names)
    instance = suite()
    instance.setup({"default": str(tiny_plate)}, *params)
    assert (instance.workload.decode, instance.workload.access) == (decode, params[0])
    assert instance.workload.crops == instructions.CROPS[decode]
    counted: list[Any] = []
    instance.measure = lambda workload: counted.append(workload) or measure.InstructionCount(100, 900, 20, 100)
    assert instance.track_instructions_per_crop(*params) == 10.0
    assert counted == [instance.workload]
    assert suite.track_instructions_per_crop.unit == measure.UNIT


def test_instruction_benchmarks_skip_without_valgrind_or_ome_arrow(monkeypatch: pytest.MonkeyPatch) -> None:
    instructions = importlib.import_module("benchmarks.instructions")
    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    with pytest.raises(NotImplementedError, match="valgrind is not installed: apt-get install -y valgrind"):
        instructions.ZarrReads().setup({"default": "plate.zarr"}, "random")
    unavailable = {"ome-arrow": common.UNAVAILABLE + "ome-arrow is not installed"}
    with pytest.raises(NotImplementedError, match="ome-arrow is not installed"):
        instructions.ArrowReads().setup(unavailable, "direct")
