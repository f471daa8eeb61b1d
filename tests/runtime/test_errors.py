"""The one helper that unwraps what a task group raised (runtime.errors.expected_leaves)."""

from __future__ import annotations

from runtime.errors import exception_leaves, expected_leaves


class _ExpectedError(Exception):
    pass


def test_every_leaf_of_a_nested_group_is_listed_once() -> None:
    """Nested groups flatten to their leaves in order; a bare exception is its own leaf."""
    a, b, c = _ExpectedError("a"), _ExpectedError("b"), ValueError("c")
    group = ExceptionGroup("outer", [a, ExceptionGroup("inner", [b, c])])
    assert exception_leaves(group) == [a, b, c]
    assert exception_leaves(a) == [a]


def test_expected_leaves_are_returned_only_when_every_leaf_is_expected() -> None:
    """All expected: the leaves; one unexpected leaf anywhere: None (the caller re-raises)."""
    a, b = _ExpectedError("a"), _ExpectedError("b")
    assert expected_leaves(ExceptionGroup("g", [a, ExceptionGroup("h", [b])]), _ExpectedError) == [a, b]
    assert expected_leaves(a, (_ExpectedError, TimeoutError)) == [a]
    assert expected_leaves(ExceptionGroup("g", [a, ExceptionGroup("h", [KeyError("k")])]), _ExpectedError) is None
    assert expected_leaves(KeyError("k"), _ExpectedError) is None
