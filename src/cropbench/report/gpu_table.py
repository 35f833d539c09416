"""The GPU check's answer as Markdown tables, read from a results.jsonl.

    python scripts/gpu_table.py OUT/results.jsonl > OUT/summary.txt

What the GPU demands (Track 3 compute-only rows), what the loader supplies per read path, pipeline
(the tier made in the workers, or on the device from raw uint16 batches) and worker count (Track 2),
how supply scales from 0 workers, worker start-up at the most workers, supply over demand (Track 3:
the loader alone after each loop, over the compute-only rate of the same model and batch), Track 3's
end-to-end loops with the fewest workers that keep the GPU >= 90% busy, the threads-vs-workers split
and the loader overhead. The standard library, the metric names and the track names (:mod:`cropbench.metrics`,
:mod:`cropbench.records`), so it runs wherever cropbench's src/ is on the path.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.records import LOADER_TRACK as LOADER
from cropbench.records import TRAINING_TRACK as TRAINING
from cropbench.records import track_name

#: Worker scaling that counts as paying off: 2 workers at least this many times 0 workers.
TWO_WORKER_TARGET = 1.6


def _number(value: Any, fmt: str = "{:,.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def _layout(record: dict[str, Any]) -> str:
    plate = str(record.get("config", {}).get("plate", ""))
    return Path(plate).name.removesuffix(".zarr") or "?"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def machine(rows: list[dict[str, Any]]) -> list[str]:
    env = next(
        (r["environment"] for r in rows if r.get("environment", {}).get("gpu_name")),
        rows[0].get("environment", {}) if rows else {},
    )
    packages = env.get("packages", {})
    return [
        f"GPU: {env.get('gpu_name', 'none')} (driver {env.get('driver')}, CUDA {env.get('cuda_version')}); "
        f"CPU: {env.get('cpu_model')}, {env.get('cpu_affinity')} usable of {env.get('cpu_logical')} logical cores; "
        f"RAM {env.get('ram_bytes', 0) / 2**30:.0f} GiB; Python {env.get('python')}, torch {packages.get('torch')}, "
        f"torchvision {packages.get('torchvision')}, zarr {packages.get('zarr')}",
    ]


def demand(rows: list[dict[str, Any]]) -> tuple[list[str], dict[tuple[str, str], float]]:
    found = [r for r in rows if r["track"] == TRAINING and r["case"].endswith("/compute-only")]
    rates = {(r["config"]["workload"], r["config"]["amp"]): r["metrics"][m.COMPUTE_ONLY_IMAGES_PER_S] for r in found}
    body = [
        [
            r["config"]["workload"],
            "fp32" if r["config"]["amp"] == "off" else r["config"]["amp"],
            _number(r["metrics"][m.COMPUTE_ONLY_IMAGES_PER_S]),
            _number(r["metrics"][m.COMPUTE_ONLY_STEP_P50_MS], "{:.2f}"),
            _number(r["metrics"][m.prefixed(m.COMPUTE_ONLY, m.STEP_P95_MS)], "{:.2f}"),
        ]
        for r in found
    ]
    lines = ["## Demand: ResNet-18, batch 256 of 96 × 96 × 5 crops already on the GPU (compute only)", ""]
    header = ["workload", "precision", "images/s", "step p50 ms", "step p95 ms"]
    lines += _table(header, body) if body else ["(no rows)"]
    return lines, rates


def _pipeline(record: dict[str, Any]) -> str:
    """Where the row's tier ran: ``dataset`` (in the workers) or ``device`` (rows before it: dataset)."""
    return str(record["config"].get("pipeline", "dataset"))


def _bytes(metrics: dict[str, Any], key: str) -> str:
    value = metrics.get(key)
    return "–" if value is None else f"{value / 1024:,.0f} KiB" if value else "0"


