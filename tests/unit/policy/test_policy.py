"""The policy engine without a daemon: precedence, globs, matchers, the loader's errors,
and the shipped default policy.

Precedence is checked as a property (hypothesis) against an oracle written here from
the rules the module docstring of `executor.policy.model` states, so a change to the
engine's matching or its precedence shows up as a counterexample, not as a test that
merely agrees with itself.
"""

from __future__ import annotations

import fnmatch
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execgate.executor.core.errors import PolicyError, ToolError
from execgate.executor.core.outcomes import ErrorClass, Status
from execgate.executor.policy import (
    Effect,
    Policy,
    PolicyInput,
    Rule,
    default_policy_path,
    load_policy,
    parse_policy,
    path_glob,
)
from execgate.executor.policy.model import Condition, decide

# ---------------------------------------------------------------- precedence (property)

TOOLS = ("read_file", "write_file", "run_command", "search")
TOOL_GLOBS = ("read_file", "*_file", "run_*", "*", "s?arch", "write_*")
PATHS = ("a.txt", "src/a.py", "src/b/c.py", ".env", "secret/x", "docs/.env")
PATH_GLOBS = ("**", "src/**", "*.txt", "**/.env", "secret/", "src/*.py", "**/*.py")


def _oracle_matches(rule: Rule, call: PolicyInput) -> bool:
    """What the docstring says: every matcher must match; deny/ask read paths as ANY
    touched path, allow as ALL of them (and a call touching none never matches)."""
    if rule.tools and not any(fnmatch.fnmatchcase(call.tool, g) for g in rule.tools):
        return False
    if rule.paths:
        hits = [any(path_glob(p, g) for g in rule.paths) for p in call.paths]
        if not hits:
            return False
        return all(hits) if rule.effect is Effect.ALLOW else any(hits)
    return True


def _oracle_effect(rules: list[Rule], default: Effect, call: PolicyInput) -> Effect:
    live = {r.effect for r in rules if not r.shadow and _oracle_matches(r, call)}
    for effect in (Effect.DENY, Effect.ASK, Effect.ALLOW):
        if effect in live:
            return effect
    return default


@st.composite
def rule_sets(draw: st.DrawFn) -> list[Rule]:
    rules = []
    for i in range(draw(st.integers(min_value=0, max_value=7))):
        tools = tuple(draw(st.lists(st.sampled_from(TOOL_GLOBS), max_size=2)))
        paths = tuple(draw(st.lists(st.sampled_from(PATH_GLOBS), max_size=2)))
        effect = draw(st.sampled_from(list(Effect)))
        rules.append(
            Rule(
                id=f"r{i}",
                effect=effect,
                reason=f"reason of r{i}",
                # The loader refuses a rule without a matcher; give it one.
                tools=tools or (() if paths else ("*",)),
                paths=paths,
                shadow=draw(st.booleans()),
                approvers=("sec",) if effect is Effect.ASK else (),
            )
        )
    return rules


calls = st.builds(
    lambda tool, paths: PolicyInput(tool=tool, paths=tuple(paths)),
    st.sampled_from(TOOLS),
    st.lists(st.sampled_from(PATHS), max_size=3, unique=True),
)


@settings(max_examples=200, deadline=None)
@given(
    rules=rule_sets(),
    call=calls,
    default=st.sampled_from([Effect.ALLOW, Effect.DENY]),
    data=st.data(),
)
def test_precedence_is_deny_ask_allow_in_any_rule_order(
    rules: list[Rule], call: PolicyInput, default: Effect, data: st.DataObject
) -> None:
    first = decide(tuple(rules), default, "rev", call)
    expected = _oracle_effect(rules, default, call)
    assert first.effect is expected

    matching = [r for r in rules if _oracle_matches(r, call)]
    live = [r for r in matching if not r.shadow]
    assert set(first.rule_ids) == {r.id for r in live if r.effect is expected}
    if not live:
        assert first.rule_ids == ()
    # Shadow rules are reported when they match, and never decide anything.
    assert set(first.shadow) == {(r.id, r.effect) for r in matching if r.shadow}
    assert decide(tuple(r for r in rules if not r.shadow), default, "rev", call).effect is expected
    assert (first.ask is not None) == (expected is Effect.ASK)

    for order in (list(reversed(rules)), *(data.draw(st.permutations(rules)) for _ in range(3))):
        again = decide(tuple(order), default, "rev", call)
        assert again.effect is first.effect
        assert set(again.rule_ids) == set(first.rule_ids)
        assert set(again.shadow) == set(first.shadow)


