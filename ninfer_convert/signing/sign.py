"""Making a signature: signers (a key, a certificate, or keyless Sigstore) and
:func:`sign_directory`.

Contract: a :class:`Signer` is made before any work is done, so a bad key, certificate or an
unreachable Sigstore fails first (``key_signer`` is fully offline; ``sigstore_signer`` refreshes
its trust root over the network).  :func:`sign_directory` signs every regular file of the model
directory (links and special files, and file names that are not UTF-8, are refused), writes the
bundle through a temporary file beside it that is fsynced and renamed into place, and replaces an
existing signature only with ``overwrite`` and only when that file is a signature.  It holds the
directory's output lock (:class:`~ninfer_convert.container.lock.OutputLock`, the one ``ninfer
convert`` holds while it writes that output) from before the first file is hashed until the
bundle is in place, so a signature never covers a mix of two conversions, and a convert to the
directory meanwhile fails as locked; without write access to the directory's parent (where the
lock file lives) it signs unlocked, since no run of this user could replace the directory then.
The library never prints: its stdout is captured and dropped.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..container.lock import OutputLock
from ..container.writer import fsync_dir
from ..errors import NinferError, ResourceError, SignatureError, UsageError
from .bundle import Method, SignatureStatus, read_bundle
from .files import inside, is_utf8, model_directory, signature_path, walk
from .keys import certificate_identity, key_fingerprint, load_certificates, load_private_key
from .library import describe, hashing_config, library, sigstore_error

__all__ = ["Signer", "key_signer", "sign_directory", "sigstore_signer"]


@dataclass(frozen=True)
class Signer:
    """A loaded signing configuration: its key or token was checked when it was made."""

    method: Method
    identity: str
    """Who signs: ``key sha256:...``, a certificate's subject, or ``sigstore`` (the OIDC
    identity is known only once the token is exchanged)."""
    config: Any
    """The library's ``model_signing.signing.Config``."""


def key_signer(
    private_key: str | os.PathLike[str],
    *,
    certificate: str | os.PathLike[str] | None = None,
    certificate_chain: Sequence[str | os.PathLike[str]] = (),
) -> Signer:
    """Load an EC private key (and optionally its signing certificate and chain) now, so a bad
    key fails before any work is done."""
    ms = library()
    key_path = Path(private_key)
    key = load_private_key(key_path)
    if certificate is None:
        if certificate_chain:
            raise UsageError("--certificate-chain needs --certificate (the signing certificate)")
        config = ms.signing.Config().use_elliptic_key_signer(private_key=key_path)
        return Signer("public-key", "key " + key_fingerprint(key.public_key()), config)
    cert_path = Path(certificate)
    chain = [Path(c) for c in certificate_chain]
    if not chain:  # the library reads at least one chain certificate
        raise UsageError(
            "--certificate needs --certificate-chain: the issuing CA certificate(s) to embed"
        )
    der = load_certificates(cert_path, "--certificate")
    for c in chain:
        load_certificates(c, "--certificate-chain")
    try:
        config = ms.signing.Config().use_certificate_signer(
            private_key=key_path, signing_certificate=cert_path, certificate_chain=chain
        )
    except ValueError as exc:  # the certificate is not the key's
        raise UsageError(str(exc), path=str(cert_path)) from None
    return Signer("certificate", certificate_identity(der) or str(cert_path), config)


def sigstore_signer(
    *,
    identity_token: str | None = None,
    use_staging: bool = False,
    trust_config: str | os.PathLike[str] | None = None,
) -> Signer:
    """Keyless Sigstore signing.  Needs the network: its trust root is refreshed here, so an
    offline machine fails now (SignatureError), before any file is hashed."""
    ms = library()
    try:
        config = ms.signing.Config().use_sigstore_signer(
            identity_token=identity_token,
            use_ambient_credentials=identity_token is None,
            use_staging=use_staging,
            trust_config=None if trust_config is None else Path(trust_config),
        )
    except Exception as exc:  # the library raises TUF, network and parse errors of its own
        raise sigstore_error("could not start Sigstore signing", exc) from None
    return Signer("sigstore", "sigstore", config)


def sign_directory(
    artifact: str | os.PathLike[str],
    signer: Signer,
    *,
    signature: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    lock: bool = True,
) -> SignatureStatus:
    """Sign every file of the model directory ``artifact``; write the bundle to ``signature``
    (default ``artifact/model.sig``) through a temporary file renamed into place.  ``lock=False``
    is for a caller that already owns the directory (convert signing its staging folder)."""
    ms = library()
    root = model_directory(artifact)
    if not lock or not os.access(root.parent, os.W_OK):
        return _sign_unlocked(ms, root, signer, signature, overwrite)
    held = OutputLock(root, "sign")
    held.acquire()
    try:
        return _sign_unlocked(ms, root, signer, signature, overwrite)
    finally:
        held.release()


def _sign_unlocked(
    ms: Any,
    root: Path,
    signer: Signer,
    signature: str | os.PathLike[str] | None,
    overwrite: bool,
) -> SignatureStatus:
    sig = signature_path(root, signature)
    if sig.is_dir() or sig.is_symlink():
        raise UsageError("the signature path is a directory or a link", path=str(sig))
    if not sig.parent.is_dir():
        raise UsageError("the signature's directory does not exist", path=str(sig.parent))
    if sig.exists():
        if not overwrite:
            raise UsageError(
                "a signature already exists", path=str(sig), hint="pass --force to replace it"
            )
        try:  # --force replaces a signature, never a file the tool did not make
            read_bundle(sig)
        except SignatureError as exc:
            raise UsageError(
                f"exists and is not a signature ({exc.message}): not replaced",
                path=str(sig),
                hint="choose another --signature path",
            ) from None
    inner = inside(root, sig)
    files, odd = walk(root, [] if inner is None else [inner])
    if odd:
        raise UsageError(
            "cannot sign links or special files: " + ", ".join(odd),
            path=str(root),
            hint="a signed model directory holds regular files only",
        )
    undecodable = [ascii(n) for n in files if not is_utf8(n)]
    if undecodable:  # the signed statement is JSON text: every name must be UTF-8
        raise UsageError(
            "cannot sign file names that are not UTF-8: " + ", ".join(undecodable),
            path=str(root),
            hint="rename those files",
        )
    hashing = hashing_config(ms, root, sig)
    tmp = sig.parent / f".{sig.name}.ninfer-tmp-{secrets.token_hex(6)}"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            signer.config.set_hashing_config(hashing).sign(root, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, sig)
        fsync_dir(sig.parent)
    except NinferError:
        raise
    except OSError as exc:
        raise ResourceError(
            f"signing failed: {exc.strerror or exc}", path=str(exc.filename or root)
        ) from None
    except Exception as exc:  # the library's own errors (Sigstore: network, token)
        if signer.method == "sigstore":
            raise sigstore_error("Sigstore signing failed", exc) from None
        raise SignatureError(f"signing failed: {describe(exc)}", path=str(root)) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    identity = signer.identity
    if signer.method == "sigstore":
        with contextlib.suppress(NinferError):
            identity = read_bundle(sig).identity or identity
    return SignatureStatus(str(sig), True, True, signer.method, identity, len(files))
