"""Typed errors: one base class, specific subclasses whose messages name the thing at fault.

The CLI turns any ``CropbenchError`` into one line on stderr and exit code 2; anything else is
a bug and keeps its traceback.
"""

from __future__ import annotations


class CropbenchError(Exception):
    """Base class of every error a user can cause by what they pass in."""


class ConfigError(CropbenchError, ValueError):
    """A knob has a value outside what it accepts."""


class UnusedSettingError(ConfigError):
    """A setting given for a run has nowhere to go in a case it would run: refused rather than ignored."""


class StoreError(CropbenchError):
    """A store (plate, image, chunk) is missing, is not what was expected, or is corrupt."""


class ObjectTableError(CropbenchError):
    """The object table is missing, lacks columns, or holds unusable rows."""


class ImportInputError(CropbenchError):
    """Input for ``cropbench import`` (table, images) cannot be turned into a plate."""


class OutputError(CropbenchError):
    """A result or output location cannot be written."""


class WorkerError(CropbenchError):
    """A DataLoader worker failed, hung or was stopped; the message names the worker and the cause."""


class PeerUnavailableError(CropbenchError):
    """A peer loader cannot run here: its optional extra is not installed, or the layout does not suit it."""


class DistributedError(CropbenchError):
    """A rank of a distributed run died, hung or could not join; the message names the rank and the timeout."""
