"""Frozen dataclasses of a parsed recipe and the aggregated recipe error.

Contract: a :class:`Recipe` keeps the exact file text and its digest, and every element that
came from the file keeps its 1-based line number so that any later problem (plan time
included) can point at it.  :class:`RecipeProblems` is the one error raised for an invalid
recipe: it carries every :class:`Problem` found in the stage that failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import RecipeError
from .patterns import NamePattern, NameTemplate

__all__ = [
    "Evidence",
    "OutputOptions",
    "Problem",
    "Recipe",
    "RecipeProblems",
    "Rule",
    "RuleKind",
    "SourceField",
    "SourceIdentity",
    "TransformSpec",
]

RuleKind = Literal["match", "copy", "derive", "skip"]

_MAX_SHOWN = 200

SourceField = Literal[
    "input",
    "packed-codes",
    "block-scales",
    "global-divisor",
    "global-multiplier",
    "codes",
    "row-scales",
]
"""What a source tensor contributes to a plan entry (``input`` for every non-copy rule)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe; ``line`` is 1-based, ``None`` for the recipe as a whole."""

    line: int | None
    message: str

    def render(self) -> str:
        return (f"line {self.line}: " if self.line is not None else "") + self.message


class RecipeProblems(RecipeError):
    """Every problem of one recipe stage (loading, or planning against a source), together."""

    def __init__(
        self, problems: list[Problem] | tuple[Problem, ...], *, path: str | None, stage: str
    ) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        n = len(self.problems)
        shown = [p.render() for p in self.problems[:_MAX_SHOWN]]
        if n > _MAX_SHOWN:
            shown.append(f"... and {n - _MAX_SHOWN} more")
        super().__init__(
            f"{n} problem{'s' if n != 1 else ''} {stage} (nothing was converted):\n  "
            + "\n  ".join(shown),
            path=path,
        )


@dataclass(frozen=True)
class Evidence:
    """A cited quality-evidence entry (free text, stored in the artifact)."""

    id: str
    citation: str
    summary: str
    url: str | None
    line: int

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "citation": self.citation, "url": self.url, "summary": self.summary}


@dataclass(frozen=True)
class SourceIdentity:
    """What the recipe expects of the source; each field that is set is checked."""

    model_type: tuple[str, ...]
    """config.json ``model_type`` must be one of these (empty: not checked)."""
    architectures: tuple[str, ...]
    """config.json ``architectures`` must contain at least one of these (empty: not checked)."""
    config: tuple[tuple[str, object, int], ...]
    """(dotted key, expected JSON value, line) triples checked against config.json."""
    tensor_count: int | None
    shapes: tuple[tuple[str, tuple[int, ...], int], ...]
    """(tensor name, expected shape, line) triples."""
    line: int
    key_lines: tuple[tuple[str, int], ...] = ()
    """Line of each key given under ``source``."""
    config_absent: tuple[tuple[str, int], ...] = ()
    """(dotted key, line) pairs that config.json must not have (a null value is present)."""

    def line_of(self, key: str) -> int:
        return dict(self.key_lines).get(key, self.line)


@dataclass(frozen=True)
class TransformSpec:
    """One transform as written: ``transpose`` or ``reshape`` to ``shape`` (one -1 allowed)."""

    op: Literal["transpose", "reshape"]
    shape: tuple[int, ...] | None
    line: int


@dataclass(frozen=True)
class Rule:
    """One entry of ``rules``, in file order (``index`` is 0-based, ``line`` 1-based)."""

    index: int
    line: int
    kind: RuleKind
    pattern: NamePattern | None
    """match/copy/skip: the tensor-name pattern (copy: matched against output names)."""
    output: NameTemplate | None
    """derive: the output-name template."""
    inputs: tuple[NameTemplate, ...]
    concat_axis: int | None
    format: str | None
    """The format name as written (validated against the closed registry at load time)."""
    encoder_profile: str | None
    conversions: tuple[str, ...]
    keep_nonfinite: bool
    copy: str | None
    role: str | None
    constraints: tuple[str, ...]
    transforms: tuple[TransformSpec, ...]
    evidence: tuple[str, ...]
    reason: str | None
    optional: bool
    fallback_profile: str | None = None
    """With an importance-weighted ``encoder_profile``: the profile (one that needs no
    calibration data) a tensor of this rule is encoded with when the importance file has no
    vector for it (docs/recipes.md 4.8); None: such a tensor is refused."""

    @property
    def pattern_text(self) -> str:
        if self.output is not None:
            return self.output.text
        return self.pattern.text if self.pattern is not None else ""

    def describe(self) -> str:
        # Quoted as written (no repr escaping), so a regex reads as it does in the file.
        return f"rule {self.index + 1} ({self.kind} '{self.pattern_text}')"


@dataclass(frozen=True)
class OutputOptions:
    """The recipe's ``output`` section: what convert writes beside the artifact."""

    readme: bool = True
    """Write the generated model card README.md (the source's card becomes SOURCE_README.md)."""
    line: int | None = None


@dataclass(frozen=True)
class Recipe:
    """A loaded recipe.  ``text`` is the exact file text; ``digest`` is ``sha256:<hex>`` of its
    UTF-8 bytes."""

    path: str | None
    text: str
    digest: str
    schema: int
    name: str
    version: str
    description: str | None
    source: SourceIdentity
    evidence: tuple[Evidence, ...]
    rules: tuple[Rule, ...]
    output: OutputOptions = OutputOptions()

    def evidence_by_id(self, ident: str) -> Evidence | None:
        for e in self.evidence:
            if e.id == ident:
                return e
        return None
