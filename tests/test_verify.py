"""verify: passes on fresh artifacts of every format, and catches every corruption of issue 5
with the right check, message and exit code.

Fixtures convert three sources once per module: the committed transformers-made example, the
committed compressed-tensors NVFP4 export, and a synthetic checkpoint whose recipe stores all
nine formats (FP32 via a conversion, I32 from I64, FP8 row copies, a concat and a transpose).
Each corruption test works on its own copy.  How digests are kept valid where a test needs only
a later check to fire is explained in ``verify_fixtures``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from artifact_fixtures import rewrite_header
from verify_fixtures import (
    EXAMPLE,
    EXAMPLE_NVFP4,
    RECIPE,
    RECIPE_NVFP4,
    container_files,
    copy_artifact,
    encode_by_division,
    flip_byte,
    patch_bytes,
    plane_offset,
    rewrite_artifact,
    write_all_formats_source,
)

from ninfer_convert.container import open_artifact
from ninfer_convert.container.wire import INDEX_NAME
from ninfer_convert.convert import convert_checkpoint, plan_conversion
from ninfer_convert.errors import UsageError
from ninfer_convert.formats import FORMATS
from ninfer_convert.logical import FP8RowWords, GroupedCodes, NVFP4Words
from ninfer_convert.verify import CHECK_ORDER, VerifyReport, sample_groups, verify_artifact

ORACLE = 3  # oracle groups per tensor: enough to exercise the path, cheap on two cores


def run(path: Path, **kw: object) -> VerifyReport:
    kw.setdefault("oracle_groups", ORACLE)
    kw.setdefault("device", "cpu")
    return verify_artifact(path, **kw)  # type: ignore[arg-type]


def failed(report: VerifyReport) -> dict[str, list[str]]:
    """check name -> rendered findings, for the checks that failed."""
    return {c.name: [f.render() for f in c.findings] for c in report.checks if c.findings}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("verify")


@pytest.fixture(scope="module")
def synthetic(work: Path) -> tuple[Path, Path, Path]:
    """(source dir, recipe, single-file artifact) storing all nine formats."""
    src, recipe = write_all_formats_source(work / "src")
    out = work / "all-formats"
    convert_checkpoint(src, recipe, out, device="cpu", alignment=64)
    return src, recipe, out


@pytest.fixture(scope="module")
def sharded(work: Path, synthetic: tuple[Path, Path, Path]) -> Path:
    src, recipe, _ = synthetic
    out = work / "sharded"
    convert_checkpoint(src, recipe, out, device="cpu", alignment=64, max_shard_size=2000)
    assert (out / INDEX_NAME).exists() and len(container_files(out)) >= 3
    return out


@pytest.fixture(scope="module")
def examples(work: Path) -> dict[str, Path]:
    out = {}
    for name, src, recipe in (("bf16", EXAMPLE, RECIPE), ("nvfp4", EXAMPLE_NVFP4, RECIPE_NVFP4)):
        out[name] = work / f"example-{name}"
        convert_checkpoint(src, recipe, out[name], device="cpu", alignment=64)
    return out


# ---------------------------------------------------------------------------------------------
# Fresh artifacts pass


def test_fresh_artifacts_of_every_format_pass(
    synthetic: tuple[Path, Path, Path], examples: dict[str, Path]
) -> None:
    seen: set[str] = set()
    for path in (synthetic[2], examples["bf16"], examples["nvfp4"]):
        report = run(path)
        assert report.passed, failed(report)
        assert report.exit_code == 0
        assert [c.name for c in report.checks] == list(CHECK_ORDER)
        assert all(c.status == "pass" for c in report.checks)
        assert report.source.compared and report.source.origin == "recorded"
        # Every stored tensor was re-derived and compared bit for bit.
        assert report.check("source-words").tensors == report.tensors
        with open_artifact(path) as art:
            formats = {i.format for i in art.tensors.values()}
            grouped = [n for n, i in art.tensors.items() if FORMATS[i.format].is_grouped]
        seen |= formats
        assert report.check("oracle-sample").tensors == len(grouped)
        assert {s.tensor for s in report.statistics} >= set(grouped)
        json.dumps(report.to_json(), allow_nan=False)
    assert seen == set(FORMATS)


def test_error_statistics_are_exact_numbers(synthetic: tuple[Path, Path, Path]) -> None:
    report = run(synthetic[2])
    by_name = {s.tensor: s for s in report.statistics}
    s = by_name["emb.weight"]
    assert s.numel == 40 * 96 and not s.exact
    assert 0 < s.rms_error <= s.max_abs_error
    assert s.sqnr_db is not None and 20 < s.sqnr_db < 60  # 6-bit codes: roughly 6 dB per bit
    assert report.worst(1)[0].sqnr_db == min(x.sqnr_db for x in report.statistics if x.sqnr_db)


def test_verify_without_source_skips_source_checks(synthetic: tuple[Path, Path, Path]) -> None:
    report = run(synthetic[2], use_recorded_source=False)
    assert report.passed and report.exit_code == 0
    assert report.check("source-words").status == "skipped"
    assert report.check("oracle-sample").status == "skipped"
    assert not report.statistics


def test_results_do_not_depend_on_jobs(synthetic: tuple[Path, Path, Path]) -> None:
    def stable(r: VerifyReport) -> dict[str, object]:
        d = r.to_json()
        d.pop("totals")
        d.pop("settings")
        return d

    assert stable(run(synthetic[2], jobs=1)) == stable(run(synthetic[2], jobs=2))


def test_oracle_sample_is_deterministic_and_includes_the_last_group() -> None:
    a = sample_groups("t", 50, 3, 8, seed=1)
    assert a == sample_groups("t", 50, 3, 8, seed=1)
    assert a[0] == (49, 2) and len(set(a)) == 8
    assert a != sample_groups("u", 50, 3, 8, seed=1)
    assert sorted(sample_groups("t", 2, 2, 100, seed=1)) == [(0, 0), (0, 1), (1, 0), (1, 1)]


# ---------------------------------------------------------------------------------------------
# Integrity: a flipped byte in each plane kind, in the header


PLANES = [
    ("bias", "words"),  # BF16
    ("norm.weight", "words"),  # FP32
    ("ids", "words"),  # I32
    ("attn.x.weight", "codes"),  # Q4
    ("mlp.up.weight", "lo4"),  # Q5
    ("mlp.up.weight", "hi1"),
    ("emb.weight", "lo4"),  # Q6
    ("emb.weight", "hi2"),
    ("w8.weight", "codes"),  # W8
    ("w8.weight", "scales"),
    ("nv.weight", "codes"),  # NVFP4
    ("nv.weight", "scales"),
    ("nv.weight", "divisor"),
    ("f8.weight", "codes"),  # FP8 row
    ("f8.weight", "scales"),
]


@pytest.mark.parametrize(("tensor", "plane"), PLANES, ids=[f"{t}:{p}" for t, p in PLANES])
def test_flipped_byte_in_each_plane_kind_fails_integrity(
    synthetic: tuple[Path, Path, Path], tmp_path: Path, tensor: str, plane: str
) -> None:
    art = copy_artifact(synthetic[2], tmp_path / "a")
    path, offset, _ = plane_offset(art, tensor, plane)
    flip_byte(path, offset)  # byte 0 of every plane is a logical word, never padding
    report = run(art, use_recorded_source=False)
    assert report.exit_code == 6
    [finding] = report.check("integrity").findings
    assert finding.tensor == tensor and finding.error == "IntegrityError"
    assert finding.kind == "digest_mismatch" and f"plane {plane!r}" in finding.message
    assert report.to_json()["checks"][1]["findings"][0]["kind"] == "digest_mismatch"


def test_flipped_byte_is_also_located_by_the_source_comparison(
    synthetic: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    art = copy_artifact(synthetic[2], tmp_path / "a")
    path, offset, _ = plane_offset(art, "w8.weight", "codes")
    flip_byte(path, offset + 128 + 10, 0x04)
    report = run(art)
    assert report.exit_code == 6
    assert set(failed(report)) >= {"integrity", "source-words"}
    m = report.first_mismatch
    assert m is not None and m.tensor == "w8.weight" and m.plane == "codes"
    # W8 rows are padded to 128 bytes: byte 138 is row 1, column 10 (group 0).
    assert (m.row, m.column, m.group) == (1, 10, 0)
    assert m.found - m.expected in (4, -4) and m.count == 1


def test_header_byte_flips(synthetic: tuple[Path, Path, Path], tmp_path: Path) -> None:
    # A flip that keeps the JSON valid (a digest hex digit): the header digest catches it.
    art = copy_artifact(synthetic[2], tmp_path / "a")
    [path] = container_files(art)
    data = path.read_bytes()
    with open_artifact(art) as a:
        digest = a.tensors["bias"].planes[0].digest
    pos = data.rindex(digest.encode())
    flip_byte(path, pos, data[pos] ^ (ord("0") if digest[0] != "0" else ord("1")))
    report = run(art, use_recorded_source=False)
    assert report.exit_code == 6
    messages = failed(report)["integrity"]
    assert any("header digest mismatch" in m for m in messages)
    assert any("'bias'" in m and "plane 'words' digest mismatch" in m for m in messages)
    # A flip that breaks the JSON: structure fails, nothing else can run.
    art2 = copy_artifact(synthetic[2], tmp_path / "b")
    [path2] = container_files(art2)
    flip_byte(path2, data.rindex(b'"tensors"'), 0x20)
    report2 = run(art2)
    assert report2.exit_code == 6
    assert report2.check("structure").status == "fail"
    assert all(c.status == "skipped" for c in report2.checks[1:])
    # The magic itself: still reported as a damaged artifact, not a usage error.
    art3 = copy_artifact(synthetic[2], tmp_path / "c")
    flip_byte(container_files(art3)[0], 1)
    report3 = run(container_files(art3)[0])
    assert report3.exit_code == 6 and "not a .ninfer container" in failed(report3)["structure"][0]


# ---------------------------------------------------------------------------------------------
# Padding


def test_flipped_padding_byte(synthetic: tuple[Path, Path, Path], tmp_path: Path) -> None:
    # attn.x.weight is Q4 [24, 70]: each 64-byte row holds 35 bytes of codes, then padding.
    art = copy_artifact(synthetic[2], tmp_path / "a")
    path, offset, _ = plane_offset(art, "attn.x.weight", "codes")
    flip_byte(path, offset + 64 * 2 + 40, 0x10)
    report = run(art)
    assert report.exit_code == 6
    f = failed(report)
    assert set(f) == {"integrity", "padding"}  # the words themselves are untouched
    assert "row 2 byte 40" in f["padding"][0] and "'attn.x.weight'" in f["padding"][0]

    # The same flip written by a "consistent" producer (digests recomputed): padding alone.
    art2 = copy_artifact(synthetic[2], tmp_path / "b")
    _, offset2, _ = plane_offset(art2, "attn.x.weight", "codes")

    def edit(p: Path, data: bytearray) -> None:
        data[offset2 + 64 * 2 + 40] ^= 0x10

    patch_bytes(art2, edit)
    report2 = run(art2)
    assert set(failed(report2)) == {"padding"} and report2.exit_code == 6


# ---------------------------------------------------------------------------------------------
# Shards


def test_sharded_artifact_passes(sharded: Path) -> None:
    report = run(sharded, oracle_groups=0)
    assert report.passed, failed(report)


def test_integrity_findings_keep_the_readers_order(sharded: Path, tmp_path: Path) -> None:
    # verify checks plane digests in its workers; the report must still list the findings as
    # Artifact.integrity_problems() does (shard by shard, tensors in stored order).
    art = copy_artifact(sharded, tmp_path / "a")
    with open_artifact(art) as a:
        names = list(a.tensors)
    for name in (names[-1], names[0], names[len(names) // 2]):
        path, offset, _ = plane_offset(art, name, "codes" if "norm" not in name else "words")
        flip_byte(path, offset)
    config = art / "config.json"
    config.write_bytes(config.read_bytes() + b" ")  # a side-file finding: listed last
    with open_artifact(art) as a:
        expected = [str(e) for e in a.integrity_problems()]
    report = run(art, oracle_groups=0)
    found = [f.render() for f in report.check("integrity").findings]
    assert len(found) == 4 and found == expected


def test_truncated_and_missing_shard(sharded: Path, tmp_path: Path) -> None:
    art = copy_artifact(sharded, tmp_path / "t")
    shard = container_files(art)[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    report = run(art)
    assert report.exit_code == 6
    [msg] = failed(report)["structure"]
    assert shard.name in msg and "truncated or replaced shard" in msg

    art2 = copy_artifact(sharded, tmp_path / "m")
    missing = container_files(art2)[2]
    missing.unlink()
    report2 = run(art2)
    assert report2.exit_code == 6
    [msg2] = failed(report2)["structure"]
    assert "is missing" in msg2 and missing.name in msg2


def test_truncated_single_file(synthetic: tuple[Path, Path, Path], tmp_path: Path) -> None:
    art = copy_artifact(synthetic[2], tmp_path / "a")
    [path] = container_files(art)
    path.write_bytes(path.read_bytes()[:-1])
    report = run(art)
    assert report.exit_code == 6 and "truncated" in failed(report)["structure"][0]


# ---------------------------------------------------------------------------------------------
# Swapped tensors


def test_swapped_tensor_payloads_with_valid_digests(
    synthetic: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """pair.a and pair.b (same format and shape) trade their stored words; every digest is
    recomputed, so only the comparison with the source can tell."""
    art = copy_artifact(synthetic[2], tmp_path / "a")
    with open_artifact(art) as a:
        pa, pb = a.tensors["pair.a.weight"].planes, a.tensors["pair.b.weight"].planes

    def edit(p: Path, data: bytearray) -> None:
        for x, y in zip(pa, pb, strict=True):
            ax, by = (
                bytes(data[x.offset : x.offset + x.nbytes]),
                bytes(data[y.offset : y.offset + y.nbytes]),
            )
            data[x.offset : x.offset + x.nbytes] = by
            data[y.offset : y.offset + y.nbytes] = ax

    patch_bytes(art, edit)
    report = run(art)
    f = failed(report)
    assert "source-words" in f and set(f) <= {"source-words", "oracle-sample"}, f
    assert report.exit_code == 6
    assert {x.tensor for x in report.check("source-words").findings} == {
        "pair.a.weight",
        "pair.b.weight",
    }
    assert "differs from its re-derivation from the source" in f["source-words"][0]


def test_swapped_tensor_names_in_the_header(
    synthetic: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    art = copy_artifact(synthetic[2], tmp_path / "a")
    [path] = container_files(art)

    def swap(header: dict[str, object]) -> None:
        tensors = header["tensors"]
        assert isinstance(tensors, list)
        a = next(t for t in tensors if t["name"] == "pair.a.weight")
        b = next(t for t in tensors if t["name"] == "pair.b.weight")
        a["name"], b["name"] = b["name"], a["name"]

    rewrite_header(path, swap)
    report = run(art)
    assert report.exit_code == 6
    msgs = failed(report)["source-words"]
    assert any("made from ['pair.b.weight'], the recipe makes it from ['pair.a.weight']" in m
               for m in msgs)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Value invariants (rewritten with valid digests)

BAD_SCALES = [
    ("attn.x.weight", 0x8000, "not a valid scale"),  # binary16 -0
    ("attn.x.weight", 0x7E00, "not a valid scale"),  # NaN
    ("attn.x.weight", 0x7C00, "not a valid scale"),  # +inf
    ("nv.weight", 0x80, "negative (or -0) E4M3FN block scale"),  # E4M3FN -0
    ("nv.weight", 0x7F, "NaN E4M3FN block scale"),
    ("f8.weight", 0x8000, "not a valid BF16 row scale"),  # BF16 -0
    ("f8.weight", 0x7FC0, "not a valid BF16 row scale"),  # NaN
    ("f8.weight", 0x7F80, "not a valid BF16 row scale"),  # +inf
]


@pytest.mark.parametrize(("tensor", "word", "message"), BAD_SCALES,
                         ids=[f"{t}:{w:#x}" for t, w, _ in BAD_SCALES])  # fmt: skip
def test_invalid_scale_words(
    synthetic: tuple[Path, Path, Path], tmp_path: Path, tensor: str, word: int, message: str
) -> None:
    with open_artifact(synthetic[2]) as a:
        t = a.read(tensor)
    scales = t.scales.copy()  # type: ignore[union-attr]
    scales.reshape(-1)[1] = word
    if isinstance(t, GroupedCodes):
        bad: object = GroupedCodes(t.codes, scales)
    elif isinstance(t, NVFP4Words):
        bad = NVFP4Words(t.codes, scales, t.divisor)
    else:
        assert isinstance(t, FP8RowWords)
        bad = FP8RowWords(t.codes, scales)
    art = rewrite_artifact(synthetic[2], tmp_path / "a", {tensor: bad})  # type: ignore[dict-item]
    report = run(art, use_recorded_source=False)
    assert report.exit_code == 6
    assert set(failed(report)) == {"values"}  # digests, structure and padding are valid
    [finding] = report.check("values").findings
    assert finding.tensor == tensor and finding.error == "ValueInvariantError"
    assert finding.kind == "value_invariant"
    assert message in finding.message and "1 such word" in finding.message


def test_nvfp4_divisor_must_be_finite_and_positive(
    synthetic: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    with open_artifact(synthetic[2]) as a:
        t = a.read("nv.weight")
    assert isinstance(t, NVFP4Words)
    art = rewrite_artifact(synthetic[2], tmp_path / "a",
                           {"nv.weight": NVFP4Words(t.codes, t.scales, 0xBF800000)})  # fmt: skip
    report = run(art, use_recorded_source=False)
    assert "d_w word 0xbf800000 must be finite and strictly positive" in failed(report)["values"][0]


def test_w8_code_minus_128_and_zero_scale_with_codes(
    synthetic: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    with open_artifact(synthetic[2]) as a:
        w8 = a.read("w8.weight")
        q4 = a.read("attn.x.weight")
    assert isinstance(w8, GroupedCodes) and isinstance(q4, GroupedCodes)
    codes = w8.codes.copy()
    codes[2, 5] = -128
    scales = q4.scales.copy()
    scales[3, 1] = 0x0000  # +0 over a group that still holds non-zero codes
    art = rewrite_artifact(
        synthetic[2],
        tmp_path / "a",
        {
            "w8.weight": GroupedCodes(codes, w8.scales),
            "attn.x.weight": GroupedCodes(q4.codes, scales),
        },
    )
    report = run(art)
    assert report.exit_code == 6
    values = {f.tensor: f.message for f in report.check("values").findings}
    assert (
        "row 2, column 5 (group 0): word 0x80 is outside the legal code interval [-127, 127]"
        in (values["w8.weight"])
    )
    assert (
        "row 3, group 1: word 0x0000 is a +0 scale over non-zero codes" in values["attn.x.weight"]
    )
    # All findings are reported, the source comparison locates both changes too.
    words = {f.tensor: f.mismatch for f in report.check("source-words").findings}
    assert words["w8.weight"] is not None and words["w8.weight"].found == -128
    assert words["attn.x.weight"] is not None and words["attn.x.weight"].plane == "scales"
    assert (words["attn.x.weight"].row, words["attn.x.weight"].group) == (3, 1)


def test_direct_division_encoder_is_caught_by_the_source_comparison(
    synthetic: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    src, _, artifact = synthetic
    from ninfer_convert.source import open_source

    words = open_source(src).read("div.weight").words
    values = np.ascontiguousarray(words).view(np.float32)
    wrong = encode_by_division(values, "Q4G64_F16S")
    with open_artifact(artifact) as a:
        right = a.read("div.weight")
    assert isinstance(right, GroupedCodes)
    assert np.array_equal(wrong.scales, right.scales)  # same scales, some codes differ
    assert not np.array_equal(wrong.codes, right.codes)
    art = rewrite_artifact(artifact, tmp_path / "a", {"div.weight": wrong})
    report = run(art, oracle_groups=8)
    f = failed(report)
    assert set(f) <= {"source-words", "oracle-sample"} and "source-words" in f
    assert report.exit_code == 6
    m = report.first_mismatch
    assert m is not None and m.tensor == "div.weight" and m.plane == "codes"
    diff = np.argwhere(wrong.codes != right.codes)[0]
    assert (m.row, m.column) == tuple(int(i) for i in diff)
    assert (m.expected, m.found) == (int(right.codes[m.row, m.column]),
                                     int(wrong.codes[m.row, m.column]))  # fmt: skip
    # Both rows hold a boundary case, and the oracle sample includes the last group.
    assert any(x.tensor == "div.weight" for x in report.check("oracle-sample").findings)


# ---------------------------------------------------------------------------------------------
# The source


def test_source_changed_after_conversion(tmp_path: Path) -> None:
    src, recipe = write_all_formats_source(tmp_path / "src", seed=3)
    art = tmp_path / "art"
    convert_checkpoint(src, recipe, art, device="cpu", alignment=64)
    from ninfer_convert.source import open_source

    info = open_source(src).tensors["emb.weight"]
    flip_byte(src / info.file, info.offset + 10, 0x01)
    report = run(art)
    assert report.exit_code == 4
    assert set(failed(report)) == {"source-identity"}
    [finding] = report.check("source-identity").findings
    assert finding.kind == "source_mismatch" and finding.tensor == "emb.weight"
    assert "not compared" in finding.message
    assert report.check("source-words").tensors == report.tensors - 1


def test_source_changed_so_that_it_cannot_be_re_derived(tmp_path: Path) -> None:
    """A NaN now in a grouped tensor's source: re-deriving fails, the digest says why."""
    src, recipe = write_all_formats_source(tmp_path / "src", seed=5)
    art = tmp_path / "art"
    convert_checkpoint(src, recipe, art, device="cpu", alignment=64)
    from ninfer_convert.source import open_source

    info = open_source(src).tensors["mlp.up.weight"]  # F32
    path = src / info.file
    data = bytearray(path.read_bytes())
    data[info.offset : info.offset + 4] = np.array([np.nan], dtype=np.float32).tobytes()
    path.write_bytes(bytes(data))
    report = run(art)
    assert report.exit_code == 4
    assert set(failed(report)) == {"source-identity"}
    assert "'mlp.up.weight' changed since conversion" in failed(report)["source-identity"][0]


