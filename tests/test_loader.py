"""Loader construction: knob validation, fixed schedules, cheap collate, seeded workers, memory probes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import Dataset, SequentialSampler

from cropbench.config import CropConfig
from cropbench.data.dataset import CropDataset, SegmentPool
from cropbench.data.loader import (
    LoaderSpec,
    ScheduledSampler,
    SegmentReturns,
    TimedCollate,
    build_loader,
    memory_of,
    pickled_size,
    schedule,
    segment_of,
    stack_collate,
)
from cropbench.data.sampling import RandomObjectSampler, sampler_for
from cropbench.errors import ConfigError


@pytest.mark.parametrize(
    "knobs",
    [
        {"num_workers": -1},
        {"batch_size": 0},
        {"collate": "fancy"},
        {"start_method": "thread"},
        {"persistent_workers": True},
        {"prefetch_factor": 4},
        {"num_workers": 2, "prefetch_factor": 0},
    ],
)
def test_loader_spec_rejects_knobs_that_do_not_apply(knobs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        LoaderSpec(**knobs)


def test_loader_spec_label_names_every_non_default_knob() -> None:
    assert LoaderSpec().label == "w0/b64"
    spec = LoaderSpec(
        num_workers=2,
        batch_size=16,
        pin_memory=True,
        persistent_workers=True,
        prefetch_factor=4,
        collate="stack",
        start_method="forkserver",
    )
    assert spec.label == "w2/b16/pin/persistent/prefetch4/stack-collate/forkserver"


def test_schedule_continues_into_the_next_sampler_epoch() -> None:
    orders = schedule(RandomObjectSampler(10, seed=3), per_epoch=8, epochs=3)
    assert [len(order) for order in orders] == [8, 8, 8]
    flat = np.concatenate(orders)
    assert sorted(flat[:10].tolist()) == list(range(10)), "the first 10 indices are one full sampler epoch"
    assert orders[0].tolist() != orders[1].tolist()
    again = schedule(RandomObjectSampler(10, seed=3), per_epoch=8, epochs=3)
    assert all(a.tolist() == b.tolist() for a, b in zip(orders, again, strict=True))


def test_scheduled_sampler_switches_epochs_and_rejects_unknown_ones() -> None:
    sampler = ScheduledSampler([np.array([3, 1]), np.array([0, 2, 4])])
    assert list(sampler) == [3, 1] and len(sampler) == 2
    sampler.set_epoch(1)
    assert list(sampler) == [0, 2, 4] and len(sampler) == 3
    with pytest.raises(ConfigError):
        sampler.set_epoch(2)
    with pytest.raises(ConfigError):
        ScheduledSampler([])


def test_stack_collate_keeps_images_and_numeric_columns_only(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32, dtype="uint16"))
    batch = stack_collate([dataset[i] for i in range(4)])
    assert set(batch) == {"image", "index", "object_id", "field_index"}
    assert batch["image"].shape == (4, 5, 32, 32) and batch["image"].dtype == torch.uint16
    assert batch["index"].tolist() == [0, 1, 2, 3] and batch["index"].dtype == np.int64
    assert torch.equal(batch["image"][2], dataset[2]["image"])


def test_timed_collate_adds_a_plain_integer_duration(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32))
    batch = TimedCollate(stack_collate)([dataset[i] for i in range(3)])
    assert isinstance(batch["collate_ns"], int) and batch["collate_ns"] > 0


class RandomNumbers(Dataset[dict[str, Any]]):
    """Items drawn from the global numpy RNG: reproducible only if workers are seeded."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"image": torch.tensor([np.random.random()]), "index": index}


