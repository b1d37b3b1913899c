"""`execgate trace RUN [--json | --html FILE]`: a run's calls on one time axis.

The terminal view is one line per call (id, tool, agent, a bar on the run's time axis,
outcome) followed by that call's phases with their durations, then the time the run spent
in each state and why it stopped. Lines are laid out for the console's width (tested at
100 columns), never wider.
"""

from __future__ import annotations

import argparse
import math
import re
import textwrap
from pathlib import Path
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.text import Text

from execgate.client import Approval, Client, PermissionDenied

from . import trace_html
from . import trace_text as words
from .cli_client import _client, _jsonable, _print_json, _when
from .timeline import Trace, trace
from .timeline_calls import Row, Segment, Span

GLYPH = {
    Segment.QUEUED: ("·", "dim"),
    Segment.APPROVAL_WAIT: ("▒", "magenta"),
    Segment.LOCK_WAIT: ("░", "yellow"),
    Segment.RUNNING: ("█", "green"),
    Segment.STOPPING: ("▓", "red"),
}
PRIORITY = (
    Segment.QUEUED,
    Segment.RUNNING,
    Segment.STOPPING,
    Segment.LOCK_WAIT,
    Segment.APPROVAL_WAIT,
)
CANCEL, FORCE = (words.CANCEL_GLYPH, "bold yellow"), (words.FORCE_GLYPH, "bold red")
OUTCOME_STYLE = {
    "success": "green",
    "partial": "yellow",
    "failure": "red",
    "rejected": "magenta",
    "unknown_outcome": "bold red",
    "running": "cyan",
}
# Column caps; the bar takes what the width leaves, at least MIN_BAR cells.
ID_W, TOOL_W, AGENT_W, OUTCOME_W, MIN_BAR = 14, 12, 10, 23, 10
INDENT = 4
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = sub.add_parser(
        "trace", parents=[common], help="a run's calls on a timeline (terminal, JSON or HTML)"
    )
    p.add_argument("run_id")
    p.add_argument("--html", type=Path, metavar="FILE", help="write a self-contained HTML page")
    p.add_argument("--width", type=int, default=None, help="columns (default: the terminal's)")
    p.set_defaults(handler=_trace)


def _approvals(client: Client, run_id: str) -> list[Approval]:
    """The run's approvals; [] for a caller who may not read them (the trace then
    takes the waits from the run's transitions)."""
    try:
        return client.approvals_of_run(run_id)
    except PermissionDenied:
        return []


def _trace(args: argparse.Namespace) -> int:
    with _client(args) as client:
        detail = client.runs.get(args.run_id)
        t = trace(detail, _approvals(client, args.run_id))
    if args.html is not None:
        try:
            args.html.write_text(trace_html.render(t), encoding="utf-8")
        except OSError as exc:
            raise SystemExit(f"execgate: cannot write {args.html}: {exc.strerror}") from exc
        print(f"wrote {args.html} ({len(t.rows)} calls)")
    elif args.json:
        _print_json(as_json(t))
    else:
        console = Console(highlight=False, width=args.width)
        for line in render(t, console.width):
            console.print(line, no_wrap=True, overflow="crop", crop=True)
    return 0


def as_json(t: Trace) -> Any:
    """The trace as data, times in seconds from `origin` (microsecond precision)."""
    return _rounded(_jsonable(t))


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- the terminal view


def render(t: Trace, width: int) -> list[Text]:
    """Every line of the terminal view; none is wider than `width` cells."""
    cols = _columns(t, width)
    lines = [*_header(t, width), _axis(t, cols)]
    for row in t.rows:
        lines.append(_row_line(t, row, cols))
        lines += [Text(line, style="dim") for line in _wrap(words.phases(row, t.run_id), width)]
    lines += [Text(line) for line in _wrap(words.states(t), width, indent=0)]
    lines.append(Text(_fit(words.stop_line(t), width), style="bold"))
    return lines


