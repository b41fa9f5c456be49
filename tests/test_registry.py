"""The closed format registry and the encoder-profile table (spec Sections 1, 3.2, 7, 10)."""

from __future__ import annotations

import dataclasses

import pytest

import ninfer_convert
from ninfer_convert.errors import FormatError, UsageError
from ninfer_convert.formats import (
    ENCODER_PROFILES,
    FORMATS,
    Category,
    check_profile_fits,
    lookup_format,
    lookup_profile,
)

CANONICAL = [
    "BF16", "FP32", "I32", "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "NVFP4",
    "FP8_E4M3FN_ROW_BF16S",
]  # fmt: skip


def test_registry_holds_exactly_the_nine_canonical_names() -> None:
    assert list(FORMATS) == CANONICAL
    assert ninfer_convert.FORMATS is FORMATS
    for name in CANONICAL:
        assert ninfer_convert.lookup_format(name).name == name


@pytest.mark.parametrize(
    "name",
    ["FP16", "INT32", "Q4G32_F16S", "W8G64_F16S", "q4g64_f16s", "BF16_CTRL", "FP32_CTRL",
     "I32_CTRL", "FP8_E4M3FN", "I64", "Q6G128_F16S", "Q4G64", " BF16", "BF16 ", "", "nvfp4",
     "Q3G64_F16S", "NF4"],
)  # fmt: skip
def test_non_members_are_rejected_with_the_valid_names_listed(name: str) -> None:
    with pytest.raises(FormatError) as info:
        lookup_format(name)
    assert isinstance(info.value, UsageError)
    for valid in CANONICAL:
        assert valid in str(info.value)


@pytest.mark.parametrize("thing", [None, 4, ("Q4", 64), b"BF16"])
def test_non_string_names_are_rejected(thing: object) -> None:
    with pytest.raises(FormatError):
        lookup_format(thing)


@pytest.mark.parametrize(
    ("name", "bits", "group", "qmin", "qmax", "bpw"),
    [
        ("Q4G64_F16S", 4, 64, -8, 7, 4.25),
        ("Q5G64_F16S", 5, 64, -16, 15, 5.25),
        ("Q6G64_F16S", 6, 64, -32, 31, 6.25),
        ("W8G32_F16S", 8, 32, -127, 127, 8.5),
    ],
)
def test_grouped_entries_match_spec_tables(
    name: str, bits: int, group: int, qmin: int, qmax: int, bpw: float
) -> None:
    f = FORMATS[name]
    assert (f.category, f.code_bits, f.group_size, f.qmin, f.qmax) == (
        Category.GROUPED, bits, group, qmin, qmax)  # fmt: skip
    assert f.scale_word == "binary16"
    assert f.layout == "row-split-k128-v1"
    assert f.logical_bits_per_weight == bpw


def test_direct_and_float_entries_match_spec_tables() -> None:
    assert [(FORMATS[n].code_bits, FORMATS[n].layout) for n in ("BF16", "FP32", "I32")] == [
        (16, "contiguous-le-v1"), (32, "contiguous-le-v1"), (32, "contiguous-le-v1")]  # fmt: skip
    nv = FORMATS["NVFP4"]
    assert (nv.category, nv.code_bits, nv.group_size, nv.scale_word, nv.layout) == (
        Category.BLOCK_SCALED, 4, 16, "e4m3fn", "blockscale-k16-m128x4-v1")  # fmt: skip
    fp8 = FORMATS["FP8_E4M3FN_ROW_BF16S"]
    assert (fp8.category, fp8.code_bits, fp8.scale_word, fp8.layout) == (
        Category.ROW_SCALED, 8, "bf16", "row-scale-v1")  # fmt: skip


def test_registry_is_read_only_and_entries_frozen() -> None:
    with pytest.raises(TypeError):
        FORMATS["FP16"] = FORMATS["BF16"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        FORMATS["BF16"].name = "FP16"  # type: ignore[misc]


def test_encoder_profile_table_is_closed_and_fits_grouped_only() -> None:
    assert list(ENCODER_PROFILES) == [
        "MAXABS_F16_RECIP_RNE_V1",
        "MSE_F16_SEARCH_V1",
        "MSE_F16_SEARCH_IW_V1",
        "GPTQ_F16_SEARCH_IW_V1",
    ]
    for profile in ENCODER_PROFILES:
        for name in CANONICAL:
            if FORMATS[name].is_grouped:
                check_profile_fits(profile, name)
            else:
                with pytest.raises(FormatError):
                    check_profile_fits(profile, name)
    for bad in ("maxabs_f16_recip_rne_v1", "MAXABS_F16_RECIP_RNE_V2", "GPTQ"):
        with pytest.raises(FormatError):
            lookup_profile(bad)
