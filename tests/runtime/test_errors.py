"""The one helper that unwraps what a task group raised (runtime.errors.expected_leaves)."""

from __future__ import annotations

from runtime.errors import exception_leaves, expected_leaves


class _Expected(Exception):
    pass


def test_every_leaf_of_a_nested_group_is_listed_once() -> None:
    """Nested groups flatten to their leaves in order; a bare exception is its own leaf."""
    a, b, c = _Expected("a"), _Expected("b"), ValueError("c")
    group = ExceptionGroup("outer", [a, ExceptionGroup("inner", [b, c])])
    assert exception_leaves(group) == [a, b, c]
    assert exception_leaves(a) == [a]


def test_expected_leaves_are_returned_only_when_every_leaf_is_expected() -> None:
    """All expected: the leaves; one unexpected leaf anywhere: None (the caller re-raises)."""
    a, b = _Expected("a"), _Expected("b")
    assert expected_leaves(ExceptionGroup("g", [a, ExceptionGroup("h", [b])]), _Expected) == [a, b]
    assert expected_leaves(a, (_Expected, TimeoutError)) == [a]
    assert expected_leaves(ExceptionGroup("g", [a, ExceptionGroup("h", [KeyError("k")])]), _Expected) is None
    assert expected_leaves(KeyError("k"), _Expected) is None