def _columns(t: Trace, width: int) -> tuple[int, int, int, int]:
    """(id, tool, agent, bar) widths for this trace at this console width."""
    ids = min(max([cell_len(clean(r.call_id)) for r in t.rows] + [4]), ID_W)
    tools = min(max([cell_len(clean(r.tool)) for r in t.rows] + [4]), TOOL_W)
    agents = min(max([cell_len(clean(r.agent)) for r in t.rows] + [5]), AGENT_W)
    bar = max(width - (ids + tools + agents + OUTCOME_W + 2 * 3 + 3), MIN_BAR)
    return ids, tools, agents, bar


def _header(t: Trace, width: int) -> list[Text]:
    head = f"run {t.run_id} · owner {t.owner} · model {t.model or '-'} · {len(t.rows)} calls"
    head += f" · {t.end:.3f}s from {_when(t.origin)}"
    legend = "  ".join(f"{g} {s.value.replace('_', ' ')}" for s, (g, _) in GLYPH.items())
    legend += f"  {CANCEL[0]} cancel requested  {FORCE[0]} force kill"
    return [
        Text(_fit(head, width), style="bold"),
        Text(_fit(f"goal: {t.goal}", width)),
        Text(_fit(legend, width), style="dim"),
    ]


def _axis(t: Trace, cols: tuple[int, int, int, int]) -> Text:
    ids, tools, agents, bar = cols
    left, right = "0s", f"{t.end:.3f}s"
    scale = "│" + left + " " * max(bar - len(left) - len(right), 1) + right + "│"
    line = f"{'call':<{ids}}  {'tool':<{tools}}  {'agent':<{agents}}  {scale} outcome"
    return Text(line, style="bold")


def _row_line(t: Trace, row: Row, cols: tuple[int, int, int, int]) -> Text:
    ids, tools, agents, bar = cols
    line = Text()
    line.append(_pad(row.call_id, ids) + "  ", style="bold")
    line.append(f"{_pad(row.tool, tools)}  {_pad(row.agent, agents)}  ")
    line.append("│")
    for glyph, style in cells(row, t.end, bar):
        line.append(glyph, style=style)
    line.append("│ ")
    outcome = row.status if row.error_class in ("", "none") else f"{row.status}/{row.error_class}"
    line.append(_fit(outcome, OUTCOME_W), style=OUTCOME_STYLE.get(row.status, ""))
    return line


def cells(row: Row, total: float, width: int) -> list[tuple[str, str]]:
    """The row's bar: `width` (glyph, style) cells; markers drawn over the segments."""
    bar = [(" ", "")] * width
    scale = width / total if total > 0 else 0.0
    # Where spans share a cell, the rarer, shorter kinds win: a wait shorter than a cell
    # still shows next to the run it held up.
    for span in sorted(row.spans, key=lambda s: PRIORITY.index(s.kind)):
        first, last = _cell_range(span, scale, width)
        for i in range(first, last):
            bar[i] = GLYPH[span.kind]
    if row.ladder is not None:
        taken = -1
        for at, glyph in ((row.ladder.requested, CANCEL), (row.ladder.forced, FORCE)):
            if at is None:
                continue
            cell = min(int(at * scale), width - 1)
            if cell == taken:  # a kill without grace: both marks stay visible
                cell = cell + 1 if cell + 1 < width else cell - 1
            bar[cell], taken = glyph, cell
    return bar


def _cell_range(span: Span, scale: float, width: int) -> tuple[int, int]:
    """Cells a span covers: at least one, so a millisecond's work still shows."""
    first = min(int(span.start * scale), width - 1)
    last = min(max(math.ceil(span.end * scale), first + 1), width)
    return first, last


def _wrap(text: str, width: int, indent: int = INDENT) -> list[str]:
    pad = " " * indent
    return textwrap.wrap(
        clean(text),
        width,
        initial_indent=pad,
        subsequent_indent=pad + "  ",
        break_on_hyphens=False,
    )


def _fit(text: str, width: int) -> str:
    """At most `width` cells, cut with an ellipsis."""
    text = clean(text)
    return text if cell_len(text) <= width else set_cell_size(text, max(width - 1, 0)) + "…"


def _pad(text: str, width: int) -> str:
    """Exactly `width` cells."""
    return set_cell_size(_fit(text, width), width)


def clean(text: str) -> str:
    """No control characters from recorded data reach the terminal."""
    return _CONTROL.sub("?", text)
