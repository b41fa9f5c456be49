"""The signature file (a Sigstore bundle, JSON), read without the library.

Contract: :func:`read_bundle` parses and shape-checks a signature file and returns what it
claims (method, signer identity, key hint, the listed files with their digests, the excluded
paths), unverified; a file over :data:`MAX_SIGNATURE_BYTES`, not UTF-8, nested too deeply
(:func:`~ninfer_convert.jsonlimits.nesting_problem`) or not shaped like a bundle is a
:class:`~ninfer_convert.errors.SignatureError` ("not a model signature"), an unreadable one a
:class:`~ninfer_convert.errors.ResourceError`.  :func:`signature_status` reports those claims as
a :class:`SignatureStatus` (``checked`` False), which is also what signing and verifying return
(``checked`` True).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import NinferError, ResourceError, SignatureError
from ..jsonlimits import nesting_problem
from .files import SIGNATURE_NAME, signature_path
from .keys import certificate_identity

__all__ = [
    "MAX_SIGNATURE_BYTES",
    "Bundle",
    "Method",
    "SignatureStatus",
    "read_bundle",
    "signature_status",
]

MAX_SIGNATURE_BYTES = 64 << 20
"""A bundle lists one digest per file (about 150 bytes each): real ones are kilobytes."""


Method = Literal["public-key", "certificate", "sigstore"]


@dataclass(frozen=True)
class Bundle:
    """What a signature file claims (unverified)."""

    method: Method
    identity: str | None
    key_hint: str | None
    resources: dict[str, tuple[str, str]]
    """name -> (algorithm, hex digest), as the signed statement lists them (unverified here)."""
    ignore_paths: tuple[str, ...]


def _not_a_signature(path: Path, why: str) -> SignatureError:
    return SignatureError(
        f"not a model signature ({why})",
        path=str(path),
        hint="expected the Sigstore bundle JSON written by 'ninfer sign'; sign the directory again",
    )


def _json(text: str, path: Path, what: str) -> Any:
    deep = nesting_problem(text)
    if deep is not None:
        raise _not_a_signature(path, f"{what} nests too deeply at character {deep}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _not_a_signature(path, f"{what} is not JSON: {exc}") from None


def read_bundle(path: Path) -> Bundle:
    """Parse and shape-check a signature file; SignatureError when it is not a bundle."""
    try:
        size = path.stat().st_size
        if size > MAX_SIGNATURE_BYTES:
            raise _not_a_signature(path, f"{size} bytes, over the {MAX_SIGNATURE_BYTES}-byte cap")
        raw = path.read_bytes()
    except OSError as exc:
        raise ResourceError(f"cannot read the signature: {exc.strerror}", path=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_a_signature(path, "not UTF-8 text") from None
    bundle = _json(text, path, "the file")
    if not isinstance(bundle, dict):
        raise _not_a_signature(path, "not a JSON object")
    material = bundle.get("verificationMaterial")
    envelope = bundle.get("dsseEnvelope")
    if not isinstance(material, dict) or not isinstance(envelope, dict):
        raise _not_a_signature(path, "no verificationMaterial and dsseEnvelope")
    payload = envelope.get("payload")
    signatures = envelope.get("signatures")
    if not isinstance(payload, str) or not isinstance(signatures, list) or not signatures:
        raise _not_a_signature(path, "the DSSE envelope has no payload or no signature")
    try:
        statement_text = base64.b64decode(payload, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise _not_a_signature(path, "the DSSE payload is not base64 of UTF-8 text") from None
    statement = _json(statement_text, path, "the signed statement")
    predicate = statement.get("predicate") if isinstance(statement, dict) else None
    listed = predicate.get("resources") if isinstance(predicate, dict) else None
    if not isinstance(listed, list):
        raise _not_a_signature(path, "the signed statement lists no model files")
    resources: dict[str, tuple[str, str]] = {}
    for r in listed:
        if not (
            isinstance(r, dict)
            and isinstance(r.get("name"), str)
            and isinstance(r.get("algorithm"), str)
            and isinstance(r.get("digest"), str)
        ):
            raise _not_a_signature(path, "a listed file has no name, algorithm or digest")
        resources[r["name"]] = (r["algorithm"], r["digest"])
    assert isinstance(predicate, dict)
    serialization = predicate.get("serialization")
    ignore = serialization.get("ignore_paths", []) if isinstance(serialization, dict) else []
    ignore_paths = tuple(str(i) for i in ignore) if isinstance(ignore, list) else ()

    hint = None
    identity: str | None
    if isinstance(material.get("publicKey"), dict):
        method: Method = "public-key"
        value = material["publicKey"].get("hint")
        hint = f"sha256:{value}" if isinstance(value, str) and value else None
        identity = None if hint is None else f"key {hint}"
    else:
        chain = material.get("x509CertificateChain")
        certs = chain.get("certificates") if isinstance(chain, dict) else None
        if isinstance(certs, list) and certs and isinstance(certs[0], dict):
            method, leaf = "certificate", certs[0].get("rawBytes")
        elif isinstance(material.get("certificate"), dict):
            method, leaf = "sigstore", material["certificate"].get("rawBytes")
        else:
            raise _not_a_signature(path, "no public key hint and no certificate")
        der = None
        if isinstance(leaf, str):
            with contextlib.suppress(binascii.Error):
                der = base64.b64decode(leaf, validate=True)
        identity = None if der is None else certificate_identity(der)
    return Bundle(method, identity, hint, resources, ignore_paths)


@dataclass(frozen=True)
class SignatureStatus:
    """Whether a model directory carries a signature, what it claims, and whether it was checked.

    ``checked`` is True only after :func:`verify_directory` succeeded; otherwise ``method``,
    ``identity`` and ``files`` are what the signature file claims, unverified.
    """

    path: str
    present: bool
    checked: bool
    method: Method | None = None
    identity: str | None = None
    files: int | None = None
    error: str | None = None
    """Why a present file could not be read as a signature (only when not checked)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "present": self.present,
            "checked": self.checked,
            "method": self.method,
            "identity": self.identity,
            "files": self.files,
            "error": self.error,
        }

    def describe(self) -> str:
        """One line for the CLI."""
        if not self.present:
            return f"none ({self.path} does not exist)"
        claim = ", ".join(
            x
            for x in (
                self.method,
                self.identity,
                None if self.files is None else f"{self.files} files",
            )
            if x
        )
        if self.checked:
            return f"VALID: {claim} ({self.path})"
        if self.error is not None:
            return f"present but unreadable: {self.error} ({self.path})"
        return (
            f"present, NOT checked: {claim} ({self.path}); check it with "
            "'ninfer verify --public-key KEY.pem'"
        )


def signature_status(
    artifact: str | os.PathLike[str], *, signature: str | os.PathLike[str] | None = None
) -> SignatureStatus:
    """What the signature of ``artifact``'s model directory (the directory holding it, when it
    is a file) claims, without checking it and without the library."""
    p = Path(artifact)
    root = p if p.is_dir() else p.parent
    sig = signature_path(root.absolute(), signature)
    shown = str(root / SIGNATURE_NAME) if signature is None else str(signature)
    if not sig.is_file():
        odd = "not a regular file" if sig.exists() else None
        return SignatureStatus(shown, present=sig.exists(), checked=False, error=odd)
    try:
        bundle = read_bundle(sig)
    except NinferError as exc:
        return SignatureStatus(shown, present=True, checked=False, error=exc.message)
    return SignatureStatus(
        shown, True, False, bundle.method, bundle.identity, len(bundle.resources)
    )
