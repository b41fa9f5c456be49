"""Tamper-evident model directories: sign and verify with OpenSSF model signing.

Our digests (xxh3-128) are unkeyed: they detect corruption, not tampering.  A signature made
with the ``model-signing`` library (PyPI, the optional extra ``[sign]``) binds every file of a
model directory to a key.  docs/cli.md "ninfer sign" is the user-facing contract; in short:

* **What is covered.** Every regular file under the model directory, recursively (shards, the
  shard index, every side file, and any other file), hashed with SHA-256 file by file (the
  library's ``files`` serialization).  Only the signature file itself is excluded, when it lies
  inside the directory (``model.sig`` by default; its relative path is recorded in the signed
  statement), and only while it is a regular file: a directory there is walked like any other.
  Nothing else is excluded (``.git`` files are covered too).  Symbolic links and special files
  are refused when signing and reported as tampering when verifying.
* **The signature** is the library's Sigstore bundle (JSON): a DSSE envelope over an in-toto
  statement whose predicate lists every covered file's name and digest.  The statement's subject
  name is the directory's name at signing time (for ``convert --sign-key``, its hidden staging
  directory); it is not checked.
* **Modes.** ``key_signer``: an elliptic-curve private key (PEM, unencrypted; P-256, P-384 or
  P-521), fully offline; with ``certificate`` (and a chain) the bundle carries the certificate
  chain instead of a key hint (offline too).  ``sigstore_signer``: keyless Sigstore signing,
  which needs the network (its trust root, Fulcio and Rekor).
* **Verification** (:func:`verify_directory`) checks the signature with a public key, a
  certificate chain, or a Sigstore identity and issuer, then re-hashes the directory; any
  changed, added or removed file is a :class:`SignatureError` that names each such file.
* :func:`signature_status` reports whether a signature is present and what it claims (method,
  signer identity, files listed) by reading the bundle's JSON alone: it checks nothing and works
  without the library.

Errors: :class:`UsageError` (exit 2) for a bad path, a single file where a model directory is
needed, a missing or unreadable key or certificate file, or a missing ``[sign]`` extra;
:class:`SignatureError` (exit 8) for a missing, malformed or non-matching signature and for a
signature that cannot be made (Sigstore unreachable); :class:`ResourceError` (exit 7) when the
operating system refuses a read or write.

The library is imported only when a signature is made or checked, never at module import; it
never prints (a library warning on stdout is captured and dropped).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import json
import os
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any, Literal

from .container.wire import INDEX_NAME, SINGLE_NAME
from .container.writer import fsync_dir
from .errors import NinferError, ResourceError, SignatureError, UsageError
from .jsonlimits import nesting_problem

__all__ = [
    "EXTRA",
    "SIGNATURE_NAME",
    "SignatureStatus",
    "Signer",
    "key_fingerprint",
    "key_signer",
    "sign_directory",
    "signature_status",
    "sigstore_signer",
    "verify_directory",
]

SIGNATURE_NAME = "model.sig"
"""Default signature file, inside the model directory and excluded from its own manifest."""

EXTRA = "sign"
_INSTALL = f'pip install "ninfer-convert[{EXTRA}]"'

MAX_SIGNATURE_BYTES = 64 << 20
"""A bundle lists one digest per file (about 150 bytes each): real ones are kilobytes."""

_HASH = "sha256"
_CHUNK = 8 << 20

Method = Literal["public-key", "certificate", "sigstore"]


# ---------------------------------------------------------------------------------------------
# the optional library


def _library() -> ModuleType:
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


def _hashing_config(ms: ModuleType, root: Path, signature: Path) -> Any:
    """File-level SHA-256 over everything but the signature file (and nothing git-related)."""
    inner = _inside(root, signature)
    config = ms.hashing.Config().use_file_serialization(hashing_algorithm=_HASH)
    return config.set_ignored_paths(paths=[] if inner is None else [inner], ignore_git_paths=False)


# ---------------------------------------------------------------------------------------------
# keys and certificates (read with cryptography, which model-signing depends on)


def _read_small(path: Path, what: str, option: str) -> bytes:
    if not path.is_file():
        raise UsageError(
            f"{what} not found (or not a regular file)",
            path=str(path),
            hint=f"check the {option} path",
        )
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the {what}: {exc.strerror}", path=str(path)) from None


_CURVES = ("secp256r1", "secp384r1", "secp521r1")


def _check_curve(key: Any, path: Path, what: str) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise UsageError(
            f"the {what} is a {type(public).__name__}, not an elliptic-curve key",
            path=str(path),
            hint="model signing takes EC keys on P-256, P-384 or P-521, e.g. "
            "openssl ecparam -name prime256v1 -genkey -noout -out key.pem",
        )
    if public.curve.name not in _CURVES:
        raise UsageError(
            f"the {what} is on curve {public.curve.name}; model signing takes P-256, P-384 or "
            "P-521",
            path=str(path),
        )


def _load_private_key(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization

    data = _read_small(path, "private key", "--key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise UsageError(
            "the private key is encrypted; signing takes an unencrypted PEM key",
            path=str(path),
            hint="decrypt it on the signing machine: openssl ec -in encrypted.pem -out key.pem",
        ) from None
    except (ValueError, UnicodeError) as exc:
        raise UsageError(f"not a PEM private key: {exc}", path=str(path)) from None
    _check_curve(key, path, "private key")
    return key


def _load_public_key(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization

    data = _read_small(path, "public key", "--public-key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnicodeError) as exc:
        raise UsageError(
            f"not a PEM public key: {exc}",
            path=str(path),
            hint="export it with: openssl ec -in key.pem -pubout -out key.pub",
        ) from None
    _check_curve(key, path, "public key")
    return key


def key_fingerprint(public_key: Any) -> str:
    """``sha256:<hex>`` of the key's PEM SubjectPublicKeyInfo: the hint the library stores."""
    from cryptography.hazmat.primitives import serialization

    pem = public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(pem).hexdigest()