def test_file_level_shadow_mode_enforces_nothing() -> None:
    policy = parse_policy(
        textwrap.dedent(
            """\
            version: 1
            default: allow
            mode: shadow
            rules:
              - {id: no-runs, effect: deny, tools: [run_command]}
            """
        ),
        "p.yaml",
    )
    decision = policy.decide(PolicyInput(tool="run_command", argv=("ls",)))
    assert decision.effect is Effect.ALLOW
    assert decision.rule_ids == ()
    assert decision.shadow == (("no-runs", Effect.DENY),)


def test_rule_level_shadow_is_reported_beside_the_live_decision() -> None:
    policy = parse_policy(
        textwrap.dedent(
            """\
            version: 1
            rules:
              - {id: reads, effect: allow, tools: [read_file]}
              - {id: trial, effect: deny, tools: [read_file], paths: ["*.md"], mode: shadow}
            """
        ),
        "p.yaml",
    )
    decision = policy.decide(PolicyInput(tool="read_file", paths=("README.md",)))
    assert (decision.effect, decision.rule_ids) == (Effect.ALLOW, ("reads",))
    assert decision.shadow == (("trial", Effect.DENY),)
    assert policy.decide(PolicyInput(tool="read_file", paths=("a.py",))).shadow == ()


def test_require_refuses_deny_as_rejected_policy_denied_and_returns_ask() -> None:
    policy = parse_policy(
        textwrap.dedent(
            """\
            version: 1
            rules:
              - {id: no-env, effect: deny, paths: ["**/.env"], reason: secrets}
              - {id: confirm, effect: ask, tools: [write_file], approvers: [sec]}
              - {id: files, effect: allow, tools: ["*_file"]}
            """
        ),
        "p.yaml",
    )
    assert policy.require(PolicyInput(tool="read_file", paths=("a",))).rule_ids == ("files",)
    # An ask is not refused here: the dispatcher parks the call for an approver.
    asked = policy.require(PolicyInput(tool="write_file", paths=("a",)))
    assert (asked.effect, asked.rule_ids) == (Effect.ASK, ("confirm",))
    assert asked.ask is not None
    assert asked.ask.approvers == ("sec",)
    for call, rule in (
        (PolicyInput(tool="read_file", paths=(".env",)), "no-env"),
        (PolicyInput(tool="list_dir", paths=("a",)), "default"),
    ):
        with pytest.raises(ToolError) as info:
            policy.require(call)
        assert info.value.error_class is ErrorClass.POLICY_DENIED
        assert info.value.status is Status.REJECTED
        assert f"({rule})" in str(info.value)


# ---------------------------------------------------------------- path_glob


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        # `*` stays within one segment, and matches dotfiles (it is not a shell glob).
        ("*.py", "a.py", True),
        ("*.py", "src/a.py", False),
        ("src/*", "src/a", True),
        ("src/*", "src/a/b", False),
        ("*", "a", True),
        ("*", "a/b", False),
        ("*", ".env", True),
        # `**` spans segments.
        ("**", "a/b/c", True),
        ("src/**", "src/a/b/c.py", True),
        ("src/**", "lib/src/a.py", False),
        ("a/**/b", "a/b", True),
        ("a/**/b", "a/x/y/b", True),
        ("a/**/b", "a/x/yb", False),
        # `**/x`: x at any depth, the top included; never a suffix of a longer name.
        ("**/x", "x", True),
        ("**/x", "a/b/x", True),
        ("**/x", "ax", False),
        ("**/x", "a/bx", False),
        ("**/x", "x/y", False),
        # Trailing `/`: everything below the directory, not a sibling with a longer name.
        ("secret/", "secret/x", True),
        ("secret/", "secret/a/b", True),
        ("secret/", "secretx/y", False),
        ("secret/", "other/secret/x", False),
        ("**/.ssh/", ".ssh/id_rsa", True),
        ("**/.ssh/", "home/u/.ssh/id_rsa", True),
        # `?`: exactly one character, never `/`.
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("a?c", "a/c", False),
        # The whole path must match: no implicit prefix or suffix.
        ("a.txt", "dir/a.txt", False),
        ("dir", "dir/a.txt", False),
        # Case-sensitive.
        ("*.PEM", "x.pem", False),
        ("secret/", "SECRET/x", False),
        # `[...]` is a character class (the shell's glob, policy.globs); `\\[` a literal.
        ("[ab].txt", "a.txt", True),
        ("[ab].txt", "[ab].txt", False),
        ("\\[ab].txt", "[ab].txt", True),
        # Everything else is literal, regex metacharacters and braces included.
        ("a.b", "axb", False),
        ("a.b", "a.b", True),
        ("a+b", "aab", False),
        ("a+b", "a+b", True),
        ("(x)|y", "y", False),
        ("(x)|y", "(x)|y", True),
        ("a{b,c}", "ab", False),
        ("^a$", "^a$", True),
    ],
)
def test_path_glob(pattern: str, path: str, expected: bool) -> None:
    assert path_glob(path, pattern) is expected


