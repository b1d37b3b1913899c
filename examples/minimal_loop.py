"""A minimal agent loop against a running execgate daemon, with a scripted model.

    python examples/minimal_loop.py [--addr ADDR]

Two runs, each printed with its terminal state, its reason and the transitions the
daemon recorded:

1. The model writes a note, reads it back, then answers: the run ends `completed`.
2. The model lists the workspace again and again; `max_steps=2` ends the run `expired`
   (rule max_steps) instead of letting it loop forever.

A `ScriptedModel` plays the model so that the example needs no API key; swap in
`execgate.client.models.anthropic` or `.openai` for a real one. The address defaults to
what `Client()` resolves: $EXECGATE_ADDR, then `unix:var/execgate.sock` (`make run`). A
daemon with identities needs a token: set $EXECGATE_TOKEN.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from execgate.client import Client, DaemonUnavailable, Loop, LoopResult
from execgate.client.models.base import Message, Turn
from execgate.client.models.scripted import ScriptedModel

NOTE = "minimal_loop_note.txt"


def answer_from_the_file(messages: Sequence[Message]) -> Turn:
    """The model's last step reacts to what the loop sent back: the file's content."""
    [result] = messages[-1].results
    return ScriptedModel.answer(f"the note says: {result.content.splitlines()[-1]}")


def two_tools_then_an_answer(client: Client) -> LoopResult:
    model = ScriptedModel(
        [
            ScriptedModel.calls(("write_file", {"path": NOTE, "content": "hello from a loop\n"})),
            ScriptedModel.calls(("read_file", {"path": NOTE})),
            answer_from_the_file,
        ]
    )
    return Loop(client, model).run(f"write {NOTE}, read it back, say what it says")


def the_same_call_forever(client: Client) -> LoopResult:
    model = ScriptedModel([ScriptedModel.calls(("list_dir", {"path": "."}))] * 10)
    return Loop(client, model, limits={"max_steps": 2}).run("list the workspace")


def show(client: Client, title: str, result: LoopResult) -> None:
    rule = f" (rule {result.rule})" if result.rule else ""
    print(title)
    print(f"  run {result.run_id} ended: {result.state.value}{rule} -- {result.reason}")
    if result.answer:
        print(f"  answer: {result.answer}")
    print(f"  steps: {result.figures.get('steps')}")
    print("  transitions:")
    for event in client.runs.get(result.run_id).events:
        print(
            f"    {event.seq:3} {event.from_state.value:>17} -> {event.to_state.value:<17}"
            f" {event.reason}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", help="daemon address (default: $EXECGATE_ADDR, then var/)")
    args = parser.parse_args(argv)
    try:
        with Client(args.addr) as client:
            show(client, "scenario 1: two tools, then an answer", two_tools_then_an_answer(client))
            show(client, "scenario 2: the same call, max_steps=2", the_same_call_forever(client))
    except DaemonUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