@pytest.mark.slow
def test_seeded_workers_make_batches_reproducible(tiny_plate: Path) -> None:
    spec = LoaderSpec(num_workers=2, batch_size=4)
    sampler = ScheduledSampler([np.arange(8)])

    def draw(seed: int) -> list[float]:
        loader = build_loader(RandomNumbers(), spec, sampler, seed)
        return [value for batch in loader for value in batch["image"].flatten().tolist()]

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32, tier="typical"))
    orders = schedule(sampler_for(dataset, "random", 1), 24, 1)

    def crops() -> list[torch.Tensor]:
        loader = build_loader(dataset, spec, ScheduledSampler(orders), 1)
        return [batch["image"] for batch in loader]

    first, second = crops(), crops()
    assert len(first) == 6 and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_a_segment_pool_fills_a_segment_again_only_once_its_ticket_comes_back() -> None:
    returns = SegmentReturns(workers=2, slots=2)
    pool = SegmentPool(returns.table, worker=1)
    first = pool.tensor((4, 3, 5), torch.uint16)
    second = pool.tensor((4, 3, 5), torch.uint16)
    assert first.is_shared() and first.shape == (4, 3, 5) and first.is_contiguous()
    (worker, slot, ticket), other = segment_of(first), segment_of(second)  # type: ignore[misc]
    assert worker == 1 and other is not None and other[1] != slot
    unpooled = pool.tensor((4, 3, 5), torch.uint16)  # both segments out: a fresh one, outside the pool
    assert unpooled.is_shared() and segment_of(unpooled) is None
    returns.table[1, slot] = ticket - 1  # a stale ticket returns nothing
    assert segment_of(pool.tensor((4, 3, 5), torch.uint16)) is None
    returns.table[1, slot] = ticket
    again = pool.tensor((4, 3, 5), torch.uint16)
    assert again.data_ptr() == first.data_ptr() and segment_of(again) == (1, slot, segment_of(again)[2])  # type: ignore[index]
    assert segment_of(again)[2] > ticket  # type: ignore[index]
    returns.table[1, other[1]] = other[2]  # returned, but the wrong size: the segment is replaced
    shorter = pool.tensor((2, 3, 5), torch.float32)
    assert shorter.dtype == torch.float32 and segment_of(shorter) is not None and segment_of(shorter)[1] == other[1]  # type: ignore[index]


def test_segment_returns_give_back_a_segment_once_nothing_holds_its_storage() -> None:
    returns = SegmentReturns(workers=1, slots=3)
    pooled = SegmentPool(returns.table, worker=0).tensor((2, 8), torch.int16)
    pooled.fill_(7)
    # The main process's own mapping of the segment (another process in a real loader).
    image = torch.empty(0, dtype=torch.int16).set_(pooled.untyped_storage().clone().share_memory_(), 0, (2, 8), (8, 1))
    _, slot, ticket = segment_of(image)  # type: ignore[misc]
    returns.watch({"image": image})
    returns.watch({"image": torch.zeros(2, 8, dtype=torch.int16)})  # not a pooled segment: ignored
    view = image[1]
    del image
    returns.collect()
    assert returns.table[0, slot] == 0  # a view still holds it
    del view
    returns.collect()
    assert returns.table[0, slot] == ticket


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["uint16", "float32"])
def test_a_worker_fills_returned_batch_segments_again_and_never_one_still_held(tiny_plate: Path, dtype: str) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32, dtype=dtype))
    spec = LoaderSpec(num_workers=1, batch_size=8, collate="stack")
    orders = schedule(sampler_for(dataset, "random", 0), 8 * 12, 1)
    expected = [dataset.__getitems__(orders[0][i : i + 8].tolist()).image for i in range(0, 8 * 12, 8)]
    segments = []
    for batch, want in zip(build_loader(dataset, spec, ScheduledSampler(orders)), expected, strict=True):
        segments.append(segment_of(batch["image"]))  # each batch is dropped at the next step
        assert torch.equal(batch["image"], want)
    assert None not in segments, "every batch is handed over in a pooled segment"
    assert len({segment[:2] for segment in segments if segment}) < len(segments), "segments are filled again"
    held = [batch["image"] for batch in build_loader(dataset, spec, ScheduledSampler(orders))]
    assert all(torch.equal(got, want) for got, want in zip(held, expected, strict=True))


def test_memory_of_reports_the_processes_it_is_given() -> None:
    metrics = memory_of([os.getpid()])
    assert metrics["main_rss_mib"] > 0 and metrics["worker_rss_mib_max"] > 0
    assert metrics["worker_uss_mib_max"] <= metrics["worker_rss_mib_max"]
    assert "worker_rss_mib" not in memory_of([])


def test_dataset_pickles_small(tiny_plate: Path) -> None:
    assert 0 < pickled_size(CropDataset(tiny_plate, CropConfig(crop_size=32))) < 1_000_000


def kill_if_still_running(processes: list[psutil.Process]) -> None:
    """SIGKILL each process that is still the one seen when its handle was taken.

    A handle remembers its process's start time, so a process that exited, and any other process
    that reused its pid since, is left alone (a bare ``os.kill(pid)`` after the fact could hit it).
    """
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running():
                process.kill()


def test_kill_if_still_running_leaves_an_exited_process_pid_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen(["sleep", "30"])
    handle = psutil.Process(child.pid)
    child.kill()
    child.wait()  # reaped: its pid is free for any new process
    signalled: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, number: signalled.append(pid))
    kill_if_still_running([handle])
    assert signalled == []


