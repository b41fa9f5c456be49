"""Checking a signature: :func:`verify_directory`.

Contract: the signature is checked with exactly one of a public key, a certificate chain, or a
Sigstore identity and issuer (anything else is a :class:`~ninfer_convert.errors.UsageError`);
then the directory must hold exactly the signed files.  Every failure is a
:class:`~ninfer_convert.errors.SignatureError` with a stable ``kind``: ``signature_missing``,
``signature_mismatch`` (another key, or a signature that does not verify), and
``signed_files_differ``, whose message names each changed, added and removed file (a link or
special file counts as added; so does anything hidden under an excluded path that is not a
regular file).  A read the operating system refuses is a
:class:`~ninfer_convert.errors.ResourceError`.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ResourceError, SignatureError, UsageError
from .bundle import Bundle, SignatureStatus, read_bundle
from .files import inside, model_directory, sha256_hex, signature_path, walk
from .keys import key_fingerprint, load_certificates, load_public_key
from .library import HASH, describe, hashing_config, library, sigstore_error

__all__ = ["verify_directory"]


def verify_directory(
    artifact: str | os.PathLike[str],
    *,
    signature: str | os.PathLike[str] | None = None,
    public_key: str | os.PathLike[str] | None = None,
    certificate_chain: Sequence[str | os.PathLike[str]] = (),
    sigstore_identity: str | None = None,
    sigstore_issuer: str | None = None,
    sigstore_staging: bool = False,
) -> SignatureStatus:
    """Check the signature of the model directory ``artifact`` with exactly one of a public key,
    a certificate chain, or a Sigstore identity and issuer; then check that the directory holds
    exactly the signed files.  Raises :class:`SignatureError` naming each changed, added and
    removed file."""
    modes = [public_key is not None, bool(certificate_chain),
             sigstore_identity is not None or sigstore_issuer is not None]  # fmt: skip
    if sum(modes) != 1:
        raise UsageError(
            "give exactly one way to check the signature: --public-key, --certificate-chain, "
            "or --sigstore-identity with --sigstore-issuer"
        )
    ms = library()
    root = model_directory(artifact)
    sig = signature_path(root, signature)
    config, expected_key = _verifier(
        ms, public_key, certificate_chain, sigstore_identity, sigstore_issuer, sigstore_staging
    )
    if not sig.is_file():
        raise SignatureError(
            "no signature: the file does not exist" if not sig.exists() else "not a file",
            kind="signature_missing",
            path=str(sig),
            hint="sign the directory with 'ninfer sign', or pass --signature PATH",
        )
    bundle = read_bundle(sig)
    inner = inside(root, sig)
    _check_claims(bundle, sig, public_key, expected_key)
    _library_verify(ms, config, root, sig, bundle, inner)
    # The library skips the excluded paths whatever they are: a directory there hides files.
    files, odd = walk(root, [*bundle.ignore_paths, *([] if inner is None else [inner])])
    if odd or any(name not in bundle.resources for name in files):
        raise _tampered(root, sig, bundle, "an excluded signature path is not a regular file")
    return SignatureStatus(
        str(sig), True, True, bundle.method, bundle.identity or _mode_identity(expected_key),
        len(bundle.resources),
    )  # fmt: skip


def _verifier(
    ms: ModuleType,
    public_key: str | os.PathLike[str] | None,
    certificate_chain: Sequence[str | os.PathLike[str]],
    sigstore_identity: str | None,
    sigstore_issuer: str | None,
    sigstore_staging: bool,
) -> tuple[Any, str | None]:
    """The library's verifying config for the one mode given, and the public key's fingerprint
    (``None`` for the other modes)."""
    config = ms.verifying.Config()
    if public_key is not None:
        fingerprint = key_fingerprint(load_public_key(Path(public_key)))
        return config.use_elliptic_key_verifier(public_key=Path(public_key)), fingerprint
    if certificate_chain:
        chain = [Path(c) for c in certificate_chain]
        for c in chain:
            load_certificates(c, "--certificate-chain")
        return config.use_certificate_verifier(certificate_chain=chain), None
    if not sigstore_identity or not sigstore_issuer:
        raise UsageError(
            "--sigstore-identity and --sigstore-issuer go together, neither of them empty"
        )
    try:
        return config.use_sigstore_verifier(
            identity=sigstore_identity, oidc_issuer=sigstore_issuer, use_staging=sigstore_staging
        ), None
    except Exception as exc:
        raise sigstore_error("could not start Sigstore verification", exc) from None


def _check_claims(
    bundle: Bundle, sig: Path, public_key: str | os.PathLike[str] | None, expected_key: str | None
) -> None:
    """What the bundle claims against the key given, before the library runs."""
    if public_key is not None and bundle.method != "public-key":
        raise SignatureError(
            f"this is a {bundle.method} signature, not a public-key one",
            path=str(sig),
            hint="check it with --certificate-chain or --sigstore-identity/--sigstore-issuer",
        )
    if expected_key is not None and bundle.key_hint not in (None, expected_key):
        raise SignatureError(
            f"signed by a different key: the signature names key {bundle.key_hint}, "
            f"--public-key {public_key} is {expected_key}",
            kind="signature_mismatch",
            path=str(sig),
            hint="use the public key of the signer, or treat the directory as untrusted",
        )


def _library_verify(
    ms: ModuleType, config: Any, root: Path, sig: Path, bundle: Bundle, inner: str | None
) -> None:
    """The library's check of the signature and of every listed file's digest."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            config.set_hashing_config(hashing_config(ms, root, sig)).verify(root, sig)
    except OSError as exc:
        raise ResourceError(
            f"cannot read while verifying the signature: {exc.strerror or exc}",
            path=str(exc.filename or root),
        ) from None
    except Exception as exc:  # the library signals every failure with its own exceptions
        mismatch = isinstance(exc, ValueError) and str(exc).startswith("Signature mismatch")
        # The library refuses to hash a link or special file (after checking the signature):
        # that is an added file too.
        if mismatch or walk(root, [] if inner is None else [inner])[1]:
            raise _tampered(root, sig, bundle, str(exc)) from None
        raise SignatureError(
            f"the signature does not verify: {describe(exc)}",
            kind="signature_mismatch",
            path=str(sig),
            hint="the signature was altered, or was made by another signer",
        ) from None


def _mode_identity(fingerprint: str | None) -> str | None:
    return None if fingerprint is None else f"key {fingerprint}"


def _tampered(root: Path, sig: Path, bundle: Bundle, library_message: str) -> SignatureError:
    """The files that differ from the signed list (the signature itself was valid)."""
    inner = inside(root, sig)
    ignored = [*bundle.ignore_paths, *([] if inner is None else [inner])]
    files, odd = walk(root, ignored)
    changed: list[str] = []
    for name, (algorithm, digest) in bundle.resources.items():
        if name in files and (algorithm != HASH or sha256_hex(files[name]) != digest):
            changed.append(name)
    removed = [n for n in bundle.resources if n not in files]
    added = [n for n in files if n not in bundle.resources] + [f"{n} (not a regular file)"
                                                                for n in odd]  # fmt: skip
    parts = [
        f"{what} {', '.join(sorted(names))}"
        for what, names in (("changed", changed), ("added", added), ("removed", removed))
        if names
    ]
    detail = "; ".join(parts) if parts else library_message
    return SignatureError(
        f"the files differ from what was signed: {detail}",
        kind="signed_files_differ",
        path=str(root),
        hint="the directory is not what was signed: restore it from a trusted copy, or "
        "convert and sign again",
    )
