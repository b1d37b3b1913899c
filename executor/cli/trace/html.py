"""`execgate trace RUN --html FILE`: the trace as one self-contained page.

A Gantt chart: one row per call, one bar per row made of its segments (`seg seg-queued`,
`seg-approval_wait`, `seg-lock_wait`, `seg-running`, `seg-stopping`) placed in percent of
the run's duration, markers for a cancel request (`marker marker-cancel`, ▲) and a force
kill (`marker marker-force`, ✖). Every element carries its details in a `title`; a small
inline script turns those into a tooltip and draws the time axis. No network: inline CSS
and JS only, and a Content-Security-Policy that forbids fetching anything.

Every recorded string (arguments, reasons, ids) is escaped with `html.escape`; classes and
styles are built from closed sets and numbers only.
"""

from __future__ import annotations

import datetime
import html

from . import text as words
from .rows import Row, Segment, Span
from .timeline import Trace

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
ARGUMENTS_SHOWN = 400

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em} code{font:12px ui-monospace,monospace}
.stop{font-weight:600;padding:.4em .6em;border-left:4px solid #888;background:#f4f4f4}
.stop.completed{border-color:#2a2} .stop.failed,.stop.cancelled{border-color:#c22}
.stop.completed.unverified,.stop.completed.caveats{border-color:#d90;background:#fff6e0}
.legend span{display:inline-block;margin-right:1.2em}
.legend i{display:inline-block;width:1.4em;height:.8em;margin-right:.3em;vertical-align:middle}
#gantt{margin:1em 0;border-top:1px solid #ccc}
.row{display:grid;grid-template-columns:var(--label) 1fr var(--outcome);align-items:center;
  border-bottom:1px solid #eee;min-height:1.8em}
.row:hover{background:#f7f7ff} .label{overflow-wrap:anywhere}
.track,.axis-track{position:relative;height:1.1em}
.seg{position:absolute;top:0;bottom:0;min-width:2px}
.seg-queued{background:#ccc} .seg-approval_wait{background:#b36bd1}
.seg-lock_wait{background:#e8b923} .seg-running{background:#3a9a4a}
.seg-stopping{background:#d04040}
.marker{position:absolute;top:-.35em;transform:translateX(-50%);font-size:1.1em;line-height:1}
.marker-cancel{color:#b8860b} .marker-force{color:#c00;font-weight:bold}
.outcome{padding-left:.8em;overflow-wrap:anywhere}
.status-success .outcome{color:#2a2} .status-failure .outcome{color:#c22}
.status-unknown_outcome .outcome{color:#c00;font-weight:600}
.status-rejected .outcome{color:#a3a} .status-partial .outcome{color:#b80}
.axis{display:grid;grid-template-columns:var(--label) 1fr var(--outcome);color:#666;
  font-size:12px}
.tick{position:absolute;top:0} .axis>span:last-child{padding-left:.8em}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;padding:.5em .7em;
  font:12px/1.35 ui-monospace,monospace;white-space:pre-wrap;max-width:48em;border-radius:4px}
table{border-collapse:collapse;margin:.5em 0 1.5em} td,th{border:1px solid #ddd;
  padding:.2em .5em;text-align:left;vertical-align:top}
td.args{max-width:40em;overflow-wrap:anywhere}
"""

# Titles become the tooltip; the axis gets a tick per fifth of the run.
SCRIPT = """
(function () {
  var tip = document.getElementById("tip");
  document.querySelectorAll("#gantt [title]").forEach(function (el) {
    el.setAttribute("data-tip", el.getAttribute("title"));
    el.removeAttribute("title");
  });
  document.addEventListener("mousemove", function (ev) {
    var el = ev.target.closest ? ev.target.closest("[data-tip]") : null;
    if (!el) { tip.hidden = true; return; }
    tip.textContent = el.getAttribute("data-tip");
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
    tip.hidden = false;
  });
  var axis = document.getElementById("axis-track");
  var end = parseFloat(axis.getAttribute("data-end")) || 0;
  for (var i = 0; i <= 5; i++) {
    var tick = document.createElement("span");
    tick.className = "tick";
    tick.style.left = (i * 20) + "%";
    tick.style.transform = "translateX(" + (-i * 20) + "%)";
    tick.textContent = (end * i / 5).toFixed(end < 10 ? 2 : 1) + "s";
    axis.appendChild(tick);
  }
})();
"""


def render(t: Trace) -> str:
    """The whole page."""
    title = f"execgate trace {t.run_id}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
        _header(t),
        _legend(),
        _gantt(t),
        '<div id="tip" hidden></div>',
        _calls_table(t),
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _header(t: Trace) -> str:
    state = t.stop.state if t.stop is not None else t.state
    facts = (
        f"owner <b>{_e(t.owner)}</b> · model {_e(t.model or '-')} · {len(t.rows)} calls · "
        f"{t.end:.3f}s · {_e(words.states(t))}"
    )
    zone = words.when_zoned(t.origin).rsplit(" ", 1)[1]
    started = (
        f'<p id="started">started <time datetime="{_iso(t.origin)}">'
        f"{_e(words.when_zoned(t.origin))}</time>; every other time on this page is seconds "
        f"after that (times shown in {zone}, the zone of the machine that wrote the page)</p>"
    )
    return (
        f"<header><h1>run <code>{_e(t.run_id)}</code></h1>"
        f'<p class="stop {_css(state)}{_backing_classes(t)}" id="stop">'
        f"{_e(words.stop_line(t))}{_backing(t)}</p>"
        f"{started}<p>goal: {_e(t.goal or '-')}</p><p>{facts}</p></header>"
    )


def _backing_classes(t: Trace) -> str:
    """A completion no verifier backed, or one with caveats, is not a plain green."""
    if t.stop is None or not t.stop.backing:
        return ""
    return (" unverified" if t.stop.backing.startswith("unverified") else "") + (
        " caveats" if t.stop.caveats else ""
    )


def _backing(t: Trace) -> str:
    if t.stop is None or not t.stop.backing:
        return ""
    notes = [t.stop.backing, *t.stop.caveats]
    return "".join(f'<br><span class="backing">{_e(n)}</span>' for n in notes)


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="milliseconds")


# What each colour and mark means, said once so no two read alike.
MEANING = {
    Segment.QUEUED: "queued: accepted, not yet scheduled",
    Segment.APPROVAL_WAIT: "approval wait: parked by an ask rule until someone decides",
    Segment.LOCK_WAIT: "lock wait: behind a conflicting call",
    Segment.RUNNING: "running",
    Segment.STOPPING: "stopping: from the cancel request until the call stopped",
}


def _legend() -> str:
    items = [f'<span><i class="seg-{s.value}"></i>{_e(MEANING[s])}</span>' for s in Segment]
    items.append(
        f'<span><b class="marker-cancel">{words.CANCEL_GLYPH}</b> cancel requested '
        "(a cancel, a timeout or the daemon's shutdown)</span>"
    )
    items.append(
        f'<span><b class="marker-force">{words.FORCE_GLYPH}</b> force kill '
        "(SIGKILL once the grace ran out)</span>"
    )
    return '<p class="legend" id="legend">' + " ".join(items) + "</p>"


def _gantt(t: Trace) -> str:
    axis = (
        '<div class="axis"><span>call · tool · agent</span>'
        f'<div class="axis-track" id="axis-track" data-end="{t.end:.6f}"></div>'
        "<span>outcome</span></div>"
    )
    rows = "\n".join(_row(t, r) for r in t.rows)
    # The label and outcome columns are as wide as their longest text: never cut.
    label = max([len(r.call_id) + len(r.tool) + len(r.agent) + 6 for r in t.rows] + [18])
    outcome = max([len(_outcome(r)) + 2 for r in t.rows] + [10])
    widths = f"--label:{min(label, 40)}ch;--outcome:{min(outcome, 40)}ch"
    return f'<section id="gantt" style="{widths}">{axis}\n{rows}</section>'


def _row(t: Trace, row: Row) -> str:
    label = f"<code>{_e(row.call_id)}</code> {_e(row.tool)} · {_e(row.agent)}"
    segs = "".join(_segment(t, row, s) for s in row.spans)
    outcome = _outcome(row)
    return (
        f'<div class="row status-{_css(row.status)}" data-call="{_e(row.call_id)}" '
        f'title="{_e(_row_tip(row))}">'
        f'<div class="label">{label}</div>'
        f'<div class="track">{segs}{_markers(t, row)}</div>'
        f'<div class="outcome" title="{_e(words.outcome(row))}">{_e(outcome)}</div></div>'
    )


def _outcome(row: Row) -> str:
    return row.status if row.error_class in ("", "none") else f"{row.status}/{row.error_class}"


def _approval(row: Row) -> str:
    """`approval appr_… (rule …): approved by alice`, or "" for a call never parked."""
    a = row.approval
    if a is None:
        return ""
    by = f"{a.state} by {a.decided_by}" if a.decided_by else (a.state or "undecided")
    return f"approval {a.approval_id or '?'} ({a.why}): {by}"


def _segment(t: Trace, row: Row, span: Span) -> str:
    left, width = _pct(span.start, t.end), _pct(span.seconds, t.end)
    tip = f"{row.call_id}: {_name(span.kind)} {words.dur(span.seconds)}"
    tip += f" (+{span.start:.3f}s → +{span.end:.3f}s)"
    if span.kind is Segment.LOCK_WAIT and row.waited_behind:
        tip += " behind " + ", ".join(row.waited_behind)
    if span.kind is Segment.APPROVAL_WAIT and row.approval is not None:
        tip += "; " + _approval(row)
    return (
        f'<div class="seg seg-{span.kind.value}" style="left:{left:.4f}%;width:{width:.4f}%" '
        f'title="{_e(tip)}"></div>'
    )


def _markers(t: Trace, row: Row) -> str:
    lad = row.ladder
    if lad is None:
        return ""
    cancel = f"{lad.cause.value} requested +{lad.requested:.3f}s: {lad.detail}"
    out = _marker("cancel", words.CANCEL_GLYPH, lad.requested, t.end, cancel)
    if lad.forced is not None:
        grace = words.dur(lad.grace_used) if lad.grace_used is not None else "?"
        survivors = "unknown" if row.survivors is None else str(row.survivors)
        force = f"force kill +{lad.forced:.3f}s after {grace} grace: {lad.force_how}"
        force += f"; survivors {survivors}"
        out += _marker("force", words.FORCE_GLYPH, lad.forced, t.end, force)
    return out


def _marker(kind: str, glyph: str, at: float, end: float, tip: str) -> str:
    return (
        f'<span class="marker marker-{kind}" style="left:{_pct(at, end):.4f}%" '
        f'title="{_e(tip)}">{glyph}</span>'
    )


def _row_tip(row: Row) -> str:
    lines = [f"{row.call_id} · {row.tool} · {row.agent}", words.outcome(row)]
    if row.approval is not None:
        lines.append(_approval(row))
    if row.message:
        lines.append(row.message)
    lines += [
        f"+{m.at:8.3f}s  {m.phase}" + (f"  {m.detail}" if m.detail else "") for m in row.marks
    ]
    lines.append("arguments: " + _short(row.arguments_json))
    return "\n".join(lines)


def _calls_table(t: Trace) -> str:
    head = "<tr><th>call</th><th>tool</th><th>agent</th><th>arguments</th><th>phases</th></tr>"
    body = "".join(
        f'<tr class="call status-{_css(r.status)}"><td><code>{_e(r.call_id)}</code></td>'
        f"<td>{_e(r.tool)}</td><td>{_e(r.agent)}</td>"
        f'<td class="args"><code>{_e(_short(r.arguments_json))}</code></td>'
        f"<td>{_e(words.phases(r, t.run_id))}</td></tr>"
        for r in t.rows
    )
    return f"<h2>Calls</h2><table>{head}{body}</table>"


def _pct(seconds: float, end: float) -> float:
    return min(max(seconds / end * 100, 0.0), 100.0) if end > 0 else 0.0


def _name(kind: Segment) -> str:
    return kind.value.replace("_", " ")


def _short(text: str) -> str:
    return text if len(text) <= ARGUMENTS_SHOWN else text[: ARGUMENTS_SHOWN - 1] + "…"


def _css(word: str) -> str:
    """A class name from a recorded word: letters and underscores only."""
    return "".join(c for c in word if c.isascii() and (c.isalnum() or c == "_")) or "none"


def _e(text: str) -> str:
    return html.escape(text, quote=True)
