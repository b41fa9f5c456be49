"""Keys and certificates, read with ``cryptography`` (which model-signing depends on).

Contract: a signing key is an unencrypted PEM elliptic-curve private key on P-256, P-384 or
P-521, a verifying key the matching PEM public key; anything else (a missing or unreadable file,
another key type or curve, an encrypted key, a file with no PEM certificate) is a
:class:`~ninfer_convert.errors.UsageError` naming the file and the option.
:func:`key_fingerprint` is the hint the library stores for a key (``sha256:`` of its PEM
SubjectPublicKeyInfo); :func:`certificate_identity` names the signer of a DER certificate and
needs no library (``inspect`` works without the extra).
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = [
    "certificate_identity",
    "key_fingerprint",
    "load_certificates",
    "load_private_key",
    "load_public_key",
]


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


def load_private_key(path: Path) -> Any:
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


def load_public_key(path: Path) -> Any:
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


def certificate_identity(der: bytes) -> str | None:
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


def load_certificates(path: Path, option: str) -> bytes:
    """The DER bytes of the first PEM certificate in ``path`` (a UsageError if there is none)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = _read_small(path, "certificate file", option)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise UsageError(f"not a PEM certificate file: {exc}", path=str(path)) from None
    return certs[0].public_bytes(serialization.Encoding.DER)