def test_a_changed_skipped_source_tensor_is_reported(tmp_path: Path) -> None:
    src, recipe = write_all_formats_source(tmp_path / "src", seed=4)
    art = tmp_path / "art"
    convert_checkpoint(src, recipe, art, device="cpu", alignment=64)
    from ninfer_convert.source import open_source

    info = open_source(src).tensors["rope.inv_freq"]
    flip_byte(src / info.file, info.offset + 1)
    report = run(art, oracle_groups=0)
    assert report.exit_code == 4
    [msg] = failed(report)["source-identity"]
    assert "source tensor 'rope.inv_freq' (not stored) changed since conversion" in msg
    assert report.check("source-words").tensors == report.tensors  # everything else compared


def test_a_different_source_is_not_the_recorded_one(
    synthetic: tuple[Path, Path, Path], examples: dict[str, Path]
) -> None:
    report = run(examples["bf16"], source=synthetic[0])
    assert report.exit_code == 4
    assert "is not the recorded one" in failed(report)["source-identity"][0]
    assert report.source.origin == "argument" and not report.source.compared


def test_missing_recorded_source_fails_unless_no_source(
    synthetic: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    src, recipe = write_all_formats_source(tmp_path / "src")
    art = tmp_path / "art"
    convert_checkpoint(src, recipe, art, device="cpu", alignment=64)
    shutil.rmtree(src)
    # Source checks that cannot run are a failure (exit 4), never a silent pass.
    report = run(art)
    assert not report.passed and report.exit_code == 4
    [finding] = report.check("source-identity").findings
    assert finding.error == "SourceError" and "cannot run" in finding.message
    assert "does not exist here" in finding.message and "--no-source" in finding.message
    assert "does not exist here" in report.check("source-words").note
    assert [name for name, _ in report.not_run] == ["source-words", "oracle-sample"]
    # Turned off on purpose: exit 0, and the report still lists what did not run.
    off = run(art, use_recorded_source=False)
    assert off.passed and off.exit_code == 0
    assert [name for name, _ in off.not_run] == ["source-identity", "source-words",
                                                 "oracle-sample"]  # fmt: skip
    # Given explicitly (an equal copy elsewhere), the comparison runs.
    report2 = run(art, source=synthetic[0])
    assert report2.passed and report2.source.compared


# ---------------------------------------------------------------------------------------------
# Usage errors


def test_usage_errors(synthetic: tuple[Path, Path, Path], tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        verify_artifact(tmp_path / "nope")
    st = synthetic[0] / "model.safetensors"
    with pytest.raises(UsageError) as info:
        verify_artifact(st)
    assert info.value.kind == "not_an_artifact"
    with pytest.raises(UsageError) as info:
        verify_artifact(synthetic[0])  # a directory without an artifact
    assert info.value.kind == "not_an_artifact"
    with pytest.raises(UsageError, match="no such source"):
        verify_artifact(synthetic[2], source=tmp_path / "nope")
    with pytest.raises(UsageError, match="jobs"):
        verify_artifact(synthetic[2], jobs=0)
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA device"):
            verify_artifact(synthetic[2], device="cuda", use_recorded_source=False)


@pytest.mark.interop
def test_compressed_tensors_fp8_checkpoint_passes(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    from verify_fixtures import write_ct_fp8_source

    src, recipe = write_ct_fp8_source(tmp_path / "ct-fp8")
    out = tmp_path / "art"
    convert_checkpoint(src, recipe, out, device="cpu", alignment=64)
    report = run(out)
    assert report.passed, failed(report)
    with open_artifact(out) as art:
        formats = [i.format for i in art.tensors.values()]
    assert formats.count("FP8_E4M3FN_ROW_BF16S") == 14  # 7 linears x 2 layers
    assert report.check("source-words").tensors == report.tensors


def test_statistics_widening_is_exact_for_every_bf16_word() -> None:
    # The statistics widen with the encoder's own to_f32: the BF16 word is the high half.
    from ninfer_convert.encoder.common import to_f32

    words = np.arange(1 << 16, dtype=np.uint16)
    assert np.array_equal(
        to_f32(words, "BF16").view(np.uint32), words.astype(np.uint32) << np.uint32(16)
    )


def test_error_statistics_against_a_binary64_reference() -> None:
    from ninfer_convert.dequant import dequantize_grouped
    from ninfer_convert.encoder import encode_grouped_words
    from ninfer_convert.verify import error_stats

    rng = np.random.default_rng(3)
    for k in (128, 100):  # broadcast fast path, and the generic path with a partial group
        x = rng.standard_normal((9, k)).astype(np.float32)
        g = encode_grouped_words(x.view(np.uint32), "F32", "Q5G64_F16S")
        e = x.astype(np.float64) - dequantize_grouped(g.codes, g.scales, "Q5G64_F16S")
        s = error_stats(FORMATS["Q5G64_F16S"], "t", x.view(np.uint32), "F32", g)
        assert s.max_abs_error == pytest.approx(np.abs(e).max(), rel=1e-6)
        assert s.rms_error == pytest.approx(np.sqrt((e * e).mean()), rel=1e-5)
        ref = 10 * np.log10((x.astype(np.float64) ** 2).sum() / (e * e).sum())
        assert s.sqnr_db == pytest.approx(ref, abs=1e-4)


@pytest.mark.parametrize("size", [0, 7, 8, (1 << 20) + 13])
def test_plane_comparison_finds_a_difference_in_any_position(size: int) -> None:
    from ninfer_convert.verify.tensor_checks import bytes_equal

    a = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    assert bytes_equal(a, a.copy())
    assert not bytes_equal(a, a[: size - 1] if size else np.zeros(1, np.uint8))
    for pos in {0, size // 2, size - 1} if size else set():
        b = a.copy()
        b[pos] ^= 0x01
        assert not bytes_equal(a, b), pos


def test_tiny_errors_are_neither_exact_nor_lost_to_underflow() -> None:
    # Values near 1e-30 get the 2^-24 rescue scale and zero codes, so every error is the value
    # itself; binary32 squares of them would underflow to 0 and report an exact tensor.
    from ninfer_convert.encoder import encode_grouped_words
    from ninfer_convert.verify import error_stats

    x = (np.linspace(1.0, 2.0, 64, dtype=np.float32) * np.float32(1e-30)).reshape(1, 64)
    g = encode_grouped_words(x.view(np.uint32), "F32", "Q4G64_F16S")
    assert not g.codes.any()
    s = error_stats(FORMATS["Q4G64_F16S"], "t", x.view(np.uint32), "F32", g)
    x64 = x.astype(np.float64)
    assert not s.exact and s.max_abs_error == float(x.max())
    assert s.rms_error == pytest.approx(float(np.sqrt((x64 * x64).mean())), rel=1e-12)
    assert s.sqnr_db == pytest.approx(0.0, abs=1e-9)  # all of the signal is error


def test_identity_findings_are_not_repeated_when_a_re_derivation_fails(
    synthetic: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tensor that differs is derived a second time to locate the differences; when that
    # fails (say the source changed in between), its source digests are read again, and a
    # finding the first read made ("records no digest") must not be reported twice.
    import ninfer_convert.derive.entry as entry_module
    from ninfer_convert.errors import SourceError

    art = copy_artifact(synthetic[2], tmp_path / "a")
    [container] = container_files(art)

    def drop_digest(header: dict[str, Any]) -> None:
        del header["artifact"]["source"]["tensors"]["emb.weight"]

    rewrite_header(container, drop_digest)
    _, offset, _ = plane_offset(art, "emb.weight", "lo4")  # Q6: lo4, hi2, scales
    patch_bytes(art, lambda path, data: data.__setitem__(offset, data[offset] ^ 0x01))
    real = entry_module.derive_packed

    def derive_packed(entry: object, *args: object, **kwargs: object) -> object:
        if getattr(entry, "output", None) == "emb.weight":
            raise SourceError("source changed during the check", tensor="emb.weight")
        return real(entry, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(entry_module, "derive_packed", derive_packed)
    report = run(art)
    identity = [f.message for f in report.check("source-identity").findings]
    assert len([m for m in identity if "records no digest" in m]) == 1, identity
    assert "cannot re-derive it" in " ".join(failed(report)["source-words"])


@pytest.mark.parametrize("jobs", [2, 4])
def test_tensors_that_differ_are_rederived_within_the_byte_budget(
    synthetic: tuple[Path, Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    jobs: int,
) -> None:
    # Block-compared tensors are admitted at no cost; one that differs reserves its source
    # bytes before it is derived whole.  With several differing at once, the bytes in flight
    # stay within the budget (or one tensor runs alone), and nothing deadlocks.
    import threading

    from ninfer_convert import scheduler

    art = copy_artifact(synthetic[2], tmp_path / "a")
    planes = {"emb.weight": "lo4", "mlp.up.weight": "lo4", "attn.x.weight": "codes",
              "mlp.down_t.weight": "codes"}  # fmt: skip
    offsets = [plane_offset(art, t, p)[1] for t, p in planes.items()]

    def flip(path: Path, data: bytearray) -> None:
        for offset in offsets:
            data[offset] ^= 0x01

    patch_bytes(art, flip)
    monkeypatch.setattr(scheduler, "MIN_INFLIGHT_BYTES", 1)  # budget = the largest tensor
    peaks: list[tuple[int, int, int]] = []
    acquire = scheduler.ByteBudget.acquire

    def recording_acquire(self: scheduler.ByteBudget, cost: int) -> None:
        acquire(self, cost)
        peaks.append((self.inflight, cost, self.budget))

    monkeypatch.setattr(scheduler.ByteBudget, "acquire", recording_acquire)
    result: list[VerifyReport] = []
    worker = threading.Thread(target=lambda: result.append(run(art, jobs=jobs)), daemon=True)
    worker.start()
    worker.join(60)
    assert result, "verify did not finish"
    flagged = {f.tensor for f in result[0].check("source-words").findings}
    assert flagged == set(planes)
    _, plan = plan_conversion(synthetic[0], synthetic[1])
    emb = next(e for e in plan.entries if e.output == "emb.weight")
    others = [e.source_bytes for e in plan.entries if e.output != "emb.weight"]
    assert emb.source_bytes not in others  # so only its reservation acquires that many bytes
    assert emb.source_bytes in [cost for _, cost, _ in peaks]
    assert all(inflight <= budget or inflight == cost for inflight, cost, budget in peaks), peaks
    assert all(cost <= budget for _, cost, budget in peaks)  # the budget covers any tensor


def test_integrity_problems_come_in_the_order_integrity_order_defines(
    sharded: Path, tmp_path: Path
) -> None:
    # verify sorts its own findings by Artifact.integrity_order; that only reproduces the
    # reader's report if the reader itself lists its problems in that order.
    art = copy_artifact(sharded, tmp_path / "a")
    with open_artifact(art) as a:
        names = list(a.tensors)
    for name in (names[-1], names[0], names[len(names) // 2]):
        path, offset, _ = plane_offset(art, name, "codes" if "norm" not in name else "words")
        flip_byte(path, offset)
    (art / "config.json").write_bytes((art / "config.json").read_bytes() + b" ")
    with open_artifact(art) as a:
        problems = a.integrity_problems()
        keys = [a.integrity_order(e.path, e.tensor) for e in problems]
    assert len(problems) == 4 and keys == sorted(keys) and len(set(keys)) == 4
