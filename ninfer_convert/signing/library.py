"""The optional model-signing library (PyPI ``model-signing``, the extra ``[sign]``).

Contract: :func:`library` imports it on demand (never at module import) or raises
:class:`~ninfer_convert.errors.UsageError` naming the extra; :func:`hashing_config` is the one
serialization every signature uses: file-level SHA-256 over every file of the model directory
but the signature file itself (``.git`` files included).  :func:`sigstore_error` is the wording
of a Sigstore failure (it needs the network) and :func:`describe` that of any library error.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import SignatureError, UsageError
from .files import inside

__all__ = ["EXTRA", "HASH", "describe", "hashing_config", "library", "sigstore_error"]

EXTRA = "sign"
_INSTALL = f'pip install "ninfer-convert[{EXTRA}]"'

HASH = "sha256"
"""The per-file digest of the signed statement."""


def library() -> ModuleType:
    """``model_signing`` (with its submodules), or a UsageError naming the extra."""
    try:
        import model_signing
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError as exc:
        raise UsageError(
            f"signing needs the optional model-signing library, which is not usable here ({exc})",
            hint=f"install the [{EXTRA}] extra: {_INSTALL}",
        ) from None
    return model_signing


def hashing_config(ms: ModuleType, root: Path, signature: Path) -> Any:
    """File-level SHA-256 over everything but the signature file (and nothing git-related)."""
    inner = inside(root, signature)
    config = ms.hashing.Config().use_file_serialization(hashing_algorithm=HASH)
    return config.set_ignored_paths(paths=[] if inner is None else [inner], ignore_git_paths=False)


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def sigstore_error(what: str, exc: BaseException) -> SignatureError:
    return SignatureError(
        f"{what}: {describe(exc)}",
        hint="Sigstore needs network access to its trust root, Fulcio and Rekor; on an offline "
        "machine sign with --key",
    )
