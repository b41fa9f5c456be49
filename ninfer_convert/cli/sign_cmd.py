"""``ninfer sign ARTIFACT --key PRIVATE_KEY.pem [--signature PATH] [--force] [--json]``.

A thin layer over :func:`ninfer_convert.signing.sign_directory` (contract there and in
docs/cli.md "Signing"): key-based signing by default (offline), ``--certificate`` with
``--certificate-chain`` for certificate signing, ``--sigstore`` for keyless Sigstore signing
(needs the network).  Exit codes: 0; 2 for a usage error (a single file instead of a model
directory, a missing or malformed key, a missing ``[sign]`` extra); 7 when the machine refuses
a read or write; 8 when a signature cannot be made.
"""

from __future__ import annotations

import json

import click
from rich.markup import escape

from ..errors import UsageError
from ..signing import SIGNATURE_NAME, key_signer, sign_directory, sigstore_signer
from .render import json_option, make_console

__all__ = ["command"]


@click.command("sign")
@click.argument("artifact", type=click.Path(path_type=str))
@click.option("--key", "key", default=None, metavar="PRIVATE_KEY.pem",
              help="Elliptic-curve private key (PEM, unencrypted; P-256, P-384 or P-521). "
              "Offline.")  # fmt: skip
@click.option("--signature", default=None, metavar="PATH",
              help=f"Where to write the signature. Default: ARTIFACT/{SIGNATURE_NAME} "
              "(excluded from what it signs).")  # fmt: skip
@click.option("--certificate", default=None, metavar="CERT.pem",
              help="Sign with this certificate for --key (the bundle carries the chain "
              "instead of a key hint).")  # fmt: skip
@click.option("--certificate-chain", "chain", multiple=True, metavar="PEM",
              help="CA certificates to embed with --certificate: at least its issuer "
              "(repeatable).")  # fmt: skip
@click.option("--sigstore", is_flag=True,
              help="Keyless Sigstore signing instead of --key (needs the network).")  # fmt: skip
@click.option("--identity-token", default=None, metavar="TOKEN",
              help="OIDC identity token for --sigstore (else ambient credentials, else an "
              "interactive login).")  # fmt: skip
@click.option("--sigstore-staging", is_flag=True,
              help="Use Sigstore's staging instance (testing only).")  # fmt: skip
@click.option("--force", is_flag=True, help="Replace an existing signature.")
@json_option("Print the result as JSON on stdout.")
def command(
    artifact: str,
    key: str | None,
    signature: str | None,
    certificate: str | None,
    chain: tuple[str, ...],
    sigstore: bool,
    identity_token: str | None,
    sigstore_staging: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Sign every file of the model directory ARTIFACT (shards, index, side files).

    Verify with 'ninfer verify ARTIFACT --public-key PUBLIC_KEY.pem'.
    """
    if (key is None) == (not sigstore):
        raise UsageError("give exactly one of --key PRIVATE_KEY.pem and --sigstore")
    if sigstore and (certificate or chain):
        raise UsageError("--certificate and --certificate-chain go with --key, not --sigstore")
    if not sigstore and (identity_token or sigstore_staging):
        raise UsageError("--identity-token and --sigstore-staging go with --sigstore")
    if key is not None:
        signer = key_signer(key, certificate=certificate, certificate_chain=chain)
    else:
        signer = sigstore_signer(identity_token=identity_token, use_staging=sigstore_staging)
    status = sign_directory(artifact, signer, signature=signature, overwrite=force)
    if as_json:
        click.echo(json.dumps(status.to_json(), indent=2))
        return
    console = make_console()
    console.print(
        f"Signed {escape(artifact)}: {status.files} files, {escape(str(status.identity))}; "
        f"signature {escape(status.path)}"
    )
    how = "--public-key PUBLIC_KEY.pem" if status.method == "public-key" else "..."
    if signature is not None:
        how += f" --signature {signature}"
    console.print(f"Next: ninfer verify {escape(artifact)} {how}")
