"""Signed model directories (``ninfer sign``, ``verify --public-key``, ``convert --sign-key``,
``inspect``): every changed, added or removed file, and every wrong key or broken signature,
exits 8 and names what changed; bad keys and paths are usage errors (exit 2); without the
``[sign]`` extra the commands say which extra to install.

Keys are throwaway EC keys made here with cryptography (a dependency of model-signing).
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from verify_fixtures import EXAMPLE, RECIPE, ROOT, flip_byte, patch_bytes, plane_offset

pytest.importorskip("model_signing", reason="needs the [sign] extra (model-signing)")

from cryptography import x509  # after the skip: it comes with model-signing
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ninfer_convert.cli import main
from ninfer_convert.container.lock import LOCK_SUFFIX, OutputLock
from ninfer_convert.container.wire import INDEX_NAME
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import SignatureError
from ninfer_convert.signing import SIGNATURE_NAME

SIG_EXIT = SignatureError.exit_code
assert SIG_EXIT == 8


def ninfer(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _pem_private(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_public(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _key_pair(where: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = where / f"{name}.pem", where / f"{name}.pub"
    priv.write_bytes(_pem_private(key))
    pub.write_bytes(_pem_public(key))
    return priv, pub


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    where = tmp_path_factory.mktemp("keys")
    return {name: _key_pair(where, name) for name in ("a", "b")}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The committed example converted twice: one file, and sharded (with an index)."""
    work = tmp_path_factory.mktemp("signing")
    single = work / "single"
    sharded = work / "sharded"
    convert_checkpoint(EXAMPLE, RECIPE, single, device="cpu")
    convert_checkpoint(EXAMPLE, RECIPE, sharded, device="cpu", max_shard_size=300_000)
    assert (sharded / INDEX_NAME).is_file()
    return {"single": single, "sharded": sharded}


@pytest.fixture(scope="module")
def signed(
    built: dict[str, Path], keys: dict[str, tuple[Path, Path]], tmp_path_factory
) -> Path:
    """The sharded example, signed with key a (by the CLI: checked in the first test)."""
    art = tmp_path_factory.mktemp("signed") / "art"
    shutil.copytree(built["sharded"], art)
    assert main(["sign", str(art), "--key", str(keys["a"][0])]) == 0
    return art


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "art"))


# ---------------------------------------------------------------------------------------------
# the two-command flow


def test_sign_then_verify_the_example_passes(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys, tmp_path: Path
) -> None:
    art = _copy(built["single"], tmp_path)
    count = len(list(art.iterdir()))  # model.ninfer, config.json, generation_config.json, ...
    code, out, err = ninfer(capsys, "sign", art, "--key", keys["a"][0])
    assert code == 0, err
    assert (art / SIGNATURE_NAME).is_file()
    assert f": {count} files" in out
    code, out, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q")
    assert code == 0, err
    assert "Signature VALID" in out and "PASS" in out


