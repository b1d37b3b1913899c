"""`execgate trace RUN --html FILE`: the page's structure (html.parser), its escaping, and
the page as a real headless Chromium renders it (DOM after its script ran, a screenshot).

Chromium is required where EXECGATE_REQUIRE_BROWSER=1 (CI installs it); elsewhere the
browser tests skip when it is missing.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from execgate.executor.cli.trace import html as trace_html
from execgate.executor.cli.trace.timeline import trace
from tests.trace_support import (
    MARKUP_PATH,
    Traced,
    execgate,
    hand_made_call,
    hand_made_run,
    ok,
    traced_run,
)

CALLS = ["s1c1", "s1c2", "s1c3", "s2c1", "s2c2", "s3c1", "s4c1", "s5c1"]
VOID = frozenset({"meta", "br", "img", "input", "link", "hr"})


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)
    text: str = ""

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            yield from child.walk()

    def find(self, cls: str) -> list[Element]:
        return [e for e in self.walk() if cls in e.classes]

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


class Tree(HTMLParser):
    """The page as a tree of elements (html.parser unescapes text and attributes)."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {})
        self._open = [self.root]
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self._open[-1].children.append(element)
        if tag not in VOID:
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        assert self._open[-1].tag == tag, f"</{tag}> closes <{self._open[-1].tag}>"
        self._open.pop()

    def handle_data(self, data: str) -> None:
        self._open[-1].text += data


def rows(root: Element) -> dict[str, Element]:
    found = {e.attrs["data-call"]: e for e in root.find("row")}
    assert len(found) == len(root.find("row")), "a call has two rows"
    return found


def kinds(row: Element, prefix: str) -> set[str]:
    return {c for e in row.walk() for c in e.classes if c.startswith(prefix)}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    with traced_run(tmp_path_factory.mktemp("trace-html")) as t:
        yield t


