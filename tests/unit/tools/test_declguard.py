"""The secrets' cut shared by command tools and MCP servers (declguard): every form of
a value, in text, in a cut-off tail, in every string of a JSON value."""

from __future__ import annotations

import json

from execgate.executor.tools import ToolOutput
from execgate.executor.tools.declguard import cut, cut_json, masks, redacted

# A quote, a backslash and a non-ASCII letter: each JSON form differs from the value.
SECRET = 'tok"\\é-42'
HIDDEN = masks([("TOKEN", SECRET), ("EMPTY", "")])
FORMS = (SECRET, json.dumps(SECRET)[1:-1], json.dumps(SECRET, ensure_ascii=False)[1:-1])


def test_every_form_of_a_value_is_masked_by_name() -> None:
    assert set(HIDDEN) == set(FORMS)  # an empty value hides nothing
    text = " ".join(f"<{form}>" for form in FORMS)
    assert cut(text, HIDDEN) == "<[secret TOKEN]> <[secret TOKEN]> <[secret TOKEN]>"


def test_a_tail_cut_mid_secret_is_masked_only_when_truncated() -> None:
    tail = "x" * 10 + SECRET[:5]
    assert cut(tail, HIDDEN) == tail
    assert cut(tail, HIDDEN, truncated=True) == "x" * 10 + "[secret TOKEN]"
    # The cap cut `é` in two: decoded, its first byte is U+FFFD.
    broken = (SECRET.encode()[:6]).decode("utf-8", errors="replace")
    assert broken.endswith("\ufffd")
    assert cut("x" + broken, HIDDEN, truncated=True) == "x[secret TOKEN]"


def test_every_string_of_a_json_value_is_cut_keys_too() -> None:
    value = {SECRET: [1, None, f"a {SECRET}", {"k": json.dumps(SECRET)}], "n": 2.5}
    got = cut_json(value, HIDDEN)
    assert got == {
        "[secret TOKEN]": [1, None, "a [secret TOKEN]", {"k": '"[secret TOKEN]"'}],
        "n": 2.5,
    }
    assert cut_json(value, {}) is value  # nothing to hide: untouched


def test_redacted_cuts_text_message_and_structured() -> None:
    out = ToolOutput(text=SECRET, message=f"m {SECRET}", structured={"t": SECRET})
    got = redacted(out, HIDDEN)
    assert (got.text, got.message, got.structured) == (
        "[secret TOKEN]",
        "m [secret TOKEN]",
        {"t": "[secret TOKEN]"},
    )