def test_signature_covers_every_file_but_itself(signed: Path) -> None:
    bundle = json.loads((signed / SIGNATURE_NAME).read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    names = sorted(r["name"] for r in statement["predicate"]["resources"])
    assert names == sorted(p.name for p in signed.iterdir() if p.name != SIGNATURE_NAME)
    assert INDEX_NAME in names and "config.json" in names
    assert statement["predicate"]["serialization"]["ignore_paths"] == [SIGNATURE_NAME]


def test_verify_json_reports_a_checked_signature(
    capsys: pytest.CaptureFixture[str], signed: Path, keys
) -> None:
    code, out, err = ninfer(
        capsys, "verify", signed, "--public-key", keys["a"][1], "--no-source", "--json"
    )
    assert code == 0, err
    sig = json.loads(out)["signature"]
    assert sig["present"] is True and sig["checked"] is True
    assert sig["method"] == "public-key" and sig["identity"].startswith("key sha256:")
    assert sig["files"] == len(list(signed.iterdir())) - 1


# ---------------------------------------------------------------------------------------------
# tampering: each fails with exit 8 and names what changed


def _flip_middle(path: Path) -> None:
    flip_byte(path, path.stat().st_size // 2)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: _flip_middle(d / "model-00002-of-00004.ninfer"),
         "changed model-00002-of-00004.ninfer"),
        (lambda d: _flip_middle(d / INDEX_NAME), f"changed {INDEX_NAME}"),
        (lambda d: _flip_middle(d / "config.json"), "changed config.json"),
        (lambda d: (d / "extra.bin").write_bytes(b"\0"), "added extra.bin"),
        (lambda d: (d / "sub").mkdir() or (d / "sub" / "x.json").write_text("{}"),
         "added sub/x.json"),
        (lambda d: (d / "generation_config.json").unlink(), "removed generation_config.json"),
        (lambda d: (d / "model-00004-of-00004.ninfer").unlink(),
         "removed model-00004-of-00004.ninfer"),
        (lambda d: (d / "link").symlink_to(d / "config.json"),
         "added link (not a regular file)"),
    ],
    ids=["shard-byte", "index-byte", "side-file-byte", "added-file", "added-nested-file",
         "removed-side-file", "removed-shard", "added-symlink"],
)  # fmt: skip
def test_tampered_directory_fails_naming_the_file(
    capsys: pytest.CaptureFixture[str], signed: Path, keys, tmp_path: Path, edit, expected: str
) -> None:
    art = _copy(signed, tmp_path)
    edit(art)
    code, out, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q", "--json")
    assert code == SIG_EXIT, err
    assert expected in err
    # The signature is checked before anything else: the error object is all there is.
    assert json.loads(out)["error"]["kind"] == "signed_files_differ"


def test_tampering_with_recomputed_digests_passes_digests_but_not_the_signature(
    capsys: pytest.CaptureFixture[str], signed: Path, keys, tmp_path: Path
) -> None:
    """The issue's threat: a legal code changed and every xxh3 digest recomputed."""
    art = _copy(signed, tmp_path)
    shard, offset, _ = plane_offset(art, "lm_head.weight", "codes")

    def edit(path: Path, data: bytearray) -> None:
        if path == shard:
            data[offset] ^= 0x01 if data[offset] ^ 0x01 != 0x80 else 0x02  # never -128

    patch_bytes(art, edit)
    code, _, err = ninfer(capsys, "verify", art, "--no-source", "-q")
    assert code == 0, err  # unkeyed digests cannot tell
    code, _, err = ninfer(capsys, "verify", art, "--no-source", "--public-key", keys["a"][1])
    assert code == SIG_EXIT
    assert f"changed {shard.name}, {INDEX_NAME}" in err  # the index records shard digests


def test_signature_from_another_key_fails(
    capsys: pytest.CaptureFixture[str], signed: Path, keys, tmp_path: Path
) -> None:
    art = _copy(signed, tmp_path)
    assert main(["sign", str(art), "--key", str(keys["b"][0]), "--force"]) == 0
    capsys.readouterr()
    code, out, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q", "--json")
    assert code == SIG_EXIT
    assert json.loads(out)["error"]["kind"] == "signature_mismatch"
    assert "signed by a different key" in err and SIGNATURE_NAME in err


def test_rewritten_manifest_without_the_key_fails(
    capsys: pytest.CaptureFixture[str], signed: Path, keys, tmp_path: Path
) -> None:
    """An attacker edits config.json and the digest the statement lists for it, keeping the
    key hint: the DSSE signature no longer matches."""
    art = _copy(signed, tmp_path)
    (art / "config.json").write_text("{}")
    bundle = json.loads((art / SIGNATURE_NAME).read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    import hashlib

    for r in statement["predicate"]["resources"]:
        if r["name"] == "config.json":
            r["digest"] = hashlib.sha256(b"{}").hexdigest()
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (art / SIGNATURE_NAME).write_text(json.dumps(bundle))
    code, out, _ = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q", "--json")
    assert code == SIG_EXIT
    assert json.loads(out)["error"]["kind"] == "signature_mismatch"


# ---------------------------------------------------------------------------------------------
# bad input


def test_missing_and_malformed_keys_are_usage_errors(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], signed: Path, tmp_path: Path
) -> None:
    art = _copy(built["single"], tmp_path)
    missing = tmp_path / "nope.pem"
    code, _, err = ninfer(capsys, "sign", art, "--key", missing)
    assert code == 2 and str(missing) in err and "not found" in err
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    code, _, err = ninfer(capsys, "sign", art, "--key", garbage)
    assert code == 2 and "not a PEM private key" in err and str(garbage) in err
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(_pem_private(rsa.generate_private_key(65537, 1024)))
    code, _, err = ninfer(capsys, "sign", art, "--key", rsa_key)
    assert code == 2 and "not an elliptic-curve key" in err
    code, _, err = ninfer(capsys, "verify", signed, "--public-key", garbage)
    assert code == 2 and "not a PEM public key" in err
    assert not (art / SIGNATURE_NAME).exists()


