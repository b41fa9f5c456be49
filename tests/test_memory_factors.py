"""Peak memory of convert and verify with GPTQ_F16_SEARCH_IW_V1 follows the largest
compensation factor, not the model's factors: a subprocess converts and verifies a checkpoint
of 16 compensated tensors whose [2048, 2048] factors (16 MiB each, 256 MiB in all) are read,
checked and written one at a time, while its RssAnon is sampled."""

from __future__ import annotations

import struct
import sys
import textwrap
from pathlib import Path

import numpy as np
from recipe_fixtures import RECIPE_HEAD
from rss_fixtures import peak_rss_anon_mib
from st_helpers import write_safetensors

from ninfer_convert.factors import factor_bytes
from ninfer_convert.importance import f32_file_header, write_importance_file

ROOT = Path(__file__).resolve().parents[1]
TENSORS = 16
K = 2048
ROWS = 4

CEILING_MIB = 160
"""Peak RssAnon allowed for convert then verify in one process (interpreter, imports and the
plan: about 80 MiB; the factors of the tensors in flight: a few times 16 MiB).  Holding every
factor, as convert and verify did before factors were attached by reference, peaked near
0.8 GiB here (1.2 GiB with 24 such tensors): the 256 MiB of factors on the plan, the side file
built whole beside them, and verify's whole side file and its parsed copy."""


def _factor(seed: int) -> np.ndarray:
    """A valid [K, K] factor (one block): positive diagonal, +0 below it, small upper entries."""
    rng = np.random.default_rng(seed)
    f = np.triu(rng.uniform(-0.1, 0.1, (K, K)).astype(np.float32), 1)
    f[np.arange(K), np.arange(K)] = rng.uniform(0.5, 2.0, K).astype(np.float32)
    return f.view(np.uint32)


def _inputs(tmp: Path) -> tuple[Path, Path, Path, Path]:
    src = tmp / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    rng = np.random.default_rng(1)
    w = rng.standard_normal((TENSORS, ROWS, K)).astype(np.float32)
    words = (w.view(np.uint32) >> 16).astype(np.uint16)
    names = [f"layers.{i}.w" for i in range(TENSORS)]
    write_safetensors(src / "model.safetensors",
                      {n: ("BF16", words[i]) for i, n in enumerate(names)})  # fmt: skip
    imp, fac = tmp / "imp.safetensors", tmp / "fac.safetensors"
    weights = rng.lognormal(0, 1, K).astype(np.float32).view(np.uint32)
    write_importance_file(imp, dict.fromkeys(names, weights))
    # Written a factor at a time (the bytes of write_factor_file: a test of that below).
    text = f32_file_header(dict.fromkeys(names, (K, K)), None)
    with open(fac, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for i in range(TENSORS):  # sorted names: layers.0, layers.1, layers.10, ...
            f.write(_factor(int(sorted(names)[i].split(".")[1])).tobytes())
    recipe = tmp / "r.yaml"
    recipe.write_text(
        RECIPE_HEAD + "- match: 're:layers\\.\\d+\\.w'\n  format: Q4G64_F16S\n"
        "  encoder_profile: GPTQ_F16_SEARCH_IW_V1\n  role: r\n  evidence: [e1]\n"
    )
    return src, recipe, imp, fac


def test_convert_and_verify_hold_the_factors_in_flight_not_all(tmp_path: Path) -> None:
    src, recipe, imp, fac = _inputs(tmp_path)
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from ninfer_convert.convert import convert_checkpoint
        from ninfer_convert.verify.engine import verify_artifact
        convert_checkpoint({str(src)!r}, {str(recipe)!r}, {str(out)!r}, device="cpu", jobs=2,
                           importance={str(imp)!r}, factors={str(fac)!r})
        # No oracle sample: its exact reference costs about 0.2 s a row at this size.
        report = verify_artifact({str(out)!r}, source={str(src)!r}, jobs=2, device="cpu",
                                 oracle_groups=0)
        assert report.exit_code == 0, [c for c in report.checks if c.status == "fail"]
        print("ok")
        """
    )
    peak, output = peak_rss_anon_mib([sys.executable, "-c", script])
    assert output.strip().endswith("ok"), output
    assert peak < CEILING_MIB, f"peak RssAnon {peak:.0f} MiB"
    print(f"peak RssAnon {peak:.0f} MiB")


def test_the_streamed_factor_file_of_the_memory_test_is_write_factor_files(tmp_path: Path) -> None:
    small = {f"layers.{i}.w": np.full((128, 128), i + 1, np.uint32) for i in range(11)}
    text = f32_file_header(dict.fromkeys(small, (128, 128)), None)
    body = b"".join(small[n].tobytes() for n in sorted(small))
    assert struct.pack("<Q", len(text)) + text + body == factor_bytes(small)
