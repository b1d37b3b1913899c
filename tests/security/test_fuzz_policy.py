"""Fuzzing the policy loader: any YAML document is a Policy or a typed PolicyError.

Random text, mutations of the shipped policies (lines dropped, duplicated, cut,
characters replaced, values swapped for hostile ones) and documents built from the
format's own keys with random values go through `parse_policy`. Each either loads
or raises `PolicyError` whose message starts with the file's name and names a
field -- never another exception, never a hang.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from execgate.executor.core.errors import IdentityError, PolicyError
from execgate.executor.policy import Policy, parse_policy
from execgate.executor.policy.identity import parse_identities
from execgate.executor.policy.load import CONDITION_OPS, FILE_KEYS, RULE_KEYS
from tests.security.budget import fuzzing

ROOT = Path(__file__).resolve().parents[2] / "policies"
SHIPPED = [p.read_text() for p in sorted(ROOT.rglob("*.yaml")) if "tests" not in p.parts]
SOURCE = "fuzz-policy.yaml"

HOSTILE = st.sampled_from(
    [
        None, True, 0, -1, 1e308, float("nan"), "", "*", "**/", "[", "(", "((a{1000}){1000}){1000}",
        "a" * 5000, "\x00", "\udcff", "${x}", [], {}, [[]], {"a": {"b": []}}, "ask", "deny",
        "allow", "shadow", "1e999", "!!python/object:os.system", "group:", "role:admin",
    ]
)  # fmt: skip
SCALAR = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | HOSTILE
VALUE = st.recursive(
    SCALAR,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(sorted(RULE_KEYS | FILE_KEYS | {"arg", *CONDITION_OPS, "of", "match"}))
            | st.text(max_size=6),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


def _check(text: str) -> None:
    started = time.monotonic()
    refused: PolicyError | None = None
    try:
        assert isinstance(parse_policy(text, SOURCE), Policy)
    except PolicyError as err:
        refused = err
    if refused is not None:
        assert str(refused).startswith(SOURCE), refused
        assert str(refused)[len(SOURCE) :].lstrip(":0123456789 "), refused
    assert time.monotonic() - started < 5, text[:200]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    lines = draw(st.sampled_from(SHIPPED)).splitlines()
    for _ in range(draw(st.integers(1, 5))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["drop", "dup", "cut", "char", "value", "indent"]))
        line = lines[i]
        if kind == "drop":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, line)
        elif kind == "cut":
            lines[i] = line[: draw(st.integers(0, len(line)))]
        elif kind == "char" and line:
            j = draw(st.integers(0, len(line) - 1))
            lines[i] = (
                line[:j] + draw(st.sampled_from(list(":-[]{}&*!|>'\"%@`#,?\t\x00"))) + line[j + 1 :]
            )
        elif kind == "value" and ":" in line:
            key = line.split(":", 1)[0]
            lines[i] = f"{key}: {yaml.safe_dump(draw(VALUE), default_flow_style=True).strip()}"
        else:
            lines[i] = " " * draw(st.integers(0, 6)) + line.lstrip()
    return "\n".join(lines) + "\n"


@st.composite
def built(draw: st.DrawFn) -> str:
    """A document of the format's own keys with random values."""
    rules = draw(st.lists(st.dictionaries(st.sampled_from(sorted(RULE_KEYS)), VALUE), max_size=3))
    top = draw(st.dictionaries(st.sampled_from(sorted(FILE_KEYS | {"reads"})), VALUE, max_size=5))
    top.setdefault("version", 1)
    if draw(st.booleans()):
        top["rules"] = rules
    return yaml.safe_dump(top, allow_unicode=True)


@fuzzing(examples=300)
@given(text=mutated())
def test_mutated_shipped_policies_load_or_fail_typed(text: str) -> None:
    _check(text)


@fuzzing(examples=300)
@given(text=built())
def test_documents_of_policy_keys_load_or_fail_typed(text: str) -> None:
    _check(text)


@fuzzing(examples=200)
@given(text=st.text(max_size=300))
def test_any_text_loads_or_fails_typed(text: str) -> None:
    _check(text)


def test_the_shipped_policies_load() -> None:
    assert SHIPPED
    for text in SHIPPED:
        assert isinstance(parse_policy(text, SOURCE), Policy)


def _one_rule(matches: str) -> str:
    rule = {"id": "r", "effect": "deny", "tools": ["write_file"]}
    rule["when"] = [{"arg": "content", "matches": matches}]  # type: ignore[list-item]
    return yaml.safe_dump({"version": 1, "rules": [rule]}, width=10**6)


def test_policy_regexes_beyond_the_bound_are_refused_at_load() -> None:
    for pattern in ("((a{1000}){1000}){1000}", "a" * 2000, "(" * 100 + ")" * 100):
        with pytest.raises(PolicyError, match=re.escape("rules[0].when[0].matches")):
            parse_policy(_one_rule(pattern), SOURCE)


def test_reads_grants_are_checked() -> None:
    base = "version: 1\nrules: []\n"
    for bad, field in (
        ("reads: {}", "reads"),
        ("reads: [{agents: [carol]}]", "reads[0].of"),
        ("reads: [{of: [bob]}]", "reads[0].agents"),
        ("reads: [{agents: [carol], of: ['b[o]b']}]", "reads[0].of"),
        ("reads: [{agents: [carol], of: [bob], extra: 1}]", "reads[0]"),
    ):
        with pytest.raises(PolicyError, match=re.escape(field)):
            parse_policy(base + bad + "\n", SOURCE)
    ok = parse_policy(
        base + "reads: [{agents: [carol, 'group:audit'], of: [bob, 'ci-*']}]\n", SOURCE
    )
    assert ok.reads


# Found by the fuzzers above: both escaped the loaders as yaml's own exceptions.
UNUSABLE_YAML = [
    "\x08",  # a control character: yaml's reader refuses before parsing
    "version: 1\nrules: []\n\x00\n",
    "version: !!python/object:os.system 1\n",  # a tag SafeLoader has no constructor for
    "version: 1\ndefault: !!int deny\n",  # a constructor failing: ValueError
    "version: 1\nrules: [{id: a, effect: allow, tools: [!!binary x]}]\n",
]


@pytest.mark.parametrize("text", UNUSABLE_YAML)
def test_unusable_yaml_is_a_typed_error_of_both_loaders(text: str) -> None:
    with pytest.raises(PolicyError, match=f"^{re.escape(SOURCE)}"):
        parse_policy(text, SOURCE)
    with pytest.raises(IdentityError, match=r"^ids\.yaml"):
        parse_identities(text.replace("rules: []", "identities: []"), "ids.yaml")
