"""Errors of the agent package, split by who is at fault.

* :class:`ConfigError` - the operator's config file is wrong (names the file and the field).
* :class:`PolicyError` - the use-case registry asks for more than the local policy allows
  (names the use case and the parameter).
* :class:`ValueRefusedError` - an application handed a value that does not fit its use case.
* :class:`UseCaseStoppedError` - the use case stopped (its lifetime ε cap is spent, its state is
  unreadable, or its parameters changed under its permanent randomness);
  :class:`UseCaseExpiredError`: it is past the end date its registry gives it.
* :class:`ConsentRequiredError` - something was asked of an agent whose user has not opted in
  (:class:`ConsentUnreadableError`: or whose consent record the state key does not open).
* :class:`StateWriteError` - a state file cannot be written (disk full, read-only); it names
  the file and the cause.
* :class:`StateUnreadableError` - a sealed state file cannot be decrypted or parsed; the use cases
  that depend on it stop (their permanent randomness is never redrawn silently).
* :class:`KeyUnavailableError` - the state key cannot be loaded (missing, wrong mode, wrong size).
* :class:`TransportError` - the broker did not acknowledge a report (network, refusal,
  timeout); the report stays in the outbox.
* :class:`AgentBusyError` - another agent process holds the state directory.
"""

from __future__ import annotations

__all__ = [
    "AgentBusyError",
    "AgentError",
    "ConfigError",
    "ConsentRequiredError",
    "ConsentUnreadableError",
    "KeyUnavailableError",
    "PolicyError",
    "StateUnreadableError",
    "StateWriteError",
    "TransportError",
    "UseCaseExpiredError",
    "UseCaseStoppedError",
    "ValueRefusedError",
]


class AgentError(Exception):
    """Base class of every error the agent raises on purpose."""


class ConfigError(AgentError):
    """The config file is unusable.

    Attributes:
        path: the config file.
        field: the dotted path of the offending field (``""`` for the whole file).
        problem: what is wrong, and what was expected.
    """

    def __init__(self, path: str, field: str, problem: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        where = f"{path}: {field}" if field else path
        super().__init__(f"bad config {where}: {problem}")


class PolicyError(AgentError):
    """The registry asks for weaker privacy than the local policy allows.

    Attributes:
        use_case: the offending use case.
        parameter: the parameter (or policy key) at fault.
    """

    def __init__(self, use_case: str, parameter: str, problem: str) -> None:
        self.use_case = use_case
        self.parameter = parameter
        super().__init__(f"use case {use_case!r} refused by local policy: {parameter} {problem}")


class ValueRefusedError(AgentError):
    """A recorded value does not fit its use case (unknown use case, wrong type, out of range)."""


class UseCaseStoppedError(AgentError):
    """The use case no longer records or reports (lifetime ε cap reached, unreadable state, ...)."""


class UseCaseExpiredError(UseCaseStoppedError):
    """The use case is past its ``expires`` date: nothing more is recorded until a registry with a
    later date renews it (:mod:`agent.expiry`). A stop, so a caller that handles stopped use
    cases handles it too; the API names it apart (``use-case-expired``)."""


class ConsentRequiredError(AgentError):
    """Nothing is recorded or sent before the user opts in."""


class ConsentUnreadableError(ConsentRequiredError):
    """A consent record exists but cannot be opened (most often: not the key it was sealed with).

    A :class:`ConsentRequiredError`, since nothing may be recorded or sent, but its message
    says that the key does not open the state, not that the user has not opted in.
    """


class StateWriteError(AgentError):
    """A state file cannot be written (a full disk, a read-only or vanished state directory).

    Nothing of the change it carried was kept: the previous file stands.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot write state file {path}: {reason}")


class StateUnreadableError(AgentError):
    """A sealed state file cannot be decrypted, or its contents cannot be parsed."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"state file {path} is unreadable: {reason}")


class KeyUnavailableError(AgentError):
    """The state encryption key cannot be loaded."""


class TransportError(AgentError):
    """A report was not acknowledged by the broker (it stays in the outbox)."""


class AgentBusyError(AgentError):
    """Another agent process holds the state directory lock."""