# ---------------------------------------------------------------- any / all over touched sets


def test_deny_with_paths_matches_when_any_touched_path_is_denied() -> None:
    rule = Rule(id="d", effect=Effect.DENY, paths=("**/.env",))
    assert rule.matches(PolicyInput(tool="search", paths=("a.py", "b/c.py", "b/.env", "z")))
    assert not rule.matches(PolicyInput(tool="search", paths=("a.py", "b/c.py")))


def test_ask_with_paths_matches_when_any_touched_path_matches() -> None:
    rule = Rule(id="q", effect=Effect.ASK, paths=("deploy/",), approvers=("ops",))
    assert rule.matches(PolicyInput(tool="write_file", paths=("src/a", "deploy/prod.yaml")))


def test_allow_with_paths_needs_every_touched_path_inside() -> None:
    rule = Rule(id="a", effect=Effect.ALLOW, paths=("src/**", "docs/*.md"))
    assert rule.matches(PolicyInput(tool="search", paths=("src/a.py", "docs/x.md")))
    assert not rule.matches(PolicyInput(tool="search", paths=("src/a.py", ".env")))
    assert not rule.matches(PolicyInput(tool="search", paths=("src/a.py", "docs/sub/x.md")))


@pytest.mark.parametrize("effect", list(Effect))
@pytest.mark.parametrize("matcher", ["paths", "tables", "hosts"])
def test_a_set_matcher_never_matches_a_call_touching_nothing(effect: Effect, matcher: str) -> None:
    rule = Rule(id="r", effect=effect, **{matcher: ("**",)})  # type: ignore[arg-type]
    assert not rule.matches(PolicyInput(tool="noop"))


def test_tables_and_hosts_follow_the_same_any_all_reading() -> None:
    deny = Rule(id="d", effect=Effect.DENY, tables=("users",))
    allow = Rule(id="a", effect=Effect.ALLOW, tables=("log_*",))
    assert deny.matches(PolicyInput(tool="sql", tables=("log_a", "users")))
    assert not allow.matches(PolicyInput(tool="sql", tables=("log_a", "users")))
    assert allow.matches(PolicyInput(tool="sql", tables=("log_a", "log_b")))
    hosts = Rule(id="h", effect=Effect.ALLOW, hosts=("*.example.com",))
    assert hosts.matches(PolicyInput(tool="fetch", hosts=("a.example.com",)))
    assert not hosts.matches(PolicyInput(tool="fetch", hosts=("a.example.com", "evil.org")))


# ---------------------------------------------------------------- argv_prefix


GIT_STATUS = Rule(id="gs", effect=Effect.DENY, argv_prefix=(("git", "status"),))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("git", "status"), True),
        (("git", "status", "-s"), True),
        (("git", "status && rm -rf /"), False),
        (("git", "statusx"), False),
        (("git",), False),
        (("sh", "-c", "git status"), False),
        (("/usr/bin/git", "status"), False),
        ((" git", "status"), False),
        (("git", "-C", ".", "status"), False),
        (None, False),
    ],
)
def test_argv_prefix_is_token_exact(argv: tuple[str, ...] | None, expected: bool) -> None:
    assert GIT_STATUS.matches(PolicyInput(tool="run_command", argv=argv)) is expected


