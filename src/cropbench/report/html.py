"""One self-contained HTML page per run: the verdict, the figures, every row and the environment.

The page loads nothing: figures are embedded as base64 PNG, the style is inline, and there are no
links or scripts, so it opens the same from a laptop, a mail attachment or a CI artefact. Every
string that reaches the page (case labels, config values, flags, paths) is escaped.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.errors import OutputError
from cropbench.harness.flags import row_flags
from cropbench.harness.validity import flag_meaning
from cropbench.records import Record
from cropbench.report.summary import cell_value, format_cell, impossible_rows
from cropbench.report.tracks import report_of
from cropbench.report.verdict import HEADING, Verdict, track_lines, verdict

#: The report's file name, beside results.jsonl.
REPORT_NAME = "report.html"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
.meta { color: #555; margin-top: 0; }
.verdict { background: #f4f8fb; border-left: 4px solid #1f77b4; padding: 0.6em 1.2em; }
.verdict h3 { font-size: 1em; margin: 0.9em 0 0.2em; }
.verdict ul { margin: 0.2em 0; } .verdict ul:empty { display: none; } .verdict .note { font-weight: 600; }
.wide { overflow-x: auto; } table { border-collapse: collapse; font-size: 0.82em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.4em; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; white-space: normal; min-width: 3.5em; }
td.case, th.case { text-align: left; white-space: normal; overflow-wrap: anywhere; min-width: 12em; }
td.flags { text-align: left; white-space: normal; min-width: 8em; }
tr.flagged td { color: #888; background: repeating-linear-gradient(135deg, #f7f7f7 0 6px, #efefef 6px 12px); }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.legend { font-size: 0.85em; color: #555; } code { font-size: 0.95em; }
"""


def render_report(
    records: Sequence[Record],
    figures: Iterable[str | Path] = (),
    preset: str | None = None,
    answer: Verdict | None = None,
) -> str:
    """The page as a string: verdict (``answer``, else computed from ``records``), figures, rows, environment."""
    answer = answer if answer is not None else verdict(records, preset)
    runs = list(dict.fromkeys(r.run_id for r in records))
    named = f"run {', '.join(runs)}" if len(runs) <= 3 else f"{len(runs)} runs"
    stamps = sorted(r.timestamp for r in records)
    when = f"{stamps[0]} to {stamps[-1]}" if stamps else "no rows"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>cropbench report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>cropbench report</h1>",
        f'<p class="meta">{len(records)} rows, {_text(named)}, {_text(when)}</p>',
        _verdict_section(answer),
        _figures_section(figures),
        _rows_section(records),
        _environment_section(records),
        f'<p class="meta">written {_text(_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))}</p>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_report(
    records: Sequence[Record],
    out_dir: str | Path,
    figures: Iterable[str | Path] = (),
    preset: str | None = None,
    answer: Verdict | None = None,
) -> Path:
    """Write ``OUT/report.html`` (see :func:`render_report`); returns its path."""
    path = Path(out_dir) / REPORT_NAME
    page = render_report(records, figures, preset, answer)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise OutputError(f"cannot write the report {path}: {error.strerror or error}") from error
    return path


def _text(value: object) -> str:
    return escape(str(value), quote=True)


def _verdict_section(answer: Verdict) -> str:
    parts = [f'<h2>{_text(HEADING)}</h2><div class="verdict">']
    preamble = answer.preamble()
    if preamble:
        parts.append(f'<p class="note">{_text(preamble)}</p>')
    for track in answer.tracks:
        head, *rest = track_lines(track)
        items: list[str] = []
        for line in rest:
            if line.startswith("  - ") and items:  # a reason, listed under the count it explains
                items[-1] += f"<li>{_text(line[4:])}</li>"
            else:
                items.append(f"<li>{_text(line)}<ul>")
        parts.append(f"<h3>{_text(head)}</h3><ul>" + "".join(f"{item}</ul></li>" for item in items) + "</ul>")
    if not answer.tracks:
        parts.append("<p>no rows</p>")
    parts.append("</div>")
    return "\n".join(parts)


