"""results.bound: a result's text cut to a byte cap, never half a character."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from execgate.executor.pipeline import results


def test_bound_examples() -> None:
    assert results.bound("hello", 10) == ("hello", False, 5)
    assert results.bound("hello", 5) == ("hello", False, 5)
    assert results.bound("hello", 4) == ("hell", True, 4)
    # "é" is 2 bytes, "€" 3, "😀" 4: never half a character.
    assert results.bound("éé", 3) == ("é", True, 2)
    assert results.bound("€€", 5) == ("€", True, 3)
    assert results.bound("a😀", 4) == ("a", True, 1)
    assert results.bound("😀", 3) == ("", True, 0)
    assert results.bound("", 0) == ("", False, 0)
    assert results.bound("x", 0) == ("", True, 0)


@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))), st.integers(0, 200))
def test_bound_properties(text: str, cap: int) -> None:
    cut, truncated, returned = results.bound(text, cap)
    data = cut.encode("utf-8")
    assert len(data) <= cap
    assert returned == len(data)
    assert text.startswith(cut)
    assert truncated == (len(text.encode("utf-8")) > cap)
    if truncated:  # maximal: the next character would not have fit
        nxt = text[len(cut)]
        assert len(data) + len(nxt.encode("utf-8")) > cap
    else:
        assert cut == text