def test_encrypted_and_wrong_curve_keys_are_usage_errors(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], tmp_path: Path
) -> None:
    encrypted = tmp_path / "enc.pem"
    encrypted.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    code, _, err = ninfer(capsys, "sign", built["single"], "--key", encrypted)
    assert code == 2 and "encrypted" in err
    k1 = tmp_path / "k1.pem"
    k1.write_bytes(_pem_private(ec.generate_private_key(ec.SECP256K1())))
    code, _, err = ninfer(capsys, "sign", built["single"], "--key", k1)
    assert code == 2 and "secp256k1" in err
    assert not (built["single"] / SIGNATURE_NAME).exists()


@pytest.mark.parametrize(
    "content",
    [b"\x00\xffnot text", b"not json", b"{}", b"[1, 2]", b"[" * 100_000,
     json.dumps({"verificationMaterial": {"publicKey": {"hint": "00"}},
                 "dsseEnvelope": {"payload": "!!!", "signatures": [{"sig": ""}]}}).encode()],
    ids=["binary", "text", "empty-object", "array", "deeply-nested", "bad-payload"],
)  # fmt: skip
def test_a_signature_file_that_is_not_one_fails(
    capsys: pytest.CaptureFixture[str], signed: Path, keys, tmp_path: Path, content: bytes
) -> None:
    art = _copy(signed, tmp_path)
    (art / SIGNATURE_NAME).write_bytes(content)
    code, _, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q")
    assert code == SIG_EXIT
    assert "not a model signature" in err and SIGNATURE_NAME in err
    code, out, err = ninfer(capsys, "inspect", art, "--json")  # inspect only reports it
    assert code == 0, err
    sig = json.loads(out)["signature"]
    assert sig["present"] is True and sig["checked"] is False and sig["error"]


def test_missing_signature_fails_when_a_key_is_given(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys
) -> None:
    code, out, _ = ninfer(capsys, "verify", built["single"], "--public-key", keys["a"][1], "--json")
    assert code == SIG_EXIT and json.loads(out)["error"]["kind"] == "signature_missing"


def test_a_single_file_is_not_a_model_directory(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys
) -> None:
    file = built["single"] / "model.ninfer"
    code, _, err = ninfer(capsys, "sign", file, "--key", keys["a"][0])
    assert code == 2 and "single file" in err and str(file) in err
    code, _, err = ninfer(capsys, "verify", file, "--public-key", keys["a"][1])
    assert code == 2 and "single file" in err
    assert not (built["single"] / SIGNATURE_NAME).exists()


def test_existing_signature_is_replaced_only_with_force(
    capsys: pytest.CaptureFixture[str], signed: Path, keys, tmp_path: Path
) -> None:
    art = _copy(signed, tmp_path)
    before = (art / SIGNATURE_NAME).read_bytes()
    code, _, err = ninfer(capsys, "sign", art, "--key", keys["b"][0])
    assert code == 2 and "--force" in err
    assert (art / SIGNATURE_NAME).read_bytes() == before
    assert sorted(p.name for p in art.iterdir()) == sorted(p.name for p in signed.iterdir())
    config = (art / "config.json").read_bytes()
    code, _, err = ninfer(capsys, "sign", art, "--key", keys["b"][0], "--force",
                          "--signature", art / "config.json")  # fmt: skip
    assert code == 2 and "is not a signature" in err
    assert (art / "config.json").read_bytes() == config
    assert ninfer(capsys, "sign", art, "--key", keys["b"][0], "--force")[0] == 0
    code, _, err = ninfer(capsys, "verify", art, "--public-key", keys["b"][1], "-q")
    assert code == 0, err


