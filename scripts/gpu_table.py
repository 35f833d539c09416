"""The GPU check's answer as Markdown tables, read from a results.jsonl.

    python scripts/gpu_table.py OUT/results.jsonl > OUT/summary.txt

What the GPU demands (Track 3 compute-only rows), what the loader supplies per read path, pipeline
(the tier made in the workers, or on the device from raw uint16 batches) and worker count (Track 2),
how supply scales from 0 workers, worker start-up at the most workers, supply over demand (Track 3:
the loader alone after each loop, over the compute-only rate of the same model and batch), Track 3's
end-to-end loops with the fewest workers that keep the GPU >= 90% busy, the threads-vs-workers split
and the loader overhead. Plain json and the standard library only, so it runs wherever the rows are,
whatever the package looks like.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

#: Worker scaling that counts as paying off: 2 workers at least this many times 0 workers.
TWO_WORKER_TARGET = 1.6

#: The tracks the tables read, as rows carry them (cropbench.records' names, spelled here: standard library only).
LOADER = "loader"
TRAINING = "training"
#: What rows written before the tracks were named carry in ``track``, by the name it now is.
FORMER_TRACK_VALUES = {"1": "dataset", "2": LOADER, "3": TRAINING}


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
    rates = {(r["config"]["workload"], r["config"]["amp"]): r["metrics"]["compute_only_images_per_s"] for r in found}
    body = [
        [
            r["config"]["workload"],
            "fp32" if r["config"]["amp"] == "off" else r["config"]["amp"],
            _number(r["metrics"]["compute_only_images_per_s"]),
            _number(r["metrics"]["compute_only_step_p50_ms"], "{:.2f}"),
            _number(r["metrics"]["compute_only_step_p95_ms"], "{:.2f}"),
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
        ratio = two["samples_per_s"] / base["samples_per_s"] if base.get("samples_per_s") and two else None
        top = most.get("samples_per_s", 0) / base["samples_per_s"] if base.get("samples_per_s") else None
        checks = all(m.get("crosscheck_ok") for m in sweep.values())
        body.append(
            [
                layout,
                decode,
                tier,
                pipeline,
                str(most.get("transform_device", "–")),
                _bytes(most, "bytes_worker_to_main_per_sample"),
                *(_number(sweep.get(w, {}).get("samples_per_s")) for w in workers),
                _number(top, "{:.1f}×"),
                "–" if ratio is None else f"{ratio:.2f}× ({'yes' if ratio >= TWO_WORKER_TARGET else 'no'})",
                _number(most.get("samples_per_s", 0) / train if train else None, "{:.2f}"),
                _number(most.get("samples_per_s", 0) / embed if embed else None, "{:.2f}"),
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
        if r["track"] != TRAINING or "supply_over_demand" not in r["metrics"]:
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
            _bytes(r["metrics"], "bytes_host_to_device_per_sample"),
            _number(r["metrics"].get("supply_samples_per_s")),
            _number(r["metrics"].get("compute_only_images_per_s")),
            _number(r["metrics"]["supply_over_demand"], "{:.2f}"),
            _number(100 * r["metrics"]["data_wait_fraction"], "{:.1f}%"),
            _number(r["metrics"].get("images_per_s")),
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
        best = metrics.get("best_split")
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
                metrics["splits"],
                metrics["images_per_s_by_split"],
                metrics["data_wait_fraction_by_split"],
                metrics["supply_over_demand_by_split"],
                strict=True,
            )
        ]
        lines += [*_table(["split", "images/s", "data wait", "supply ÷ demand"], body), ""]
    return lines[:-1]


def overhead(rows: list[dict[str, Any]]) -> list[str]:
    found = [r for r in rows if r["track"] == LOADER and "loader_over_batched" in r["metrics"]]
    if not found:
        return []
    body = [
        [
            _layout(r),
            str(r["config"]["loader"]["num_workers"]),
            str(r["config"]["crop"]["decode_threads"]),
            str(r["metrics"]["reader_threads"]),
            _number(r["metrics"]["loader_batches_per_s"], "{:,.1f}"),
            _number(r["metrics"]["batched_batches_per_s"], "{:,.1f}"),
            _number(r["metrics"]["loader_over_batched"], "{:.2f}"),
            f"{r['metrics']['ratio_q1']:.2f}-{r['metrics']['ratio_q3']:.2f}",
        ]
        for r in found
    ]
    lines = ["## Loader overhead: uint16 batches/s through the DataLoader ÷ Track 1's batched rate, interleaved", ""]
    header = ["layout", "workers", "threads per worker", "batched threads", "loader", "batched", "ratio", "block IQR"]
    return lines + _table(header, body)


def startup(rows: list[dict[str, Any]]) -> list[str]:
    t2 = [r for r in rows if r["track"] == LOADER and "first_batch_ms" in r["metrics"]]
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
            _number(r["metrics"].get("iter_create_ms"), "{:.0f}"),
            _number(r["metrics"]["first_batch_ms"], "{:.0f}"),
            _number(r["metrics"].get("epoch2_first_batch_ms"), "{:.0f}"),
            _number(r["metrics"].get("worker_uss_mib_max"), "{:.0f}"),
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
    loops = [r for r in t3 if "data_wait_fraction" in r["metrics"]]
    lines = ["## Track 3 end to end: fewest workers for >= 90% busy (data wait < 10%)", ""]
    body = [
        [
            _layout(s),
            s["case"].removesuffix("/min-workers"),
            str(s["metrics"]["min_workers_answer"]),
            ", ".join(
                f"w{w}: {100 * d:.0f}%"
                for w, d in zip(
                    s["metrics"]["tried_workers"], s["metrics"]["data_wait_fraction_by_workers"], strict=True
                )
            ),
            _number(s["metrics"].get("compute_only_images_per_s")),
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
            _number(r["metrics"]["images_per_s"]),
            _number(r["metrics"]["step_p50_ms"], "{:.1f}"),
            _number(r["metrics"]["step_p95_ms"], "{:.1f}"),
            _number(100 * r["metrics"]["data_wait_fraction"], "{:.1f}%"),
            _number(r["metrics"].get("gpu_util_mean"), "{:.0f}%"),
            _number(r["metrics"].get("first_batch_ms"), "{:.0f}"),
            _number(r["metrics"].get("crosscheck_gap"), "{:+.2f}"),
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
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [json.loads(line) for line in Path(argv[1]).read_text().splitlines() if line.strip()]
    for row in rows:
        row["track"] = FORMER_TRACK_VALUES.get(row["track"], row["track"])
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