def test_argv_prefix_list_of_lists_from_yaml() -> None:
    policy = parse_policy(
        textwrap.dedent(
            """\
            version: 1
            default: allow
            rules:
              - id: no-rm
                effect: deny
                argv_prefix: [[rm], [git, push]]
              - id: no-status
                effect: deny
                argv_prefix: [git, status]
            """
        ),
        "p.yaml",
    )
    rules = {r.id: r for r in policy.rules}
    assert rules["no-rm"].argv_prefix == (("rm",), ("git", "push"))
    assert rules["no-status"].argv_prefix == (("git", "status"),)

    def effect(*argv: str) -> Effect:
        return policy.decide(PolicyInput(tool="run_command", argv=argv)).effect

    assert effect("rm") is Effect.DENY
    assert effect("rm", "-rf", "x") is Effect.DENY
    assert effect("git", "push", "--force") is Effect.DENY
    assert effect("git", "status") is Effect.DENY
    assert effect("git", "pull") is Effect.ALLOW
    assert effect("rmdir", "x") is Effect.ALLOW
    assert effect("rm\n", "x") is Effect.ALLOW  # another token: cannot run `rm` either
    # A non-command tool has no argv: an argv rule never matches it.
    assert policy.decide(PolicyInput(tool="read_file", paths=("rm",))).effect is Effect.ALLOW


# ---------------------------------------------------------------- when conditions


@pytest.mark.parametrize(
    ("condition", "args", "expected"),
    [
        (Condition("mode", "equals", "fast"), {"mode": "fast"}, True),
        (Condition("mode", "equals", "fast"), {"mode": "fast "}, False),
        (Condition("mode", "equals", "fast"), {}, False),
        (Condition("n", "in", [1, 2]), {"n": 2}, True),
        (Condition("n", "in", [1, 2]), {"n": 3}, False),
        (Condition("n", "in", [1, 2]), {"m": 1}, False),
        # `matches` is a full match, and only of strings.
        (Condition("cmd", "matches", "git (status|log)"), {"cmd": "git status"}, True),
        (Condition("cmd", "matches", "git (status|log)"), {"cmd": "git status; rm"}, False),
        (Condition("cmd", "matches", "git (status|log)"), {"cmd": "x git log"}, False),
        (Condition("cmd", "matches", ".*"), {"cmd": ["a"]}, False),
        (Condition("cmd", "matches", ".*"), {}, False),
    ],
)
def test_when_condition(condition: Condition, args: dict[str, object], expected: bool) -> None:
    assert condition.holds(args) is expected
    rule = Rule(id="w", effect=Effect.DENY, when=(condition,))
    assert rule.matches(PolicyInput(tool="t", args=args)) is expected


def test_when_conditions_from_yaml_all_must_hold() -> None:
    policy = parse_policy(
        textwrap.dedent(
            """\
            version: 1
            default: allow
            rules:
              - id: big-replace
                effect: deny
                tools: [edit_file]
                when:
                  - {arg: replace_all, equals: true}
                  - {arg: path, matches: "src/.*"}
            """
        ),
        "p.yaml",
    )

    def effect(**args: object) -> Effect:
        return policy.decide(PolicyInput(tool="edit_file", args=args)).effect

    assert effect(replace_all=True, path="src/a.py") is Effect.DENY
    assert effect(replace_all=False, path="src/a.py") is Effect.ALLOW
    assert effect(replace_all=True, path="lib/a.py") is Effect.ALLOW
    assert effect(path="src/a.py") is Effect.ALLOW  # a missing argument never matches


# ---------------------------------------------------------------- loader errors