def _figures_section(figures: Iterable[str | Path]) -> str:
    parts = ["<h2>Figures</h2>"]
    shown = 0
    for figure in figures:
        path = Path(figure)
        try:
            data = base64.b64encode(path.read_bytes()).decode("ascii")
        except OSError as error:
            raise OutputError(f"cannot read the figure {path}: {error.strerror or error}") from error
        name = _text(path.name)
        parts.append(
            f'<figure><img alt="{name}" src="data:image/png;base64,{data}"><figcaption>{name}</figcaption></figure>'
        )
        shown += 1
    if not shown:
        parts.append("<p>no figures were drawn for these rows</p>")
    return "\n".join(parts)


def _rows_section(records: Sequence[Record]) -> str:
    parts = [
        "<h2>Rows</h2>",
        '<p class="legend">Hatched grey rows carry validity flags: they check the wiring and are not measurements '
        "to quote. Every metric of every row is in results.jsonl beside this page.</p>",
    ]
    by_track: dict[str, list[Record]] = {}
    for record in records:
        by_track.setdefault(record.track, []).append(record)
    for track, rows in by_track.items():
        columns = report_of(track).columns
        header = "".join(f"<th>{_text(title)}</th>" for title, _, _ in columns)
        parts.append(f'<h3>track {_text(track)}</h3><div class="wide"><table>')
        parts.append(f'<tr><th class="case">case</th><th>run</th>{header}</tr>')
        for row in rows:
            flagged = bool(row_flags(row))
            label = row.case + (f" #{row.repeat}" if row.repeat else "")
            cells = "".join(_cell(cell_value(row, key), key, fmt) for _, key, fmt in columns)
            style = ' class="flagged"' if flagged else ""
            parts.append(f'<tr{style}><td class="case">{_text(label)}</td><td>{_text(row.run_id)}</td>{cells}</tr>')
        parts.append("</table></div>")
        raised = sorted({flag for row in rows for flag in row_flags(row)})
        if raised:
            items = "".join(
                f"<li><code>{_text(flag)}</code>: {_text(flag_meaning(flag, track))}</li>" for flag in raised
            ) + "".join(f"<li>{_text(label)}: {_text(why)}</li>" for label, why in impossible_rows(rows))
            parts.append(f'<ul class="legend">{items}</ul>')
    if not by_track:
        parts.append("<p>no rows</p>")
    return "\n".join(parts)


def _cell(value: object, key: str, fmt: str) -> str:
    """A table cell; flags wrap (one per line where the window is narrow), so no table outgrows the page."""
    if key == m.VALIDITY_FLAGS:
        return f'<td class="flags">{_text(format_cell(value, fmt).replace(",", ", "))}</td>'
    return f"<td>{_text(format_cell(value, fmt))}</td>"


#: Environment values in bytes (keys ending so) are shown in GiB.
BYTES_SUFFIX = "_bytes"


def _environment_section(records: Sequence[Record]) -> str:
    values: dict[str, list[str]] = {}
    for record in records:
        for key, value in _flatten(record.environment).items():
            seen = values.setdefault(key, [])
            if value not in seen:
                seen.append(value)
    rows = "".join(
        f'<tr><td class="case">{_text(key)}</td><td class="case">{_text(" | ".join(shown))}</td></tr>'
        for key, shown in values.items()
    )
    table = f'<div class="wide"><table>{rows}</table></div>' if rows else "<p>the rows carry no environment</p>"
    return f"<h2>Environment</h2>\n{table}"


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{name}."))
        elif name.endswith(BYTES_SUFFIX) and isinstance(value, int) and not isinstance(value, bool):
            flat[name] = f"{value / 2**30:,.1f} GiB"
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


__all__ = ["REPORT_NAME", "render_report", "write_report"]
