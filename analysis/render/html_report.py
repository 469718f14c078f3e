"""`hetbench report --html`: one self-contained static page (no file or script it loads):
the report's Markdown rendered with its figures embedded, the runs' configurations and
environments, and the regression history of the committed baselines over commits."""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.analysis.tables.runs import runs_table
from hetbench.harness.records.results import Run

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222;
       line-height: 1.4; padding: 0 1em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; display: block;
        overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f3f3f3; }
img { max-width: 100%; height: auto; border: 1px solid #eee; margin: 0.5em 0; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }
nav a { margin-right: 1em; }
"""
HISTORY_METRICS = ("samples_per_s", "mean_step_ms", "idle_fraction")


def history_table(points: Sequence[tuple[str, str, str, Sequence[Run]]]) -> pd.DataFrame:
    """A row per baseline snapshot (commit, date, subject, its runs):
    the number of completed runs, the median over them of HISTORY_METRICS and the host and
    CPU they ran on (a change there, not the code, may explain a step)."""
    rows = []
    for commit, date, subject, runs in points:
        table = runs_table(runs)
        table = table[table["status"] == "completed"] if len(table) else table
        if table.empty:
            continue
        environment = runs[0].manifest.get("environment") or {}
        rows.append({"commit": commit[:10], "date": date, "subject": subject,
                     "runs": len(table),
                     **{m: float(table[m].median()) for m in HISTORY_METRICS},
                     "machine": f"{environment.get('host', '?')} "
                                f"({environment.get('cpu_model', '?')}, "
                                f"{environment.get('cpu_count', '?')} cores)"})
    return pd.DataFrame(rows)


def _embedded(markdown: str, folder: Path) -> str:
    """Image links to PNG files of `folder` become data URIs: the page stands alone."""
    def inline(match: re.Match[str]) -> str:
        path = folder / match.group(2)
        if not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode()
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return re.sub(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)", inline, markdown)


def _render(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)


def _json_block(title: str, value: Any) -> str:
    return (f"<details><summary>{html.escape(title)}</summary><pre>"
            f"{html.escape(json.dumps(value, indent=2, sort_keys=True, default=str))}"
            "</pre></details>")


def page(title: str, report_markdown: str, figures: Path,
         runs: Sequence[Run], history: pd.DataFrame,
         history_figure: Path | None) -> str:
    """The page: the report (figures from folder `figures`), each run name's configuration,
    each distinct environment, and the regression history (its table and figure)."""
    configurations: dict[str, Any] = {}
    environments: dict[str, list[str]] = {}
    for recorded in runs:
        manifest, run = recorded.manifest, recorded.spec
        configurations.setdefault(run.get("name", "?"), run)
        key = json.dumps(manifest.get("environment") or {}, sort_keys=True, default=str)
        environments.setdefault(key, []).append(manifest.get("run_id", "?"))
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
             "<nav><a href=\"#report\">Report</a><a href=\"#configuration\">Configuration</a>"
             "<a href=\"#environment\">Environment</a><a href=\"#history\">Regression "
             "history</a></nav>",
             "<section id=\"report\">", _render(_embedded(report_markdown, figures)),
             "</section><section id=\"configuration\"><h2>Configuration</h2>",
             "<p>Each run's configuration as the suite gave it (defaults filled in).</p>",
             *(_json_block(name, run) for name, run in configurations.items()),
             "</section><section id=\"environment\"><h2>Environment</h2>"]
    for key, run_ids in environments.items():
        parts.append(_json_block(f"{len(run_ids)} run(s): {', '.join(run_ids[:3])}"
                                 + (" ..." if len(run_ids) > 3 else ""), json.loads(key)))
    parts.append("</section><section id=\"history\"><h2>Regression history</h2>")
    if history.empty:
        parts.append("<p>No committed baselines found: a hetbench git checkout keeps them in "
                     "results/baselines/ci (benchmarks/refresh_baselines.sh writes them).</p>")
    else:
        parts.append("<p>The committed baselines (the <code>ci</code> suite) at each commit "
                     "that changed them: the median over their runs. Compare a point with "
                     "another only where the machine is the same.</p>")
        if history_figure is not None and history_figure.is_file():
            parts.append(_render(_embedded(f"![history]({history_figure.name})",
                                           history_figure.parent)))
        parts.append(history.to_html(index=False, float_format=lambda v: f"{v:.4g}",
                                     border=0))
    parts.append("</section></body></html>\n")
    return "\n".join(parts)