def _refused(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(textwrap.dedent(text), "p.yaml")
    err = info.value
    assert str(err).startswith(f"p.yaml:{err.line}:{err.column}: "), str(err)
    assert err.path == "p.yaml"
    return err


ONE_RULE = """\
version: 1
rules:
  - id: a
    effect: {effect}
    tools: [x]
{extra}"""


@pytest.mark.parametrize(
    ("text", "line", "column", "says"),
    [
        ("version: 1\nbogus: 1\n", 2, 1, "file: unknown key 'bogus'"),
        (
            ONE_RULE.format(effect="allow", extra="    tool: y\n"),
            6,
            5,
            "rules[0]: unknown key 'tool'",
        ),
        ("version: 1\nversion: 1\n", 2, 1, "file: 'version' appears twice"),
        (
            ONE_RULE.format(effect="allow", extra="    tools: [y]\n"),
            6,
            5,
            "rules[0]: 'tools' appears twice",
        ),
        (
            ONE_RULE.format(effect="allow", extra="  - id: a\n    effect: deny\n    tools: [y]\n"),
            6,
            5,
            "rules[1].id: 'a' is used twice",
        ),
        (
            ONE_RULE.format(effect="maybe", extra=""),
            4,
            13,
            "rules[0].effect: must be allow or ask or deny",
        ),
        (
            ONE_RULE.format(effect="ask", extra=""),
            4,
            13,
            "rules[0].approvers: an ask rule names who",
        ),
        (
            ONE_RULE.format(effect="allow", extra="    approvers: [bob]\n"),
            6,
            16,
            "rules[0].approvers: only an ask rule has approvers",
        ),
        (
            ONE_RULE.format(effect="deny", extra="    ttl: 60\n"),
            6,
            10,
            "rules[0].ttl: only an ask rule has ttl",
        ),
        (
            ONE_RULE.format(effect="ask", extra="    approvers: [bob]\n    ttl: -1\n"),
            7,
            10,
            "rules[0].ttl: seconds, a positive number",
        ),
        (
            ONE_RULE.format(effect="ask", extra="    approvers: [bob]\n    ttl: soon\n"),
            7,
            10,
            "rules[0].ttl: seconds, a positive number",
        ),
        (
            ONE_RULE.format(effect="ask", extra="    approvers: [bob]\n    ttl: true\n"),
            7,
            10,
            "rules[0].ttl: seconds, a positive number",
        ),
        (
            "version: 1\nrules:\n  - id: a\n    effect: deny\n    reason: no matcher\n",
            3,
            5,
            "rules[0]: needs at least one matcher",
        ),
        (
            "version: 1\nrules:\n  - id: a\n    effect: deny\n    when:\n"
            '      - {arg: x, matches: "("}\n',
            6,
            27,
            "rules[0].when[0].matches: not a regex",
        ),
        ("version: 2\n", 1, 10, "version: must be 1"),
        ("version: '1'\n", 1, 10, "version: must be 1"),
        ("default: deny\n", 1, 1, "version: must be 1"),
        ("version: 1\ndefault: ask\n", 2, 10, "default: must be allow or deny"),
        ("version: 1\ndefault: deny: allow\n", 2, 14, "not valid YAML: mapping values"),
        ("version: 1\nrules:\n\t- id: a\n", 3, 1, "not valid YAML"),
    ],
)
def test_loader_error_names_file_line_column_and_field(
    text: str, line: int, column: int, says: str
) -> None:
    err = _refused(text)
    assert (err.line, err.column) == (line, column), str(err)
    assert f"p.yaml:{line}:{column}: {says}" in str(err)


EXAMPLES = """\
version: 1
rules:
  - id: env
    effect: deny
    paths: ["**/.env"]
    examples:
      match:
        - {tool: read_file, paths: [.env]}
        - {tool: read_file, paths: [a/b/.env]}
      not_match:
        - {tool: read_file, paths: [env.py]}
        - {tool: search, paths: [src/a.py, conf/.env]}
"""


def test_passing_examples_load() -> None:
    text = EXAMPLES.replace("        - {tool: search, paths: [src/a.py, conf/.env]}\n", "")
    assert [r.id for r in parse_policy(text, "p.yaml").rules] == ["env"]


def test_a_not_match_example_that_matches_refuses_the_file_at_its_line() -> None:
    err = _refused(EXAMPLES)
    assert (err.line, err.column) == (12, 11)
    assert "rules[0].examples.not_match[1]: rule 'env' matches this example" in str(err)


def test_a_match_example_that_does_not_match_refuses_the_file_at_its_line() -> None:
    text = EXAMPLES.replace("[a/b/.env]", "[a/b/.envy]").replace(
        "        - {tool: search, paths: [src/a.py, conf/.env]}\n", ""
    )
    err = _refused(text)
    assert (err.line, err.column) == (9, 11)
    assert "rules[0].examples.match[1]: rule 'env' does not match this example" in str(err)


def test_examples_use_argv_and_args() -> None:
    text = """\
    version: 1
    rules:
      - id: no-push
        effect: deny
        argv_prefix: [git, push]
        when: [{arg: cwd, equals: repo}]
        examples:
          match: [{tool: run_command, argv: [git, push, origin], args: {cwd: repo}}]
          not_match:
            - {tool: run_command, argv: [git, push], args: {cwd: other}}
            - {tool: run_command, argv: [sh, -c, git push], args: {cwd: repo}}
            - {tool: run_command, argv: [git, push], args: {}}
    """
    parse_policy(textwrap.dedent(text), "p.yaml")
    err = _refused(text.replace("[sh, -c, git push]", "[git, push, -f]"))
    assert (err.line, err.column) == (11, 11)
    assert "examples.not_match[1]" in str(err)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "version: 1\nrules:\n  - {id: a, effect: allow, tools: [x], examples: {maybe: []}}\n",
            "'maybe'",
        ),
        (
            "version: 1\nrules:\n  - {id: a, effect: allow, tools: [x],\n"
            "     examples: {match: [{paths: [a]}]}}\n",
            "examples.match[0].tool: required",
        ),
        (
            "version: 1\nrules:\n  - {id: a, effect: allow, tools: [x],\n"
            "     examples: {match: [{tool: x, path: a}]}}\n",
            "unknown key 'path'",
        ),
        (
            "version: 1\nrules:\n  - {id: a, effect: allow, tools: read_file}\n",
            "rules[0].tools: must be a list",
        ),
        (
            "version: 1\nrules:\n  - {id: a, effect: allow, tools: []}\n",
            "rules[0].tools: must be a list",
        ),
        ("version: 1\nrules:\n  - {id: 3, effect: allow, tools: [x]}\n", "rules[0].id: required"),
        ("version: 1\nrules:\n  - {id: a, tools: [x]}\n", "rules[0].effect: required"),
        (
            "version: 1\nrules:\n  - {id: a, effect: deny, tools: [x], mode: dry}\n",
            "rules[0].mode: must be",
        ),
        ("version: 1\nmode: dry\n", "mode: must be enforce or shadow"),
        (
            "version: 1\nrules:\n  - {id: a, effect: deny, when: [{arg: x, equals: 1, in: [1]}]}\n",
            "rules[0].when[0]: needs `arg` and exactly one of",
        ),
        (
            "version: 1\nrules:\n  - {id: a, effect: deny, when: [{arg: x, in: 1}]}\n",
            "rules[0].when[0].in: must be a list",
        ),
        (
            "version: 1\nrules:\n  - {id: a, effect: deny, argv_prefix: []}\n",
            "rules[0].argv_prefix",
        ),
        (
            "version: 1\nrules:\n  - {id: a, effect: deny, argv_prefix: [[rm], git]}\n",
            "rules[0].argv_prefix: must be a list of non-empty strings",
        ),
        ("version: 1\n---\nversion: 1\n", "not valid YAML"),
    ],
)
def test_more_loader_errors_name_the_field(text: str, says: str) -> None:
    err = _refused(text)
    assert err.line > 0, str(err)
    assert says in str(err)