def test_links_are_refused_when_signing(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys, tmp_path: Path
) -> None:
    art = _copy(built["single"], tmp_path)
    (art / "tokenizer.json").symlink_to(tmp_path / "elsewhere.json")
    code, _, err = ninfer(capsys, "sign", art, "--key", keys["a"][0])
    assert code == 2 and "tokenizer.json" in err
    assert not (art / SIGNATURE_NAME).exists()


def test_signature_outside_the_directory(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys, tmp_path: Path
) -> None:
    art = _copy(built["single"], tmp_path)
    sig = tmp_path / "elsewhere.sig"
    assert ninfer(capsys, "sign", art, "--key", keys["a"][0], "--signature", sig)[0] == 0
    assert sig.is_file() and not (art / SIGNATURE_NAME).exists()
    code, _, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q",
                          "--signature", sig)  # fmt: skip
    assert code == 0, err
    (art / SIGNATURE_NAME).write_text("planted")  # not excluded: the signature is elsewhere
    code, _, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q",
                          "--signature", sig)  # fmt: skip
    assert code == SIG_EXIT and f"added {SIGNATURE_NAME}" in err


# ---------------------------------------------------------------------------------------------
# without a key: presence only


def test_verify_without_a_key_reports_presence_not_checked(
    capsys: pytest.CaptureFixture[str], signed: Path, built: dict[str, Path]
) -> None:
    code, out, _ = ninfer(capsys, "verify", signed, "--no-source", "-q")
    assert code == 0
    assert "present, NOT checked" in out
    code, out, _ = ninfer(capsys, "verify", signed, "--no-source", "--json")
    sig = json.loads(out)["signature"]
    assert (sig["present"], sig["checked"], sig["method"]) == (True, False, "public-key")
    code, out, _ = ninfer(capsys, "verify", built["single"], "--no-source", "--json")
    sig = json.loads(out)["signature"]
    assert (sig["present"], sig["checked"], sig["identity"]) == (False, False, None)


def test_inspect_shows_the_signature_and_its_identity(
    capsys: pytest.CaptureFixture[str], signed: Path, built: dict[str, Path]
) -> None:
    code, out, _ = ninfer(capsys, "verify", signed, "--public-key", signed / "none.pub")
    assert code == 2  # (a missing public key is a usage error)
    fingerprint = json.loads((signed / SIGNATURE_NAME).read_text())["verificationMaterial"][
        "publicKey"
    ]["hint"]
    code, out, _ = ninfer(capsys, "inspect", signed)
    assert code == 0
    assert f"Signature  present, NOT checked: public-key, key sha256:{fingerprint}" in out
    code, out, _ = ninfer(capsys, "inspect", signed, "--json")
    assert json.loads(out)["signature"]["identity"] == f"key sha256:{fingerprint}"
    code, out, _ = ninfer(capsys, "inspect", built["single"])
    assert "Signature  none" in out


# ---------------------------------------------------------------------------------------------
# convert --sign-key


def test_convert_sign_key_publishes_a_signed_directory(
    capsys: pytest.CaptureFixture[str], keys, tmp_path: Path
) -> None:
    out_dir = tmp_path / "out"
    code, out, err = ninfer(capsys, "convert", EXAMPLE, "--recipe", RECIPE, "--output", out_dir,
                            "--device", "cpu", "--sign-key", keys["a"][0], "--json")  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert SIGNATURE_NAME in report["files"]
    assert report["signature"]["path"] == str(out_dir / SIGNATURE_NAME)
    code, _, err = ninfer(capsys, "verify", out_dir, "--public-key", keys["a"][1], "-q")
    assert code == 0, err
    assert not list(tmp_path.glob(".*"))  # no staging or temporary file left beside it