def _certificate_identity(der: bytes) -> str | None:
    """The signer a DER certificate names (subject alternative names, else the subject)."""
    try:
        from cryptography import x509
    except ImportError:  # inspect without the extra
        return None
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    names: list[str] = []
    with contextlib.suppress(x509.ExtensionNotFound, ValueError):
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names += [str(v) for v in san.get_values_for_type(x509.RFC822Name)]
        names += [str(v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
        names += [str(v) for v in san.get_values_for_type(x509.DNSName)]
    try:
        subject = cert.subject.rfc4514_string()
    except ValueError:
        subject = ""
    return ", ".join(names) if names else (subject or None)


# ---------------------------------------------------------------------------------------------
# signers


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
    ms = _library()
    key_path = Path(private_key)
    key = _load_private_key(key_path)
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
    der = _load_certificates(cert_path, "--certificate")
    for c in chain:
        _load_certificates(c, "--certificate-chain")
    try:
        config = ms.signing.Config().use_certificate_signer(
            private_key=key_path, signing_certificate=cert_path, certificate_chain=chain
        )
    except ValueError as exc:  # the certificate is not the key's
        raise UsageError(str(exc), path=str(cert_path)) from None
    return Signer("certificate", _certificate_identity(der) or str(cert_path), config)


def _load_certificates(path: Path, option: str) -> bytes:
    """The DER bytes of the first PEM certificate in ``path`` (a UsageError if there is none)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = _read_small(path, "certificate file", option)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise UsageError(f"not a PEM certificate file: {exc}", path=str(path)) from None
    return certs[0].public_bytes(serialization.Encoding.DER)


def sigstore_signer(
    *,
    identity_token: str | None = None,
    use_staging: bool = False,
    trust_config: str | os.PathLike[str] | None = None,
) -> Signer:
    """Keyless Sigstore signing.  Needs the network: its trust root is refreshed here, so an
    offline machine fails now (SignatureError), before any file is hashed."""
    ms = _library()
    try:
        config = ms.signing.Config().use_sigstore_signer(
            identity_token=identity_token,
            use_ambient_credentials=identity_token is None,
            use_staging=use_staging,
            trust_config=None if trust_config is None else Path(trust_config),
        )
    except Exception as exc:  # the library raises TUF, network and parse errors of its own
        raise _sigstore_error("could not start Sigstore signing", exc) from None
    return Signer("sigstore", "sigstore", config)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _sigstore_error(what: str, exc: BaseException) -> SignatureError:
    return SignatureError(
        f"{what}: {_describe(exc)}",
        hint="Sigstore needs network access to its trust root, Fulcio and Rekor; on an offline "
        "machine sign with --key",
    )


# ---------------------------------------------------------------------------------------------
# paths and the covered files


def _inside(root: Path, path: Path) -> str | None:
    """``path`` relative to ``root`` (POSIX spelling), or None when it is outside."""
    # Links resolved (but the last component: a linked signature is refused), so that
    # LINK/model.sig of a linked model directory is inside the directory the link resolves to.
    try:
        rel = (path.parent.resolve() / path.name).relative_to(root.resolve())
    except ValueError:
        return None
    return PurePosixPath(rel).as_posix()


def _model_directory(artifact: str | os.PathLike[str]) -> Path:
    p = Path(artifact)
    if not p.exists():
        raise UsageError("no such file or directory", path=str(p), hint="check the artifact path")
    if not p.is_dir():
        raise UsageError(
            "a signature covers a whole model directory, and this is a single file",
            path=str(p),
            hint=f"pass the directory that holds it ({p.absolute().parent})",
        )
    if not (p / SINGLE_NAME).exists() and not (p / INDEX_NAME).exists():
        raise UsageError(
            f"not a .ninfer artifact: the directory has no {SINGLE_NAME} or {INDEX_NAME}",
            kind="not_an_artifact",
            path=str(p),
        )
    # The library refuses a linked model directory; what it links to is the directory signed.
    return p.resolve() if p.is_symlink() else p.absolute()


def _signature_path(root: Path, signature: str | os.PathLike[str] | None) -> Path:
    return root / SIGNATURE_NAME if signature is None else Path(signature).absolute()


def _walk(root: Path, ignored: Iterable[str]) -> tuple[dict[str, Path], list[str]]:
    """(regular files by relative name, relative names of links and special files) under
    ``root``, skipping the ``ignored`` relative paths that are regular files (a directory
    there is walked: the signature is a file, and must not hide others)."""
    skip = [PurePosixPath(i) for i in ignored]
    files: dict[str, Path] = {}
    odd: list[str] = []
    stack = [root]
    while stack:
        here = stack.pop()
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            path = Path(entry.path)
            rel = PurePosixPath(path.relative_to(root))
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISREG(mode) and rel in skip:
                continue
            if stat.S_ISDIR(mode):
                stack.append(path)
            elif stat.S_ISREG(mode):
                files[rel.as_posix()] = path
            else:
                odd.append(rel.as_posix())
    return dict(sorted(files.items())), sorted(odd)


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's surrogate escapes of undecodable bytes
        return False
    return True


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# reading a bundle (no library needed)


@dataclass(frozen=True)
class _Bundle:
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


def _read_bundle(path: Path) -> _Bundle:
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
        identity = None if der is None else _certificate_identity(der)
    return _Bundle(method, identity, hint, resources, ignore_paths)


# ---------------------------------------------------------------------------------------------
# status, sign, verify


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
    sig = _signature_path(root.absolute(), signature)
    shown = str(root / SIGNATURE_NAME) if signature is None else str(signature)
    if not sig.is_file():
        odd = "not a regular file" if sig.exists() else None
        return SignatureStatus(shown, present=sig.exists(), checked=False, error=odd)
    try:
        bundle = _read_bundle(sig)
    except NinferError as exc:
        return SignatureStatus(shown, present=True, checked=False, error=exc.message)
    return SignatureStatus(
        shown, True, False, bundle.method, bundle.identity, len(bundle.resources)
    )


def sign_directory(
    artifact: str | os.PathLike[str],
    signer: Signer,
    *,
    signature: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> SignatureStatus:
    """Sign every file of the model directory ``artifact``; write the bundle to ``signature``
    (default ``artifact/model.sig``) through a temporary file renamed into place."""
    ms = _library()
    root = _model_directory(artifact)
    sig = _signature_path(root, signature)
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
            _read_bundle(sig)
        except SignatureError as exc:
            raise UsageError(
                f"exists and is not a signature ({exc.message}): not replaced",
                path=str(sig),
                hint="choose another --signature path",
            ) from None
    inner = _inside(root, sig)
    files, odd = _walk(root, [] if inner is None else [inner])
    if odd:
        raise UsageError(
            "cannot sign links or special files: " + ", ".join(odd),
            path=str(root),
            hint="a signed model directory holds regular files only",
        )
    undecodable = [ascii(n) for n in files if not _is_utf8(n)]
    if undecodable:  # the signed statement is JSON text: every name must be UTF-8
        raise UsageError(
            "cannot sign file names that are not UTF-8: " + ", ".join(undecodable),
            path=str(root),
            hint="rename those files",
        )
    hashing = _hashing_config(ms, root, sig)
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
            raise _sigstore_error("Sigstore signing failed", exc) from None
        raise SignatureError(f"signing failed: {_describe(exc)}", path=str(root)) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    identity = signer.identity
    if signer.method == "sigstore":
        with contextlib.suppress(NinferError):
            identity = _read_bundle(sig).identity or identity
    return SignatureStatus(str(sig), True, True, signer.method, identity, len(files))


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
    ms = _library()
    root = _model_directory(artifact)
    sig = _signature_path(root, signature)
    config = ms.verifying.Config()
    expected_key: str | None = None
    if public_key is not None:
        key = _load_public_key(Path(public_key))
        expected_key = key_fingerprint(key)
        config = config.use_elliptic_key_verifier(public_key=Path(public_key))
    elif certificate_chain:
        chain = [Path(c) for c in certificate_chain]
        for c in chain:
            _load_certificates(c, "--certificate-chain")
        config = config.use_certificate_verifier(certificate_chain=chain)
    else:
        if not sigstore_identity or not sigstore_issuer:
            raise UsageError(
                "--sigstore-identity and --sigstore-issuer go together, neither of them empty"
            )
        try:
            config = config.use_sigstore_verifier(
                identity=sigstore_identity, oidc_issuer=sigstore_issuer,
                use_staging=sigstore_staging,
            )  # fmt: skip
        except Exception as exc:
            raise _sigstore_error("could not start Sigstore verification", exc) from None

    if not sig.is_file():
        raise SignatureError(
            "no signature: the file does not exist" if not sig.exists() else "not a file",
            kind="signature_missing",
            path=str(sig),
            hint="sign the directory with 'ninfer sign', or pass --signature PATH",
        )
    bundle = _read_bundle(sig)
    inner = _inside(root, sig)
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
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            config.set_hashing_config(_hashing_config(ms, root, sig)).verify(root, sig)
    except OSError as exc:
        raise ResourceError(
            f"cannot read while verifying the signature: {exc.strerror or exc}",
            path=str(exc.filename or root),
        ) from None
    except Exception as exc:  # the library signals every failure with its own exceptions
        mismatch = isinstance(exc, ValueError) and str(exc).startswith("Signature mismatch")
        # The library refuses to hash a link or special file (after checking the signature):
        # that is an added file too.
        if mismatch or _walk(root, [] if inner is None else [inner])[1]:
            raise _tampered(root, sig, bundle, str(exc)) from None
        raise SignatureError(
            f"the signature does not verify: {_describe(exc)}",
            kind="signature_mismatch",
            path=str(sig),
            hint="the signature was altered, or was made by another signer",
        ) from None
    # The library skips the excluded paths whatever they are: a directory there hides files.
    files, odd = _walk(root, [*bundle.ignore_paths, *([] if inner is None else [inner])])
    if odd or any(name not in bundle.resources for name in files):
        raise _tampered(root, sig, bundle, "an excluded signature path is not a regular file")
    return SignatureStatus(
        str(sig), True, True, bundle.method, bundle.identity or _mode_identity(expected_key),
        len(bundle.resources),
    )  # fmt: skip


def _mode_identity(fingerprint: str | None) -> str | None:
    return None if fingerprint is None else f"key {fingerprint}"


def _tampered(root: Path, sig: Path, bundle: _Bundle, library_message: str) -> SignatureError:
    """The files that differ from the signed list (the signature itself was valid)."""
    inner = _inside(root, sig)
    ignored = [*bundle.ignore_paths, *([] if inner is None else [inner])]
    files, odd = _walk(root, ignored)
    changed: list[str] = []
    for name, (algorithm, digest) in bundle.resources.items():
        if name in files and (algorithm != _HASH or _sha256(files[name]) != digest):
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