def test_version_true_is_refused() -> None:
    _refused("version: true\n")


def test_ttl_nan_is_refused() -> None:
    _refused(ONE_RULE.format(effect="ask", extra="    approvers: [bob]\n    ttl: .nan\n"))


# ---------------------------------------------------------------- the shipped policy


@pytest.fixture(scope="module")
def shipped() -> Policy:
    return load_policy(default_policy_path())


SECRETS = (".env", "a/b/.env", "x.pem", ".git/hooks/pre-commit", ".ssh/id_rsa", "home/.ssh/config")


@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file", "search"])
@pytest.mark.parametrize("path", SECRETS)
def test_shipped_policy_denies_secrets(shipped: Policy, tool: str, path: str) -> None:
    decision = shipped.decide(PolicyInput(tool=tool, paths=(path,)))
    assert (decision.effect, decision.rule_ids) == (Effect.DENY, ("secrets",))


@pytest.mark.parametrize(
    ("tool", "rule"),
    [
        ("read_file", "workspace-reads"),
        ("search", "workspace-reads"),
        ("list_dir", "workspace-reads"),
        ("write_file", "workspace-writes"),
        ("edit_file", "workspace-writes"),
    ],
)
@pytest.mark.parametrize(
    "path", ["src/app.py", "README.md", "env.py", "docs/keys.md", ".gitignore"]
)
def test_shipped_policy_allows_ordinary_files(
    shipped: Policy, tool: str, rule: str, path: str
) -> None:
    decision = shipped.decide(PolicyInput(tool=tool, paths=(path,)))
    assert (decision.effect, decision.rule_ids) == (Effect.ALLOW, (rule,))