def test_kill_if_still_running_ends_a_live_process() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        kill_if_still_running([psutil.Process(child.pid)])
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


FROZEN_WORKER = """
import os, signal, sys, time
import torch
from torch.utils.data import Dataset, SequentialSampler
from cropbench.data.loader import LoaderSpec, build_loader, worker_pids
from cropbench.data.sampling import RandomObjectSampler

class Tensors(Dataset):
    def __len__(self):
        return 4096
    def __getitem__(self, index):
        time.sleep(float(sys.argv[2]))
        return {"image": torch.full((3, 32, 32), float(index))}

loader = build_loader(Tensors(), LoaderSpec(num_workers=2, batch_size=8, timeout_s=float(sys.argv[1])),
                      RandomObjectSampler(4096, seed=0))
iterator = iter(loader)
next(iterator)
pids = worker_pids(iterator)
print(*pids, flush=True)
time.sleep(float(sys.argv[3]))
os.kill(pids[0], signal.SIGSTOP)
stopped = time.monotonic()
try:
    for _ in range(10_000):
        next(iterator)
except Exception as error:
    print(f"{time.monotonic() - stopped:.2f} {type(error).__name__}: {error}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("item_s", "stop_after_s"),
    [(0.0, 1.0), (0.05, 0.0)],
    ids=["queues-full", "batch-under-way"],
)
def test_a_worker_stopped_mid_epoch_surfaces_as_one_error_within_the_deadline(
    item_s: float, stop_after_s: float
) -> None:
    """SIGSTOP one worker. With the queues full, the main process would block fetching a batch's
    shared-memory descriptor from it, past torch's timeout: the watchdog ends that wait. With the
    worker's batch still under way, torch's own timeout ends the wait first: the stopped worker is
    killed all the same (left alive, it would hang the process's exit, which joins it)."""
    from cropbench.data.loader import WATCHDOG_MARGIN_S

    timeout_s = 2.0
    command = [sys.executable, "-c", FROZEN_WORKER, str(timeout_s), str(item_s), str(stop_after_s)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    workers = [psutil.Process(int(pid)) for pid in process.stdout.readline().split()]
    assert all(worker.ppid() == process.pid for worker in workers), "the pids printed are the subprocess's workers"
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        output = "still blocked after 60 s"
    finally:
        kill_if_still_running(workers)  # never leave a stopped worker behind
        process.kill()  # Popen signals only a child it has not reaped yet
        process.wait()
    seconds, _, message = output.strip().partition(" ")
    assert message.startswith("WorkerError:") and "(stopped)" in message and "timeout_s=2" in message, output
    assert float(seconds) < timeout_s + WATCHDOG_MARGIN_S + 10, "ends near the stated deadline, not in a hang"


@pytest.mark.parametrize(
    "knobs",
    [
        {"timeout_s": float("nan")},
        {"timeout_s": float("inf")},
        {"timeout_s": "5"},
        {"timeout_s": True},
        {"num_workers": True},
        {"num_workers": 10_000},
        {"num_workers": 2.0},
        {"batch_size": True},
        {"pin_memory": "no"},
        {"num_workers": 2, "persistent_workers": 1},
        {"num_workers": 2, "prefetch_factor": 1.5},
        {"num_workers": 2, "prefetch_factor": True},
    ],
)
def test_loader_spec_refuses_at_construction_in_one_line_naming_the_field(knobs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as raised:
        LoaderSpec(**knobs)
    message = str(raised.value)
    assert message.startswith(list(knobs)[-1]) and "\n" not in message


class _EnvironmentOf(Dataset[str]):
    """Each item: the worker's value of one environment variable."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> str:
        return os.environ.get(self.name, "unset")


def test_forkserver_workers_see_the_store_variables_set_after_their_server_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The forkserver keeps the environment it started with; a store endpoint or key set later (a test's
    # loopback store, a notebook's os.environ) must still reach the workers of a loader built after it.
    spec = LoaderSpec(num_workers=1, batch_size=2, start_method="forkserver")
    name = "AWS_CROPBENCH_LOADER_TEST"
    monkeypatch.delenv(name, raising=False)
    assert next(iter(build_loader(_EnvironmentOf(name), spec, SequentialSampler(range(2))))) == ["unset"] * 2
    monkeypatch.setenv(name, "set after the server started")
    batch = next(iter(build_loader(_EnvironmentOf(name), spec, SequentialSampler(range(2)))))
    assert batch == ["set after the server started"] * 2
    monkeypatch.delenv(name)
    assert next(iter(build_loader(_EnvironmentOf(name), spec, SequentialSampler(range(2))))) == ["unset"] * 2
