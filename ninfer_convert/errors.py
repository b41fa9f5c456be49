"""One typed error hierarchy for the whole tool.

Contract: every error raised for a user mistake, a bad input file or a failed check is a
:class:`NinferError`.  Its message names the file, the tensor and the rule involved (when they
are known) and ends with what to do.  The CLI maps each class to a stable exit code that scripts
can rely on; the library never prints and never calls ``exit``.

Every error also carries a ``kind``: a short snake_case id of its failure class, stable across
releases and independent of the wording, so that scripts (``--json`` error objects and verify
findings) and tests can tell failures apart without matching prose.  :data:`KINDS` is the one
table of kinds; each kind belongs to one class (its exit code follows), and a class without a
specific kind at a raise site gets its class's default (:attr:`NinferError.default_kind`).  A
kind is only ever added, never renamed or reused (docs/cli.md "Error kinds").

The context fields are kept apart: ``path`` (the file), ``tensor``, ``rule`` (the normative
rule broken: ``spec Section 7``) and ``where`` (the location inside the file or recipe:
``tensors[3].planes[0].offset``, ``recipe rule at line 12``).

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

from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "KINDS",
    "ArtifactError",
    "EncodeError",
    "ErrorKind",
    "FormatError",
    "IntegrityError",
    "NinferError",
    "QualityError",
    "RecipeError",
    "ResourceError",
    "SchemaError",
    "SignatureError",
    "SourceError",
    "UsageError",
    "ValueInvariantError",
]


class NinferError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code: ClassVar[int] = 1
    default_kind: ClassVar[str] = "internal"

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        path: str | None = None,
        tensor: str | None = None,
        rule: str | None = None,
        where: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.kind = type(self).default_kind if kind is None else kind
        entry = KINDS.get(self.kind)
        if entry is None or not issubclass(type(self), entry.error):
            # A programming error at the raise site: the table is closed.
            raise TypeError(f"{type(self).__name__} cannot have kind {self.kind!r} (see KINDS)")
        self.message = message
        self.path = None if path is None else str(path)
        self.tensor = tensor
        self.rule = rule
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        parts = []
        if self.path is not None:
            parts.append(self.path)
        if self.tensor is not None:
            parts.append(f"tensor {self.tensor!r}")
        if self.where is not None:
            parts.append(self.where)
        if self.rule is not None:
            parts.append(f"rule {self.rule}")
        text = (": ".join(parts) + ": " if parts else "") + self.message
        if self.hint:
            text += f" ({self.hint})"
        return text

    def with_context(self, *, path: str | None = None, tensor: str | None = None) -> NinferError:
        """A copy of this error with ``path`` / ``tensor`` filled where they are unknown (a
        layout does not know the tensor it packs); raise it ``from`` this one.  An error
        already raised is never changed: its traceback and any handler still see it whole."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        if new.path is None and path is not None:
            new.path = str(path)
        if new.tensor is None:
            new.tensor = tensor
        Exception.__init__(new, new.render())
        return new

    def to_json(self) -> dict[str, Any]:
        """The error object of ``--json`` output (docs/cli.md "Error objects")."""
        return {
            "error": type(self).__name__,
            "kind": self.kind,
            "exit_code": self.exit_code,
            "message": self.message,
            "path": self.path,
            "tensor": self.tensor,
            "rule": self.rule,
            "where": self.where,
            "hint": self.hint,
        }


class UsageError(NinferError):
    """Bad command line or API use: missing path, unknown option value."""

    exit_code = 2
    default_kind = "usage"


class FormatError(UsageError):
    """A name that is not in a closed registry (format, layout, encoder profile)."""

    default_kind = "unknown_name"


class RecipeError(NinferError):
    """The recipe is malformed, or does not fit the source checkpoint."""

    exit_code = 3
    default_kind = "recipe_invalid"


class SourceError(NinferError):
    """The source checkpoint is unreadable, inconsistent, or not the recorded one."""

    exit_code = 4
    default_kind = "source_invalid"


class EncodeError(NinferError):
    """Source values cannot be encoded (non-finite values, unrepresentable scales)."""

    exit_code = 5
    default_kind = "not_representable"


class ArtifactError(NinferError):
    """The artifact is malformed, hostile, or fails a structural check."""

    exit_code = 6
    default_kind = "artifact_invalid"


class IntegrityError(ArtifactError):
    """A digest does not match: the bytes changed after they were written."""

    default_kind = "digest_mismatch"


class ValueInvariantError(ArtifactError):
    """Stored words break a format's value rules (illegal code, invalid scale)."""

    default_kind = "value_invariant"


class ResourceError(NinferError):
    """The machine refused a resource: no space, no permission, read-only, quota, or a lock.

    The message names the path and, for space, the bytes needed and the bytes free.
    """

    exit_code = 7
    default_kind = "resource_refused"


