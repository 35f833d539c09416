"""Instructions per crop: cachegrind's output, differencing, the child's workload, and a real count."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cropbench.errors import ConfigError, StoreError
from cropbench.measure import instructions
from cropbench.measure.instructions import (
    VALGRIND_INSTALL,
    InstructionCount,
    InstructionCountError,
    InstructionWorkload,
    ValgrindUnavailableError,
    count_instructions,
    crop_order,
    measure_instructions,
    parse_cachegrind,
    per_crop,
)

CACHEGRIND_OUTPUT = """\
# callgrind format
version: 1
creator: valgrind-3.19.0
pid: 4242
cmd: python -m cropbench.measure.instructions
events: Ir
fl=/usr/lib/python3.11/ceval.c
fn=_PyEval_EvalFrameDefault
10 2000
summary: 3216300000
"""


def test_parse_cachegrind_reads_the_summary() -> None:
    assert parse_cachegrind(CACHEGRIND_OUTPUT) == 3_216_300_000


def test_parse_cachegrind_finds_ir_among_other_events() -> None:
    text = "events: I1mr Ir Dr\nsummary: 5 123456 7\n"
    assert parse_cachegrind(text) == 123456
    assert parse_cachegrind("events: Ir\ntotals: 99\n") == 99  # older valgrind writes totals:


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not a cachegrind output file"),
        ("events: Ir\n", "not a cachegrind output file"),
        ("events: Dr Dw\nsummary: 1 2\n", "not instructions"),
        ("events: Dr Ir\nsummary: 1\n", "no count for Ir"),
        ("events: Ir\nsummary: lots\n", "no count for Ir"),
    ],
)
def test_parse_cachegrind_refuses_what_is_not_a_count(text: str, message: str) -> None:
    with pytest.raises(InstructionCountError, match=message):
        parse_cachegrind(text, "out.file")


def test_per_crop_differences_the_two_runs() -> None:
    # start-up (1,000) and the warm-up drop out: only the 80 extra crops remain
    assert per_crop(1_000 + 20 * 50, 1_000 + 100 * 50, 20, 100) == 50.0
    assert InstructionCount(1_200, 2_000, 20, 100).per_crop == 10.0


def test_per_crop_refuses_a_larger_run_that_counted_less() -> None:
    with pytest.raises(InstructionCountError, match="not more than the run of 20"):
        per_crop(2_000, 1_500, 20, 100)
    with pytest.raises(ValueError, match="must read more crops"):
        per_crop(1, 2, 100, 100)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"decode": "field"}, "decode must be one of"),
        ({"access": "paired"}, "access must be one of"),
        ({"crops": 0}, "crops must be at least 1"),
        ({"scale": 1}, "scale must be at least 2"),
        ({"chunk_cache_bytes": -1}, "chunk_cache_bytes"),
    ],
)
def test_workload_refuses_bad_knobs(knobs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        InstructionWorkload("plate.zarr", **knobs)  # type: ignore[arg-type]


def test_missing_valgrind_is_a_typed_error_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no valgrind on the path
    with pytest.raises(ValgrindUnavailableError, match=VALGRIND_INSTALL):
        measure_instructions(InstructionWorkload(str(tmp_path / "plate.zarr")))


def _fake_valgrind(folder: Path, body: str) -> str:
    """A ``valgrind`` stand-in: a shell script that sees the same arguments."""
    path = folder / "valgrind"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_count_instructions_reads_the_childs_cachegrind_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_plate: Path
) -> None:
    # writes a count that grows with the crops the child is asked for (the last argument's "count")
    body = (
        'for a in "$@"; do case "$a" in --cachegrind-out-file=*) out="${a#*=}";; esac; last="$a"; done\n'
        'count=$(echo "$last" | sed \'s/.*"count": \\([0-9]*\\).*/\\1/\')\n'
        'printf "events: Ir\\nsummary: %d\\n" $((1000 + 7 * count)) > "$out"\n'
    )
    monkeypatch.setattr(instructions, "valgrind_binary", lambda: _fake_valgrind(tmp_path, body))
    measured = measure_instructions(InstructionWorkload(str(tiny_plate), crops=10, scale=3))
    assert (measured.small, measured.large, measured.small_crops, measured.large_crops) == (1070, 1210, 10, 30)
    assert measured.per_crop == 7.0


def test_a_library_path_is_imported_before_anything_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_plate: Path
) -> None:
    seen = tmp_path / "pythonpath"
    body = (
        f'echo "$PYTHONPATH" > {seen}\n'
        'for a in "$@"; do case "$a" in --cachegrind-out-file=*) out="${a#*=}";; esac; done\n'
        'printf "events: Ir\\nsummary: 1000\\n" > "$out"\n'
    )
    monkeypatch.setattr(instructions, "valgrind_binary", lambda: _fake_valgrind(tmp_path, body))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    patched = tmp_path / "patched-zarr" / "src"
    assert count_instructions(InstructionWorkload(str(tiny_plate)), 5, library_path=(str(patched),)) == 1000
    cropbench_source = str(Path(instructions.__file__).resolve().parents[2])
    assert seen.read_text().strip().split(os.pathsep) == [cropbench_source, str(patched), "/elsewhere"]


def test_a_failing_child_is_one_error_naming_the_plate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_plate: Path
) -> None:
    fake = _fake_valgrind(tmp_path, 'echo "MemoryError: out of memory" >&2\nexit 3\n')
    monkeypatch.setattr(instructions, "valgrind_binary", lambda: fake)
    with pytest.raises(InstructionCountError, match=r"tiny\.zarr \(zarr, random\) failed \(exit 3\): MemoryError"):
        count_instructions(InstructionWorkload(str(tiny_plate), decode="zarr"), 5)


def test_a_bad_plate_or_decode_path_is_refused_before_valgrind_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_plate: Path
) -> None:
    calls = tmp_path / "calls"
    fake = _fake_valgrind(tmp_path, f"touch {calls}\n")
    monkeypatch.setattr(instructions, "valgrind_binary", lambda: fake)
    with pytest.raises(StoreError, match="missing"):
        count_instructions(InstructionWorkload(str(tmp_path / "missing.zarr")), 5)
    with pytest.raises(ConfigError, match="decode='as-py' does not apply to the ome-zarr layout"):
        count_instructions(InstructionWorkload(str(tiny_plate), decode="as-py"), 5)
    with pytest.raises(ConfigError, match="crop_size=4096 is larger than the fields of"):
        count_instructions(InstructionWorkload(str(tiny_plate), crop_size=4096), 5)
    assert not calls.exists()


@pytest.mark.parametrize("access", ["random", "grouped-field"])
def test_crop_order_is_seeded_and_visits_every_object_each_epoch(access: str) -> None:
    field_index = np.repeat(np.arange(4), 5)
    order = crop_order(field_index, access, 50, seed=3)
    assert np.array_equal(order, crop_order(field_index, access, 50, seed=3))
    assert not np.array_equal(order, crop_order(field_index, access, 50, seed=4))
    for epoch in (order[:20], order[20:40]):
        assert sorted(epoch.tolist()) == list(range(20))
    if access == "grouped-field":  # one field after the other, objects in order inside each
        fields = field_index[order[:20]]
        assert all(len(set(fields[i : i + 5].tolist())) == 1 for i in range(0, 20, 5))
        assert np.all(np.diff(order[:5]) == 1)


def test_the_child_reads_crops_without_torch(tiny_plate: Path) -> None:
    """The counted process must not import torch (minutes under valgrind) and must read what it is asked for."""
    workload = {"plate": str(tiny_plate), "decode": "zarr", "access": "grouped-field", "crop_size": 16, "count": 7}
    script = (
        "import json, sys\n"
        "from cropbench.measure import instructions\n"
        "arguments = json.loads(sys.argv[1]); count = arguments.pop('count')\n"
        "assert instructions.read_crops(instructions.InstructionWorkload(**arguments), count) == count\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'torch'))\n"
    )
    source = str(Path(instructions.__file__).resolve().parents[2])
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(workload)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": source, **instructions.PINNED_ENVIRONMENT},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason=f"valgrind is not installed: {VALGRIND_INSTALL}")
def test_two_real_counts_agree_within_one_percent(tiny_plate: Path) -> None:
    workload = InstructionWorkload(str(tiny_plate), decode="direct", crop_size=16, crops=50, scale=3)
    first, second = measure_instructions(workload), measure_instructions(workload)
    assert first.per_crop > 0
    assert abs(first.per_crop - second.per_crop) <= 0.01 * first.per_crop


def test_the_child_pins_the_libraries_threads() -> None:
    script = (
        "import pyarrow, zarr\n"
        "from numcodecs import blosc\n"
        "from cropbench.measure.instructions import pin_library_threads\n"
        "pin_library_threads()\n"
        "print(pyarrow.cpu_count(), pyarrow.io_thread_count(), zarr.config.get('threading.max_workers'),"
        " zarr.config.get('async.concurrency'), blosc.use_threads)\n"
    )
    source = str(Path(instructions.__file__).resolve().parents[2])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={"PYTHONPATH": source})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "1", "1", "1", "False"]
