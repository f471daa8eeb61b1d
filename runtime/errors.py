"""The one error of :mod:`runtime`: a file a setting names cannot be used.

The runtime helpers know the setting's own name (``ca_file``, ``password_file``) but not the
config file or the section it sits in; the agent and the collector turn a
:class:`SettingFileError` into their own ``ConfigError`` naming the config file and the
dotted field (``broker.ca_file``, ``mqtt.tls.ca_file``), so the operator reads one message
whichever side reports it.
"""

from __future__ import annotations

__all__ = ["SettingFileError"]


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