def test_convert_with_a_bad_key_fails_before_reading_the_source(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("nonsense")
    code, _, err = ninfer(capsys, "convert", tmp_path / "no-such-source", "--recipe", RECIPE,
                          "--output", tmp_path / "out", "--sign-key", bad)  # fmt: skip
    assert code == 2 and "not a PEM private key" in err  # not the missing source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pem"]


def test_failed_signing_in_convert_leaves_nothing(
    capsys: pytest.CaptureFixture[str], keys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ninfer_convert.convert as convert_module

    seen: list[Path] = []

    def failing(staging: Path, signer: object, lock: bool = True) -> None:
        assert not lock  # convert already holds the output; staging is its own
        seen.append(staging)
        assert (staging / "model.ninfer").is_file()  # complete, but not yet published
        raise SignatureError("signing failed on purpose", path=str(staging))

    monkeypatch.setattr(convert_module, "sign_directory", failing)
    code, _, err = ninfer(capsys, "convert", EXAMPLE, "--recipe", RECIPE, "--output",
                          tmp_path / "out", "--sign-key", keys["a"][0])  # fmt: skip
    assert code == SIG_EXIT and "on purpose" in err
    assert seen and list(tmp_path.iterdir()) == []


def test_convert_does_not_carry_the_source_signature_into_the_artifact(
    capsys: pytest.CaptureFixture[str], keys, tmp_path: Path
) -> None:
    """A signed source's model.sig covers the source's files: in the artifact it would read as
    the artifact's signature, and 'sign --force' would then break the side-file digests."""
    src = Path(shutil.copytree(EXAMPLE, tmp_path / "src"))
    (src / SIGNATURE_NAME).write_text("the source's own signature")
    plain, signed_out = tmp_path / "plain", tmp_path / "signed"
    code, _, err = ninfer(capsys, "convert", src, "--recipe", RECIPE, "--output", plain)
    assert code == 0, err
    assert not (plain / SIGNATURE_NAME).exists()
    code, out, err = ninfer(capsys, "inspect", plain, "--json")
    assert json.loads(out)["signature"]["present"] is False
    assert ninfer(capsys, "sign", plain, "--key", keys["a"][0])[0] == 0
    code, _, err = ninfer(capsys, "verify", plain, "--public-key", keys["a"][1], "-q")
    assert code == 0, err  # the side files recorded in the headers are untouched
    code, _, err = ninfer(capsys, "convert", src, "--recipe", RECIPE, "--output", signed_out,
                          "--sign-key", keys["a"][0])  # fmt: skip
    assert code == 0, err
    code, _, err = ninfer(capsys, "verify", signed_out, "--public-key", keys["a"][1], "-q")
    assert code == 0, err


# ---------------------------------------------------------------------------------------------
# certificate and Sigstore modes


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, issuer_key = issuer if issuer is not None else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=issuer is not None,
                key_cert_sign=issuer is None,
                crl_sign=issuer is None,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    return builder.sign(issuer_key, hashes.SHA256())


def test_certificate_signing_verifies_against_its_ca_only(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], tmp_path: Path
) -> None:
    pems: dict[str, Path] = {}
    for ca in ("ca", "other-ca"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        pems[ca] = tmp_path / f"{ca}.crt"
        pems[ca].write_bytes(_certificate(ca, ca_key).public_bytes(serialization.Encoding.PEM))
        if ca == "ca":
            leaf_key = ec.generate_private_key(ec.SECP256R1())
            leaf = _certificate("model-builder", leaf_key, ("ca", ca_key))
            pems["leaf"] = tmp_path / "leaf.crt"
            pems["leaf"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
            pems["key"] = tmp_path / "leaf.pem"
            pems["key"].write_bytes(_pem_private(leaf_key))
    art = _copy(built["single"], tmp_path)
    code, _, err = ninfer(capsys, "sign", art, "--key", pems["key"], "--certificate", pems["leaf"])
    assert code == 2 and "--certificate-chain" in err
    code, out, err = ninfer(capsys, "sign", art, "--key", pems["key"], "--certificate",
                            pems["leaf"], "--certificate-chain", pems["ca"], "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["identity"] == "CN=model-builder"
    code, _, err = ninfer(capsys, "verify", art, "--certificate-chain", pems["ca"], "-q")
    assert code == 0, err
    code, _, err = ninfer(capsys, "verify", art, "--certificate-chain", pems["other-ca"], "-q")
    assert code == SIG_EXIT and "does not verify" in err
    _flip_middle(art / "model.ninfer")
    code, _, err = ninfer(capsys, "verify", art, "--certificate-chain", pems["ca"], "-q")
    assert code == SIG_EXIT and "changed model.ninfer" in err


def test_sigstore_without_the_network_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
    built: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Offline here, TUF cannot refresh the trust root; online, the token is not a JWT."""
    for var in ("XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var))
    art = _copy(built["single"], tmp_path)
    code, _, err = ninfer(capsys, "sign", art, "--sigstore", "--identity-token", "not-a-jwt")
    assert code == SIG_EXIT
    assert "Sigstore" in err and "--key" in err
    assert not (art / SIGNATURE_NAME).exists()
    assert list(art.parent.glob(".*")) == []  # no temporary signature left
    (art / SIGNATURE_NAME).write_text("{}")
    code, _, err = ninfer(capsys, "verify", art, "--sigstore-identity", "me@example.com",
                          "--sigstore-issuer", "https://issuer.example")  # fmt: skip
    assert code == SIG_EXIT and "Sigstore" in err


def test_writer_hook_sees_the_complete_staging_directory_before_publishing(
    tmp_path: Path,
) -> None:
    import numpy as np

    from ninfer_convert.container import ArtifactWriter
    from ninfer_convert.errors import UsageError
    from ninfer_convert.logical import DirectWords

    meta = {"producer": {"name": "t", "version": "0"}, "recipe": {"name": "r", "text": "",
            "digest": "sha256:" + "0" * 64, "evidence": []}, "source": {"kind": "file",
            "path": "/x", "config": None, "files": [], "tensors": {}}}  # fmt: skip
    seen: list[list[str]] = []
    out = tmp_path / "out"

    def hook(staging: Path) -> None:
        assert not out.exists()
        seen.append(sorted(p.name for p in staging.iterdir()))

    for fail in (False, True):
        w = ArtifactWriter(out, metadata=meta)
        w.add("t", "BF16", DirectWords(np.zeros((2, 2), np.uint16)), role="misc",
              provenance={"sources": [], "conversion": None, "transforms": [],
                          "encoder_profile": None, "rule": {"index": 0, "line": 1,
                          "pattern": "t"}, "constraints": []})  # fmt: skip

        def failing(staging: Path) -> None:
            raise UsageError("refused")

        if fail:
            with pytest.raises(UsageError):
                w.commit(before_publish=failing)
            assert not out.exists() and list(tmp_path.iterdir()) == []
        else:
            assert w.commit(before_publish=hook) == out
            assert seen == [["model.ninfer"]] and (out / "model.ninfer").is_file()
            shutil.rmtree(out)


# ---------------------------------------------------------------------------------------------
# the optional extra


def test_without_the_extra_the_commands_name_it(
    capsys: pytest.CaptureFixture[str],
    signed: Path,
    keys,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "model_signing"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "model_signing", None)  # import now raises ImportError
    for args in (
        ["sign", signed, "--key", keys["a"][0], "--force"],
        ["verify", signed, "--public-key", keys["a"][1]],
        ["convert", EXAMPLE, "--recipe", RECIPE, "--output", tmp_path / "o", "--sign-key",
         keys["a"][0]],
    ):  # fmt: skip
        code, _, err = ninfer(capsys, *args)
        assert code == 2, args
        assert "ninfer-convert[sign]" in err and "model-signing" in err
    assert not (tmp_path / "o").exists()
    code, out, _ = ninfer(capsys, "inspect", signed, "--json")  # presence needs no library
    assert code == 0 and json.loads(out)["signature"]["present"] is True


def test_nothing_imports_model_signing_at_import_time() -> None:
    code = (
        "import sys, ninfer_convert, ninfer_convert.cli, ninfer_convert.signing;"
        "sys.exit(any(m.split('.')[0] == 'model_signing' for m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


def test_a_linked_model_directory_signs_what_it_links_to(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys, tmp_path: Path
) -> None:
    art = _copy(built["single"], tmp_path)
    link = tmp_path / "link"
    link.symlink_to(art, target_is_directory=True)
    count = len(list(art.iterdir()))
    code, _, err = ninfer(capsys, "sign", link, "--key", keys["a"][0])
    assert code == 0, err
    assert (art / SIGNATURE_NAME).is_file()
    code, _, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q")
    assert code == 0, err
    # LINK/model.sig, spelt through the link, is still the excluded signature (also when the
    # previous one is there to be replaced).
    sig = link / SIGNATURE_NAME
    code, out, err = ninfer(capsys, "sign", link, "--key", keys["a"][0], "--signature", sig,
                            "--force")  # fmt: skip
    assert code == 0 and f": {count} files" in out, err
    code, _, err = ninfer(capsys, "verify", link, "--public-key", keys["a"][1], "-q",
                          "--signature", sig)  # fmt: skip
    assert code == 0, err


def test_a_directory_at_the_excluded_signature_path_hides_nothing(
    capsys: pytest.CaptureFixture[str], signed: Path, keys, tmp_path: Path
) -> None:
    """The signed statement excludes model.sig; a directory there must not hide what it holds."""
    art = _copy(signed, tmp_path)
    sig = tmp_path / "moved.sig"
    (art / SIGNATURE_NAME).rename(sig)
    (art / SIGNATURE_NAME).mkdir()
    (art / SIGNATURE_NAME / "payload.ninfer").write_bytes(b"\0" * 16)
    code, out, err = ninfer(capsys, "verify", art, "--public-key", keys["a"][1], "-q",
                            "--signature", sig)  # fmt: skip
    assert code == SIG_EXIT, err
    assert f"added {SIGNATURE_NAME}/payload.ninfer" in err and out == ""


def test_a_file_name_that_is_not_utf8_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys, tmp_path: Path
) -> None:
    art = _copy(built["single"], tmp_path)
    with open(os.fsencode(art) + b"/notes-\xff.txt", "wb") as fh:  # a signed statement is JSON
        fh.write(b"x")
    code, _, err = ninfer(capsys, "sign", art, "--key", keys["a"][0])
    assert code == 2, err
    assert "notes-" in err and "UTF-8" in err
    assert not (art / SIGNATURE_NAME).exists()


def test_empty_sigstore_options_are_not_silently_ignored(
    capsys: pytest.CaptureFixture[str], signed: Path
) -> None:
    """`--sigstore-identity "$ID"` with ID unset must not verify without checking the signature."""
    code, out, err = ninfer(capsys, "verify", signed, "--no-source", "-q",
                            "--sigstore-identity", "", "--sigstore-issuer", "")  # fmt: skip
    assert code == 2, out
    assert "--sigstore-identity" in err and "PASS" not in out


def test_sign_while_a_convert_holds_the_output_fails_locked_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys, tmp_path: Path
) -> None:
    # A signature hashed while a convert replaces the directory would cover a mix of both.
    art = _copy(built["single"], tmp_path)
    before = sorted(p.name for p in art.iterdir())
    held = OutputLock(art)  # what a convert to this output holds while it writes
    held.acquire()
    try:
        code, _, err = ninfer(capsys, "sign", art, "--key", keys["a"][0])
    finally:
        held.release()
    assert code == 7, err
    assert f"being written by another ninfer convert (pid {os.getpid()})" in err
    assert sorted(p.name for p in art.iterdir()) == before
    assert ninfer(capsys, "sign", art, "--key", keys["a"][0])[0] == 0  # released: signs now
    assert not (tmp_path / f".art{LOCK_SUFFIX}").exists()


def test_convert_while_sign_holds_the_output_fails_naming_sign(
    capsys: pytest.CaptureFixture[str], built: dict[str, Path], keys, tmp_path: Path
) -> None:
    art = _copy(built["single"], tmp_path)
    before = {p.name: p.read_bytes() for p in art.iterdir()}
    held = OutputLock(art, "sign")  # what sign_directory holds while it hashes and writes
    held.acquire()
    try:
        code, _, err = ninfer(capsys, "convert", EXAMPLE, "--recipe", RECIPE, "--output", art,
                              "--force", "--device", "cpu")  # fmt: skip
    finally:
        held.release()
    assert code == 7, err
    assert f"being signed by another ninfer sign (pid {os.getpid()})" in err
    assert {p.name: p.read_bytes() for p in art.iterdir()} == before
