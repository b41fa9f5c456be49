"""ninfer-convert: checkpoint converter and verifier for the NInfer inference engine.

Stable public API (other tools call these names):

* :data:`FORMATS`, :func:`lookup_format` - the closed registry of the nine numeric formats.
* :func:`encode_grouped` - the canonical MAXABS_F16_RECIP_RNE_V1 encoder (oracle/numpy/torch).
* :func:`dequantize_grouped` - the binary32 reconstruction oracle of the grouped formats.
* :func:`open_artifact`, :class:`ArtifactWriter` - read and write .ninfer artifacts.
* :data:`LAYOUTS`, :func:`lookup_layout` - the closed registry of storage layouts.
* :func:`load_state_dict` - an artifact as a lazy torch state dict, under source or stored names.
"""

from __future__ import annotations

# First: the console script's start-up signal handling (before the heavy imports below).
from . import _startup  # noqa: F401
from ._version import __version__
from .container import ArtifactWriter, open_artifact
from .convert import convert_checkpoint, plan_conversion
from .dequant import dequantize_grouped, dequantize_logical
from .encoder import encode_grouped, encode_grouped_words
from .errors import NinferError
from .formats import ENCODER_PROFILES, FORMATS, lookup_format, lookup_profile
from .inspect import inspect_artifact
from .layouts import LAYOUTS, lookup_layout
from .loader import ArtifactStateDict, load_state_dict
from .logical import DirectWords, FP8RowWords, GroupedCodes, NVFP4Words
from .verify import verify_artifact

__all__ = [
    "ENCODER_PROFILES",
    "FORMATS",
    "LAYOUTS",
    "ArtifactStateDict",
    "ArtifactWriter",
    "DirectWords",
    "FP8RowWords",
    "GroupedCodes",
    "NVFP4Words",
    "NinferError",
    "__version__",
    "convert_checkpoint",
    "dequantize_grouped",
    "dequantize_logical",
    "encode_grouped",
    "encode_grouped_words",
    "inspect_artifact",
    "load_state_dict",
    "lookup_format",
    "lookup_layout",
    "lookup_profile",
    "open_artifact",
    "plan_conversion",
    "verify_artifact",
]
