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

Modules: :mod:`.library` (the optional library, the hashing every signature uses),
:mod:`.files` (the model directory and its covered files), :mod:`.keys` (keys and
certificates), :mod:`.bundle` (the signature file read without the library, and
:class:`SignatureStatus`), :mod:`.sign` (signers and :func:`sign_directory`) and
:mod:`.verify` (:func:`verify_directory`).
"""

from __future__ import annotations

from .bundle import MAX_SIGNATURE_BYTES, Method, SignatureStatus, signature_status
from .files import SIGNATURE_NAME
from .keys import key_fingerprint
from .library import EXTRA
from .sign import Signer, key_signer, sign_directory, sigstore_signer
from .verify import verify_directory

__all__ = [
    "EXTRA",
    "MAX_SIGNATURE_BYTES",
    "SIGNATURE_NAME",
    "Method",
    "SignatureStatus",
    "Signer",
    "key_fingerprint",
    "key_signer",
    "sign_directory",
    "signature_status",
    "sigstore_signer",
    "verify_directory",
]
