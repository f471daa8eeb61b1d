"""The errors of :mod:`runtime`: a config file that does not decode, a file a setting names that cannot be used.

The runtime helpers know the setting's own name (``ca_file``, ``password_file``) but not the
config file or the section it sits in; the agent and the collector turn a
:class:`SettingFileError` into their own ``ConfigError`` naming the config file and the
dotted field (``broker.ca_file``, ``mqtt.tls.ca_file``), so the operator reads one message
whichever side reports it.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["ConfigFileError", "SettingFileError", "exception_leaves", "expected_leaves"]

E = TypeVar("E", bound=BaseException)


class SettingFileError(ValueError):
    """A file a setting names is missing, unreadable, too open, or holds the wrong thing.

    Attributes:
        setting: the setting that names the file (``"ca_file"``, ``"password_file"``).
        problem: what is wrong, naming the file, and what to do.
    """

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        self.problem = problem
        super().__init__(f"{setting}: {problem}")


class ConfigFileError(ValueError):
    """A config file cannot be read, is not TOML, or does not fit its schema.

    Attributes:
        path: the config file (or the source name given for a document).
        field: the dotted path of the field at fault (``"broker.port"``), ``""`` for the whole file.
        kind: machine-readable, as :attr:`protocol.schema.SchemaError.kind`, plus ``unreadable``
            and ``syntax``.
        problem: what is wrong, and what was expected.
    """

    def __init__(self, path: str, field: str, kind: str, problem: str) -> None:
        self.path = path
        self.field = field
        self.kind = kind
        self.problem = problem
        super().__init__(f"{path}: {field}: {problem}" if field else f"{path}: {problem}")


def exception_leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions ``exc`` stands for: itself, or every leaf of a (nested) exception group,
    as a task group raises them, so a tool can say each failure once instead of a traceback."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in exception_leaves(inner)]
    return [exc]


def expected_leaves(exc: BaseException, expected: type[E] | tuple[type[E], ...]) -> list[E] | None:
    """The leaves of ``exc`` (:func:`exception_leaves`) when every one is an ``expected`` error,
    else None.

    The one way a tool unwraps what its task group raised: the expected failures are said
    once each, without a traceback; anything else (None here) is re-raised by the caller, so a
    bug keeps its traceback and its non-zero exit status (docs/design.md, convention 12).
    """
    leaves = exception_leaves(exc)
    if all(isinstance(leaf, expected) for leaf in leaves):
        return [leaf for leaf in leaves if isinstance(leaf, expected)]
    return None