@pytest.fixture(scope="module")
def page(traced: Traced, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("page") / "trace.html"
    out = ok(execgate(traced, "trace", traced.run_id, "--html", str(path)))
    assert f"wrote {path} (8 calls)" in out
    return path


# ---------------------------------------------------------------- the page as written


def test_one_bar_per_call_with_its_segments(page: Path) -> None:
    found = rows(Tree(page.read_text()).root)
    assert list(found) == CALLS
    for call_id, row in found.items():
        assert row.find("track"), call_id
        assert "seg-running" in kinds(row, "seg-"), call_id
    assert "seg-lock_wait" in kinds(found["s2c2"], "seg-")
    assert "seg-lock_wait" not in kinds(found["s2c1"], "seg-")
    assert "seg-approval_wait" in kinds(found["s3c1"], "seg-")
    assert {"seg-running", "seg-stopping"} <= kinds(found["s4c1"], "seg-")
    assert kinds(found["s4c1"], "marker-") == {"marker-cancel", "marker-force"}
    assert kinds(found["s5c1"], "marker-") == {"marker-cancel"}
    assert "status-unknown_outcome" in found["s4c1"].classes
    assert "status-failure" in found["s1c3"].classes


def test_segments_are_placed_on_the_run_axis(page: Path) -> None:
    row = rows(Tree(page.read_text()).root)["s2c2"]
    placed = []
    for seg in row.find("seg"):
        style = dict(p.split(":") for p in seg.attrs["style"].split(";"))
        placed.append((float(style["left"].rstrip("%")), float(style["width"].rstrip("%"))))
    assert all(0 <= left <= 100 and 0 <= width <= 100 for left, width in placed), placed
    assert placed == sorted(placed)


def test_hover_details_and_the_stop_reason(traced: Traced, page: Path) -> None:
    root = Tree(page.read_text()).root
    [stop] = [e for e in root.walk() if e.attrs.get("id") == "stop"]
    assert "final answer accepted" in stop.all_text()
    assert "completed" in stop.classes
    killed = rows(root)["s4c1"].attrs["title"]
    for phase in ("queued", "started", "cancel_requested", "signal_sent", "force_terminated"):
        assert phase in killed
    assert "unknown_outcome/timeout" in killed
    parked = rows(root)["s3c1"]
    [approval] = [e for e in parked.find("seg-approval_wait")]
    assert traced.approval_id in approval.attrs["title"]


def test_recorded_text_is_escaped(page: Path) -> None:
    text = page.read_text()
    assert "<b>x</b>" not in text
    assert html.escape(MARKUP_PATH, quote=True) in text
    args = [e.all_text() for e in Tree(text).root.find("args")]
    assert any(MARKUP_PATH in a.replace('\\"', '"') for a in args), args


def test_hostile_text_cannot_open_an_element_or_a_script() -> None:
    hostile = '</script><script>alert(1)</script><img src=x onerror="alert(2)">'
    call = hand_made_call("c1", agent=hostile, arguments=hostile, message=hostile, detail=hostile)
    page = trace_html.render(trace(hand_made_run([call], goal=hostile, reason=hostile)))
    assert page.count("<script>") == 1
    assert "<img" not in page
    root = Tree(page).root
    assert not [e for e in root.walk() if e.tag == "img"]
    assert hostile in rows(root)["c1"].attrs["title"]


def test_no_network_is_needed(page: Path) -> None:
    text = page.read_text()
    assert "default-src 'none'" in text
    for needle in ("http://", "https://", "src=", "<link"):
        assert needle not in text, needle


# ---------------------------------------------------------------- in a real browser


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found is not None:
            return found
    if os.environ.get("EXECGATE_REQUIRE_BROWSER") == "1":
        pytest.fail("EXECGATE_REQUIRE_BROWSER=1 but no chromium is installed")
    pytest.skip("no chromium on this machine (apt-get install chromium)")


@pytest.fixture(scope="module")
def chromium() -> str:
    """Resolved before the daemon's run is made, so a skip costs nothing."""
    return browser()


def headless(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu"]
    cmd += [f"--user-data-dir={tmp / 'profile'}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_the_browser_renders_the_bars_and_runs_the_script(
    chromium: str, page: Path, tmp_path: Path
) -> None:
    dom = headless(chromium, tmp_path, "--dump-dom", page.as_uri()).stdout
    root = Tree(dom).root
    found = rows(root)
    assert list(found) == CALLS
    assert "seg-lock_wait" in kinds(found["s2c2"], "seg-")
    assert kinds(found["s4c1"], "marker-") == {"marker-cancel", "marker-force"}
    # The inline script ran: it drew the axis and moved every title into a tooltip.
    assert len(root.find("tick")) == 6
    gantt = next(e for e in root.walk() if e.attrs.get("id") == "gantt")
    assert not [e for e in gantt.walk() if "title" in e.attrs]
    assert "force_terminated" in found["s4c1"].attrs["data-tip"]


def test_a_screenshot_of_the_page_shows_more_than_a_blank_page(
    chromium: str, page: Path, tmp_path: Path
) -> None:
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>\n")
    sizes = {}
    for name, source in (("trace", page), ("blank", blank)):
        shot = tmp_path / f"{name}.png"
        headless(
            chromium, tmp_path, f"--screenshot={shot}", "--window-size=1400,800", source.as_uri()
        )
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
        assert data[12:16] == b"IHDR"
        assert struct.unpack(">II", data[16:24]) == (1400, 800)
        sizes[name] = len(data)
    assert sizes["trace"] > 5 * sizes["blank"], sizes


# ---------------------------------------------------------------- what an operator reads


def test_the_start_time_and_the_time_zone_are_on_the_page(page: Path) -> None:
    root = Tree(page.read_text()).root
    [started] = [e for e in root.walk() if e.attrs.get("id") == "started"]
    assert started.text.startswith("started ")
    assert re.search(r"times shown in UTC[+-]\d\d:\d\d", started.text)
    [moment] = [e for e in started.walk() if e.tag == "time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC[+-]\d\d:\d\d", moment.text)
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d"
    assert re.fullmatch(iso, moment.attrs["datetime"])


def test_the_outcome_and_the_label_are_never_cut(page: Path) -> None:
    text = page.read_text()
    assert "text-overflow:ellipsis" not in text
    [widths] = re.findall(r'id="gantt" style="--label:(\d+)ch;--outcome:(\d+)ch"', text)
    assert int(widths[1]) >= len("unknown_outcome/timeout")
    assert int(widths[0]) >= len("s4c1 run_command · bot")


def test_the_approval_id_and_approver_are_on_the_bar_tooltip(traced: Traced, page: Path) -> None:
    parked = rows(Tree(page.read_text()).root)["s3c1"]
    expected = f"approval {traced.approval_id} (rule publish: publishing needs a human): "
    expected += "approved by alice"
    assert expected in parked.attrs["title"]
    [segment] = list(parked.find("seg-approval_wait"))
    assert expected in segment.attrs["title"]


def test_the_kill_marker_names_the_survivors(page: Path) -> None:
    killed = rows(Tree(page.read_text()).root)["s4c1"]
    [force] = list(killed.find("marker-force"))
    assert re.search(
        r"force kill \+\d+\.\d{3}s after \d+ms grace: .*; survivors 0$", force.attrs["title"]
    )


def test_the_legend_says_what_each_colour_and_mark_means(page: Path) -> None:
    root = Tree(page.read_text()).root
    [legend] = [e for e in root.walk() if e.attrs.get("id") == "legend"]
    text = legend.all_text()
    for meaning in (
        "queued: accepted, not yet scheduled",
        "approval wait: parked by an ask rule",
        "lock wait: behind a conflicting call",
        "stopping: from the cancel request until the call stopped",
        "cancel requested (a cancel, a timeout or the daemon's shutdown)",
        "force kill (SIGKILL once the grace ran out)",
    ):
        assert meaning in text
