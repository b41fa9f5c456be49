"""One typed error hierarchy for the whole tool.

Contract: every error raised for a user mistake, a bad input file or a failed check is a
:class:`NinferError`.  Its message names the file, the tensor and the rule involved (when they
are known) and ends with what to do.  The CLI maps each class to a stable exit code that scripts
can rely on; the library never prints and never calls ``exit``.

Exit codes (stable, documented in docs/cli.md):

====  ======================  =====================================================
code  class                   meaning
====  ======================  =====================================================
0     -                       success
1     NinferError             internal error (a bug: please report it)
2     UsageError              bad command line, missing path, unknown name
3     RecipeError             the recipe is invalid or does not fit the source
4     SourceError             the source checkpoint is unreadable or inconsistent
5     EncodeError             source values cannot be represented (NaN, overflow)
6     ArtifactError           the artifact is malformed, corrupt or fails a check
7     ResourceError           the machine refused a resource (disk full, permission,
                              read-only file system, quota, output locked by another run)
8     SignatureError          a signature is missing, malformed or does not match
9     QualityError            ``ninfer eval`` measured below an opted-in threshold
====  ======================  =====================================================
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "ArtifactError",
    "EncodeError",
    "FormatError",
    "IntegrityError",
    "NinferError",
    "QualityError",
    "RecipeError",
    "ResourceError",
    "SignatureError",
    "SourceError",
    "UsageError",
    "ValueInvariantError",
]


class NinferError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code: ClassVar[int] = 1

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        tensor: str | None = None,
        rule: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.tensor = tensor
        self.rule = rule
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.tensor is not None:
            where.append(f"tensor {self.tensor!r}")
        if self.rule is not None:
            where.append(f"rule {self.rule}")
        text = (": ".join(where) + ": " if where else "") + self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class UsageError(NinferError):
    """Bad command line or API use: missing path, unknown option value."""

    exit_code = 2


class FormatError(UsageError):
    """A name that is not in a closed registry (format, layout, encoder profile)."""


class RecipeError(NinferError):
    """The recipe is malformed, or does not fit the source checkpoint."""

    exit_code = 3


class SourceError(NinferError):
    """The source checkpoint is unreadable, inconsistent, or not the recorded one."""

    exit_code = 4


class EncodeError(NinferError):
    """Source values cannot be encoded (non-finite values, unrepresentable scales)."""

    exit_code = 5


class ArtifactError(NinferError):
    """The artifact is malformed, hostile, or fails a structural check."""

    exit_code = 6


class IntegrityError(ArtifactError):
    """A digest does not match: the bytes changed after they were written."""


class ValueInvariantError(ArtifactError):
    """Stored words break a format's value rules (illegal code, invalid scale)."""


class ResourceError(NinferError):
    """The machine refused a resource: no space, no permission, read-only, quota, or a lock.

    The message names the path and, for space, the bytes needed and the bytes free.
    """

    exit_code = 7


class SignatureError(NinferError):
    """A model-directory signature is missing, malformed, or does not match the files."""

    exit_code = 8


class QualityError(NinferError):
    """``ninfer eval`` measured a metric below a threshold the user asked for."""

    exit_code = 9