def test_shipped_policy_denies_a_search_touching_an_ordinary_file_and_a_secret(
    shipped: Policy,
) -> None:
    decision = shipped.decide(PolicyInput(tool="search", paths=("src/app.py", ".env")))
    assert (decision.effect, decision.rule_ids) == (Effect.DENY, ("secrets",))


def test_shipped_policy_denies_unknown_tools(shipped: Policy) -> None:
    for tool in ("delete_everything", "Read_file", "read_file ", "fetch"):
        decision = shipped.decide(PolicyInput(tool=tool, paths=("a.txt",)))
        assert (decision.effect, decision.rule_ids) == (Effect.DENY, ()), tool


# ---------------------------------------------------------------- loading and precedence


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


ALLOW_THEN_DENY = """
version: 1
default: allow
rules:
  - {id: allow-run, effect: allow, tools: [run_command], reason: ok}
  - {id: deny-run, effect: deny, tools: ["run_*"], reason: no commands}
"""
DENY_THEN_ALLOW = """
version: 1
default: allow
rules:
  - {id: deny-run, effect: deny, tools: ["run_*"], reason: no commands}
  - {id: allow-run, effect: allow, tools: [run_command], reason: ok}
"""


@pytest.mark.parametrize("text", [ALLOW_THEN_DENY, DENY_THEN_ALLOW])
def test_policy_deny_beats_allow_in_any_order(tmp_path: Path, text: str) -> None:
    policy = load_policy(_policy(tmp_path, text))
    decision = policy.decide(PolicyInput(tool="run_command"))
    assert decision.effect is Effect.DENY
    assert decision.rule_ids == ("deny-run",)
    assert decision.reason == "no commands"
    assert policy.decide(PolicyInput(tool="read_file")).effect is Effect.ALLOW  # the file's default


def test_policy_default_is_deny(tmp_path: Path) -> None:
    policy = load_policy(
        _policy(
            tmp_path,
            """
version: 1
rules:
  - {id: reads, effect: allow, tools: [read_file]}
""",
        )
    )
    assert policy.decide(PolicyInput(tool="read_file")).effect is Effect.ALLOW
    decision = policy.decide(PolicyInput(tool="write_file"))
    assert decision.effect is Effect.DENY
    assert decision.rule_ids == ()


def test_shipped_policy_allows_builtins_and_denies_the_rest() -> None:
    policy = load_policy(default_policy_path())
    for tool in (
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "search",
        "run_command",
        "noop",
    ):
        assert policy.decide(PolicyInput(tool=tool)).effect is Effect.ALLOW, tool
    assert policy.decide(PolicyInput(tool="delete_everything")).effect is Effect.DENY


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("version: 1\ndefualt: allow\n", "defualt"),
        ("version: 1\nrules:\n  - {id: a, effect: allow, tools: [x], tool: y}\n", "tool"),
        ("version: 1\nrules:\n  - {id: a, effect: allow, tools: [x], unless: always}\n", "unless"),
    ],
)
def test_policy_unknown_key_refused_by_name(tmp_path: Path, text: str, key: str) -> None:
    path = _policy(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert repr(key) in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "version: 2\n",
        "- a\n- b\n",
        "version: 1\ndefault: maybe\n",
        "version: 1\nrules: {a: 1}\n",
        "version: 1\nrules:\n  - {id: a, effect: allow}\n",
        "version: 1\nrules:\n  - {id: a, effect: allow, tools: [x]}\n"
        "  - {id: a, effect: deny, tools: [y]}\n",
        "version: 1\nrules: [\n",
    ],
)
def test_policy_malformed_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(PolicyError):
        load_policy(_policy(tmp_path, text))


def test_policy_missing_file_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "absent.yaml")