class SignatureError(NinferError):
    """A model-directory signature is missing, malformed, or does not match the files."""

    exit_code = 8
    default_kind = "signature_invalid"


class QualityError(NinferError):
    """``ninfer eval`` measured a metric below a threshold the user asked for."""

    exit_code = 9
    default_kind = "below_threshold"


class SchemaError(NinferError):
    """A JSON value does not fit the container schema; ``where`` is its JSON-pointer-like
    location (``tensors[3].planes[0].offset``).

    The schema does not know whose JSON it checks: the reader turns it into an
    :class:`ArtifactError` of the file, the writer into a :class:`UsageError` of the caller, both
    with :meth:`as_error`, so it is rendered one way.  One that escapes is a bug (exit 1).
    """

    default_kind = "schema_violation"

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message, where=where or "(root)")

    def as_error(
        self, cls: type[NinferError], what: str, *, kind: str | None = None, path: str | None = None
    ) -> NinferError:
        """The same failure as ``cls``: ``what`` says whose JSON it is ("invalid header")."""
        return cls(f"{what}: {self.message}", kind=kind, path=path, where=self.where)


@dataclass(frozen=True)
class ErrorKind:
    """One failure class: the error class that carries it and what it means."""

    error: type[NinferError]
    meaning: str


KINDS: dict[str, ErrorKind] = {
    # Defaults of the classes (a raise site that names no specific kind).
    "internal": ErrorKind(NinferError, "a bug: please report it with --debug output"),
    "usage": ErrorKind(UsageError, "bad command line or API use"),
    "unknown_name": ErrorKind(FormatError, "a name that is not in a closed registry"),
    "recipe_invalid": ErrorKind(RecipeError, "the recipe is malformed or does not fit the source"),
    "source_invalid": ErrorKind(SourceError, "the source checkpoint is unreadable or inconsistent"),
    "not_representable": ErrorKind(EncodeError, "source values cannot be encoded"),
    "artifact_invalid": ErrorKind(ArtifactError, "the artifact is malformed or fails a check"),
    "digest_mismatch": ErrorKind(IntegrityError, "a digest does not match the bytes"),
    "value_invariant": ErrorKind(ValueInvariantError, "stored words break a format's value rules"),
    "resource_refused": ErrorKind(ResourceError, "the machine refused a resource"),
    "signature_invalid": ErrorKind(SignatureError, "a signature is missing, malformed or wrong"),
    "below_threshold": ErrorKind(QualityError, "a metric missed an opted-in threshold"),
    "schema_violation": ErrorKind(SchemaError, "a JSON value does not fit the container schema"),
    # Specific kinds.
    "output_exists": ErrorKind(
        UsageError, "the output exists and is not replaced (no --force, or not an artifact)"
    ),
    "not_an_artifact": ErrorKind(UsageError, "the path is not a .ninfer artifact"),
    "source_header": ErrorKind(SourceError, "a safetensors header breaks the format's rules"),
    "source_mismatch": ErrorKind(SourceError, "the source is not the one the artifact recorded"),
    "non_finite_value": ErrorKind(EncodeError, "a NaN or infinity where a format has none"),
    "scale_overflow": ErrorKind(EncodeError, "a group's scale does not fit binary16"),
    "encoder_disagreement": ErrorKind(EncodeError, "a fast encoder disagrees with the oracle"),
    "header_invalid": ErrorKind(ArtifactError, "the header or shard index breaks the schema"),
    "word_mismatch": ErrorKind(ArtifactError, "stored words differ from their re-derivation"),
    "nonzero_padding": ErrorKind(ArtifactError, "layout padding is not all zero bits"),
    "nonzero_gap": ErrorKind(IntegrityError, "a container alignment gap holds non-zero bytes"),
    "no_space": ErrorKind(ResourceError, "no space left (ENOSPC or the free-space check)"),
    "quota_exceeded": ErrorKind(ResourceError, "disk quota exceeded (EDQUOT)"),
    "permission_denied": ErrorKind(ResourceError, "permission denied (EACCES, EPERM)"),
    "read_only": ErrorKind(ResourceError, "read-only file system (EROFS)"),
    "output_locked": ErrorKind(
        ResourceError, "the output is locked by another ninfer convert or sign"
    ),
    "out_of_memory": ErrorKind(ResourceError, "host or GPU memory ran out"),
    "signature_missing": ErrorKind(SignatureError, "no signature file where one is required"),
    "signature_mismatch": ErrorKind(
        SignatureError, "the signature does not verify, or names another key"
    ),
    "signed_files_differ": ErrorKind(
        SignatureError, "files changed, added or removed since signing"
    ),
}
"""Every error kind (docs/cli.md "Error kinds" lists the same table; a test compares them)."""
