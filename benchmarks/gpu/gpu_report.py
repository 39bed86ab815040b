"""The GPU proof kit's report: sections with a status, rendered as ``gpu_report.md`` and ``gpu_report.json``.

A section is ``pass`` (ran, nothing failed), ``fail`` (something failed: ``error`` has the tail of its output) or
``skip`` (not run here: ``note`` says why, e.g. no CUDA device, a missing file, the time budget spent).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]
REPORT_MD = "gpu_report.md"
REPORT_JSON = "gpu_report.json"


@dataclass
class Section:
    """One part of the check: its status, wall seconds, a one-line note, data (JSON) and markdown lines."""

    name: str
    status: Status = "pass"
    seconds: float = 0.0
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    error: str = ""

    def fail(self, note: str, error: str = "") -> None:
        self.status, self.note = "fail", note
        self.error = (self.error + "\n" + error).strip()[-4000:]

    def skip(self, note: str) -> None:
        self.status, self.note = "skip", note


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A markdown table (None shows as a dash)."""
    cells = [[("—" if c is None else str(c)) for c in row] for row in rows]
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in cells),
    ]


def render_markdown(meta: dict[str, Any], sections: list[Section]) -> str:
    """The report as markdown: what ran where, a summary table, then each section's details."""
    lines = [
        "# GPU proof kit report",
        "",
        f"- device: {meta['device']}{' (quick: tiny sizes)' if meta['quick'] else ''}",
        f"- started {meta['started']}, {meta['wall_s']:.0f} s of a {meta['budget_s']:.0f} s budget",
        f"- command: `{meta['command']}`",
        "",
        *table(
            ["section", "status", "seconds", "note"],
            [[s.name, s.status, f"{s.seconds:.1f}", s.note.replace("|", "/")] for s in sections],
        ),
    ]
    for s in sections:
        lines += ["", f"## {s.name}: {s.status}", ""]
        if s.note:
            lines += [s.note, ""]
        lines += s.lines
        if s.error:
            lines += ["", "```text", s.error, "```"]
    return "\n".join(lines) + "\n"


def write_reports(out: Path, meta: dict[str, Any], sections: list[Section]) -> tuple[Path, Path]:
    """Write ``gpu_report.md`` and ``gpu_report.json`` into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / REPORT_MD, out / REPORT_JSON
    md.write_text(render_markdown(meta, sections))
    record = {**meta, "sections": [{k: v for k, v in asdict(s).items() if k != "lines"} for s in sections]}
    js.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return md, js