def supply(rows: list[dict[str, Any]], rates: dict[tuple[str, str], float]) -> list[str]:
    sweeps: dict[tuple[str, str, str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        loader = r["config"].get("loader", {})
        if r["track"] != LOADER or loader.get("persistent_workers") or loader.get("batch_size") != 256:
            continue
        crop = r["config"]["crop"]
        sweeps[(_layout(r), crop["decode"], crop["tier"], _pipeline(r))][int(loader["num_workers"])] = r["metrics"]
    workers = sorted({w for sweep in sweeps.values() for w in sweep})
    train, embed = rates.get(("train", "bf16")), rates.get(("embed", "bf16"))
    lines = [
        "## Supply: Track 2 steady samples/s, batch 256, float32 crops (dataset pipeline: made in the workers,",
        "pinned by the DataLoader; device pipeline: uint16 from the workers, reused pinned buffers, tier on the GPU)",
        "",
    ]
    if not sweeps:
        return [*lines, "(no rows)"]
    body = []
    for (layout, decode, tier, pipeline), sweep in sweeps.items():
        base, two, most = sweep.get(0, {}), sweep.get(2, {}), sweep.get(max(sweep), {})
        ratio = two[m.SAMPLES_PER_S] / base[m.SAMPLES_PER_S] if base.get(m.SAMPLES_PER_S) and two else None
        top = most.get(m.SAMPLES_PER_S, 0) / base[m.SAMPLES_PER_S] if base.get(m.SAMPLES_PER_S) else None
        checks = all(row.get(m.CROSSCHECK_OK) for row in sweep.values())
        body.append(
            [
                layout,
                decode,
                tier,
                pipeline,
                str(most.get(m.TRANSFORM_DEVICE, "–")),
                _bytes(most, m.BYTES_WORKER_TO_MAIN_PER_SAMPLE),
                *(_number(sweep.get(w, {}).get(m.SAMPLES_PER_S)) for w in workers),
                _number(top, "{:.1f}×"),
                "–" if ratio is None else f"{ratio:.2f}× ({'yes' if ratio >= TWO_WORKER_TARGET else 'no'})",
                _number(most.get(m.SAMPLES_PER_S, 0) / train if train else None, "{:.2f}"),
                _number(most.get(m.SAMPLES_PER_S, 0) / embed if embed else None, "{:.2f}"),
                "yes" if checks else "NO",
            ]
        )
    lines += _table(
        [
            "layout",
            "read path",
            "transforms",
            "pipeline",
            "tier ran on",
            "worker → main per sample",
            *(f"w{w}" for w in workers),
            f"w{workers[-1]} / w0",
            f"w2 / w0 (≥ {TWO_WORKER_TARGET}×?)",
            "most workers ÷ bf16-train demand",
            "÷ bf16-embed demand",
            "cross-check",
        ],
        body,
    )
    return lines


def supply_over_demand(rows: list[dict[str, Any]]) -> list[str]:
    """Track 3: per loop configuration, the row at the most workers: the loader alone over the compute-only
    rate of the same model and batch, beside the loop's own data wait."""
    best: dict[tuple[str, str, str, str, str, str], dict[str, Any]] = {}
    for r in rows:
        if r["track"] != TRAINING or m.SUPPLY_OVER_DEMAND not in r["metrics"]:
            continue
        config = r["config"]
        key = (_layout(r), config["model"], config["workload"], config["amp"], _pipeline(r), config["crop"]["tier"])
        held = best.get(key)
        if held is None or config["loader"]["num_workers"] > held["config"]["loader"]["num_workers"]:
            best[key] = r  # the first row of the most workers: a search's, before a split's of as many
    lines = [
        "## Supply over demand: the loader alone (Track 3, after each loop) ÷ compute-only images/s, most workers",
        "",
    ]
    body = [
        [
            layout,
            model,
            workload,
            "fp32" if amp == "off" else amp,
            pipeline,
            tier,
            str(r["config"]["loader"]["num_workers"]),
            _bytes(r["metrics"], m.BYTES_HOST_TO_DEVICE_PER_SAMPLE),
            _number(r["metrics"].get(m.SUPPLY_SAMPLES_PER_S)),
            _number(r["metrics"].get(m.COMPUTE_ONLY_IMAGES_PER_S)),
            _number(r["metrics"][m.SUPPLY_OVER_DEMAND], "{:.2f}"),
            _number(100 * r["metrics"][m.DATA_WAIT_FRACTION], "{:.1f}%"),
            _number(r["metrics"].get(m.IMAGES_PER_S)),
        ]
        for (layout, model, workload, amp, pipeline, tier), r in best.items()
    ]
    header = [
        "layout",
        "model",
        "workload",
        "precision",
        "pipeline",
        "transforms",
        "workers",
        "host → device per sample",
        "supply samples/s",
        "demand images/s",
        "supply ÷ demand",
        "data wait",
        "loop images/s",
    ]
    return lines + (_table(header, body) if body else ["(no rows)"])


def thread_splits(rows: list[dict[str, Any]]) -> list[str]:
    splits = [r for r in rows if r["track"] == TRAINING and r["metrics"].get("splits")]
    if not splits:
        return []
    lines = ["## Threads against workers at a fixed core count (Track 3, workers x decode threads)", ""]
    for r in splits:
        metrics = r["metrics"]
        best = metrics.get(m.BEST_SPLIT)
        fastest = f"fastest {best}" if best else "no split to name: every split's row carries a flag"
        lines += [f"{_layout(r)}: {r['case']} — {fastest}", ""]
        body = [
            [
                name,
                _number(rate),
                _number(None if wait is None else 100 * wait, "{:.1f}%"),
                _number(ratio, "{:.2f}"),
            ]
            for name, rate, wait, ratio in zip(
                metrics[m.SPLITS],
                metrics[m.IMAGES_PER_S_BY_SPLIT],
                metrics[m.DATA_WAIT_FRACTION_BY_SPLIT],
                metrics[m.SUPPLY_OVER_DEMAND_BY_SPLIT],
                strict=True,
            )
        ]
        lines += [*_table(["split", "images/s", "data wait", "supply ÷ demand"], body), ""]
    return lines[:-1]


def overhead(rows: list[dict[str, Any]]) -> list[str]:
    found = [r for r in rows if r["track"] == LOADER and m.LOADER_OVER_BATCHED in r["metrics"]]
    if not found:
        return []
    body = [
        [
            _layout(r),
            str(r["config"]["loader"]["num_workers"]),
            str(r["config"]["crop"]["decode_threads"]),
            str(r["metrics"][m.READER_THREADS]),
            _number(r["metrics"][m.LOADER_BATCHES_PER_S], "{:,.1f}"),
            _number(r["metrics"][m.BATCHED_BATCHES_PER_S], "{:,.1f}"),
            _number(r["metrics"][m.LOADER_OVER_BATCHED], "{:.2f}"),
            f"{r['metrics'][m.RATIO_Q1]:.2f}-{r['metrics'][m.RATIO_Q3]:.2f}",
        ]
        for r in found
    ]
    lines = ["## Loader overhead: uint16 batches/s through the DataLoader ÷ Track 1's batched rate, interleaved", ""]
    header = ["layout", "workers", "threads per worker", "batched threads", "loader", "batched", "ratio", "block IQR"]
    return lines + _table(header, body)


def startup(rows: list[dict[str, Any]]) -> list[str]:
    t2 = [r for r in rows if r["track"] == LOADER and m.FIRST_BATCH_MS in r["metrics"]]
    if not t2:
        return []
    most = max(r["config"]["loader"]["num_workers"] for r in t2)
    body = [
        [
            _layout(r),
            r["config"]["crop"]["decode"],
            r["config"]["crop"]["tier"],
            _pipeline(r),
            "yes" if r["config"]["loader"].get("persistent_workers") else "no",
            _number(r["metrics"].get(m.ITER_CREATE_MS), "{:.0f}"),
            _number(r["metrics"][m.FIRST_BATCH_MS], "{:.0f}"),
            _number(r["metrics"].get(m.EPOCH2_FIRST_BATCH_MS), "{:.0f}"),
            _number(r["metrics"].get(m.WORKER_USS_MIB_MAX), "{:.0f}"),
        ]
        for r in t2
        if r["config"]["loader"]["num_workers"] == most
    ]
    lines = [f"## Start-up at {most} workers (Track 2, batch 256)", ""]
    return lines + _table(
        [
            "layout",
            "read path",
            "transforms",
            "pipeline",
            "persistent",
            "iter() ms",
            "first batch ms",
            "epoch-2 first batch ms",
            "worker USS MiB",
        ],
        body,
    )


def end_to_end(rows: list[dict[str, Any]]) -> list[str]:
    t3 = [r for r in rows if r["track"] == TRAINING and not r["case"].endswith("/compute-only")]
    searches = [r for r in t3 if r["case"].endswith("/min-workers")]
    loops = [r for r in t3 if m.DATA_WAIT_FRACTION in r["metrics"]]
    lines = ["## Track 3 end to end: fewest workers for >= 90% busy (data wait < 10%)", ""]
    body = [
        [
            _layout(s),
            s["case"].removesuffix("/min-workers"),
            str(s["metrics"][m.MIN_WORKERS_ANSWER]),
            ", ".join(
                f"w{w}: {100 * d:.0f}%"
                for w, d in zip(
                    s["metrics"][m.TRIED_WORKERS], s["metrics"][m.DATA_WAIT_FRACTION_BY_WORKERS], strict=True
                )
            ),
            _number(s["metrics"].get(m.COMPUTE_ONLY_IMAGES_PER_S)),
        ]
        for s in searches
    ]
    lines += (
        _table(["layout", "search", "min workers", "data wait by workers", "compute-only images/s"], body)
        if body
        else ["(no search finished)"]
    )
    lines += ["", "Every loop:", ""]
    body = [
        [
            _layout(r),
            re.sub(r"/b256/pin", "", r["case"]),
            _number(r["metrics"][m.IMAGES_PER_S]),
            _number(r["metrics"][m.STEP_P50_MS], "{:.1f}"),
            _number(r["metrics"][m.STEP_P95_MS], "{:.1f}"),
            _number(100 * r["metrics"][m.DATA_WAIT_FRACTION], "{:.1f}%"),
            _number(r["metrics"].get(m.GPU_UTIL_MEAN), "{:.0f}%"),
            _number(r["metrics"].get(m.FIRST_BATCH_MS), "{:.0f}"),
            _number(r["metrics"].get(m.CROSSCHECK_GAP), "{:+.2f}"),
        ]
        for r in loops
    ]
    lines += (
        _table(
            [
                "layout",
                "case",
                "images/s",
                "step p50 ms",
                "step p95 ms",
                "data wait",
                "NVML util",
                "first batch ms",
                "stall gap",
            ],
            body,
        )
        if body
        else ["(no rows)"]
    )
    return lines


def main(argv: list[str]) -> int:
    """Print the tables of the one results.jsonl named in ``argv`` (the arguments, no program name)."""
    usage = f"usage: cropbench gpu-table RESULTS_JSONL\n\n{__doc__}"
    if argv in (["-h"], ["--help"]):
        print(usage)
        return 0
    if len(argv) != 1:
        print(usage, file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line.strip()]
    for row in rows:
        row["track"] = track_name(row["track"])  # rows written before the tracks were named read as named
    demand_lines, rates = demand(rows)
    parts = [
        machine(rows),
        demand_lines,
        supply(rows, rates),
        supply_over_demand(rows),
        startup(rows),
        end_to_end(rows),
        thread_splits(rows),
        overhead(rows),
    ]
    print("\n\n".join("\n".join(part) for part in parts if part))
    return 0
