"""`execgate trace RUN [--json | --html FILE]`: a run's calls on one time axis.

The terminal view is one line per call (id, tool, agent, a bar on the run's time axis,
outcome) followed by that call's phases with their durations, then the time the run spent
in each state and why it stopped. Lines are laid out for the console's width (tested at
100 columns), never wider.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.text import Text

from execgate.client import Approval, Client, PermissionDenied
from execgate.executor.cli import common
from execgate.executor.cli import lookup as cli_lookup
from execgate.executor.cli import options as cli_options

from . import html as trace_html
from . import text as words
from .rows import Row, Segment, Span
from .timeline import Trace, trace

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
TOOL_W, AGENT_W, MIN_BAR = 12, 10, 10
INDENT = 4
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = cli_options.common()
    p = sub.add_parser(
        "trace", parents=[parent], help="a run's calls on a timeline (terminal, JSON or HTML)"
    )
    p.add_argument(
        "run_id", help="a run id (or a unique prefix): any run calls used, `default` included"
    )
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
    with common.client(args) as client:
        detail = cli_lookup.run_detail(client, args.run_id)
        t = trace(detail, _approvals(client, detail.run.run_id))
    if not cli_lookup.recorded(detail):
        t = dataclasses.replace(t, state=cli_lookup.NO_RECORD)
    if args.html is not None:
        try:
            args.html.write_text(trace_html.render(t), encoding="utf-8")
        except OSError as exc:
            raise SystemExit(f"execgate: cannot write {args.html}: {exc.strerror}") from exc
        print(f"wrote {args.html} ({len(t.rows)} calls)")
    elif args.json:
        common.print_json(as_json(t))
    else:
        console = Console(highlight=False, width=args.width)
        for line in render(t, console.width):
            console.print(line, no_wrap=True, overflow="crop", crop=True)
    return 0


def as_json(t: Trace) -> Any:
    """The trace as data, times in seconds from `origin` (microsecond precision)."""
    return _rounded(common.jsonable(t))


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
    """Every line of the terminal view; none is wider than `width` cells. Call ids and
    outcomes are never cut: when they leave the bar too little room, each call takes two
    lines (its id, tool, agent and outcome; then its bar)."""
    cols = _columns(t, width)
    lines = [*_header(t, width), *_axis(t, cols, width)]
    for row in t.rows:
        lines += _row_lines(t, row, cols, width)
        lines += [Text(line, style="dim") for line in _wrap(words.phases(row, t.run_id), width)]
    lines += [Text(line) for line in _wrap(words.states(t), width, indent=0)]
    lines += [Text(line, style="bold") for line in _wrap(words.stop_line(t), width, indent=0)]
    return lines


@dataclass(frozen=True, slots=True)
class Columns:
    ids: int
    tools: int
    agents: int
    outcome: int
    bar: int
    # The bar on a line of its own, below the call's id and outcome.
    stacked: bool


def _columns(t: Trace, width: int) -> Columns:
    """Column widths for this trace at this console width."""
    ids = max([cell_len(clean(r.call_id)) for r in t.rows] + [4])
    tools = min(max([cell_len(clean(r.tool)) for r in t.rows] + [4]), TOOL_W)
    agents = min(max([cell_len(clean(r.agent)) for r in t.rows] + [5]), AGENT_W)
    outcome = max([cell_len(_outcome(r)) for r in t.rows] + [7])
    bar = width - (ids + tools + agents + outcome + 2 * 3 + 3)
    if bar >= MIN_BAR:
        return Columns(ids, tools, agents, outcome, bar, stacked=False)
    bar = max(width - INDENT - 3 - outcome, MIN_BAR)
    return Columns(ids, tools, agents, outcome, bar, stacked=True)


def _header(t: Trace, width: int) -> list[Text]:
    head = f"run {t.run_id} · owner {t.owner} · model {t.model or '-'} · {len(t.rows)} calls"
    head += f" · {t.end:.3f}s from {words.when_zoned(t.origin)}"
    legend = "  ".join(f"{g} {s.value.replace('_', ' ')}" for s, (g, _) in GLYPH.items())
    legend += f"  {CANCEL[0]} cancel requested  {FORCE[0]} force kill"
    goal = f"goal: {t.goal}" if t.goal else "goal: -"
    return [
        *(Text(line, style="bold") for line in _wrap(head, width, indent=0)),
        *(Text(line) for line in _wrap(goal, width, indent=0)),
        *(Text(line, style="dim") for line in _wrap("legend: " + legend, width, indent=0)),
    ]


def _axis(t: Trace, cols: Columns, width: int) -> list[Text]:
    left, right = "0s", f"{t.end:.3f}s"
    scale = "│" + left + " " * max(cols.bar - len(left) - len(right), 1) + right + "│"
    names = f"{'call':<{cols.ids}}  {'tool':<{cols.tools}}  {'agent':<{cols.agents}}"
    if cols.stacked:
        return [Text(_fit(names, width), style="bold"), Text(" " * INDENT + scale + " outcome")]
    return [Text(f"{names}  {scale} outcome", style="bold")]


def _outcome(row: Row) -> str:
    return row.status if row.error_class in ("", "none") else f"{row.status}/{row.error_class}"


def _row_lines(t: Trace, row: Row, cols: Columns, width: int) -> list[Text]:
    line = Text()
    line.append(set_cell_size(clean(row.call_id), cols.ids) + "  ", style="bold")
    line.append(f"{_pad(row.tool, cols.tools)}  {_pad(row.agent, cols.agents)}  ")
    bar = Text("│")
    for glyph, style in cells(row, t.end, cols.bar):
        bar.append(glyph, style=style)
    bar.append("│")
    outcome = Text(_outcome(row), style=OUTCOME_STYLE.get(row.status, ""))
    if not cols.stacked:
        return [line + bar + Text(" ") + outcome]
    line.rstrip()
    shown = line.wrap(Console(width=width), width, overflow="fold")
    return [*shown, Text(" " * INDENT) + bar + Text(" ") + outcome]


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
        for cell, glyph in _marks(row.ladder.requested, row.ladder.forced, scale, width):
            bar[cell] = glyph
    return bar


def _marks(
    requested: float, forced: float | None, scale: float, width: int
) -> list[tuple[int, tuple[str, str]]]:
    """The cancel mark's cell and the force mark's, in time order: a kill inside the
    request's cell still shows both, the force mark after (the request moves left if
    it sits in the last cell)."""
    req = min(int(requested * scale), width - 1)
    if forced is None:
        return [(req, CANCEL)]
    frc = min(int(forced * scale), width - 1)
    if frc <= req and width >= 2:
        frc = min(req + 1, width - 1)
        req = frc - 1
    return [(req, CANCEL), (frc, FORCE)]


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


def _fit(text: str, width: int) -> str:  # for the column heads only
    """At most `width` cells, cut with an ellipsis."""
    text = clean(text)
    return text if cell_len(text) <= width else set_cell_size(text, max(width - 1, 0)) + "…"


def _pad(text: str, width: int) -> str:
    """Exactly `width` cells."""
    return set_cell_size(_fit(text, width), width)


def clean(text: str) -> str:
    """No control characters from recorded data reach the terminal."""
    return _CONTROL.sub("?", text)
