"""Claiming: which recipe rule owns each source tensor, and what each rule will make.

Contract (docs/recipes.md, "How rules claim tensors"): rules are applied in file order and each
claims source tensors not claimed by an earlier rule; the first rule that matches a tensor
owns it.  A rule that ends up claiming nothing is an error (unless ``optional: true``), so a
rule can never be silently shadowed.  ``derive`` and ``copy`` rules name their inputs
explicitly; an input already claimed by an earlier rule is an error, never a silent reuse; a
unit that fails still owns its tensors (no follow-on noise).  Tensors no rule claims are an
error (:meth:`Claims.unclaimed`).  Problems are appended, in the order found, to the list the
caller gives; each :class:`Candidate` is one output to plan, with its source tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..jsonfields.makers import instance_maker
from ..source import SourceCheckpoint, SourceTensorInfo
from .copy_paths import COPY_PATHS
from .entries import RuleRef, SkippedTensor
from .model import Problem, Recipe, Rule, SourceField

__all__ = ["Candidate", "Claims", "rule_problem"]

_MAX_UNCLAIMED_SHOWN = 50


def rule_problem(rule: Rule | None, message: str, line: int | None = None) -> Problem:
    """A problem of ``rule`` (at ``line``, default the rule's own line), named by the rule."""
    where = rule.describe() + ": " if rule is not None else ""
    return Problem(line if line is not None else (rule.line if rule else None), where + message)


@dataclass(slots=True)
class Candidate:
    """One output a rule claimed, with its source tensors and the field each one fills."""

    rule: Rule
    output: str
    sources: list[tuple[SourceTensorInfo, SourceField]]


_make_candidate = instance_maker(Candidate)


class Claims:
    """The claiming pass over one source: ``claimed`` (tensor -> owning rule), ``candidates``
    (in rule order), ``skipped``, and problems appended to ``problems``."""

    def __init__(self, recipe: Recipe, source: SourceCheckpoint, problems: list[Problem]) -> None:
        self.recipe = recipe
        self.source = source
        self.names = list(source.tensors)  # sorted by name
        self.problems = problems
        self.claimed: dict[str, Rule] = {}
        self.candidates: list[Candidate] = []
        self.skipped: list[SkippedTensor] = []

    def err(self, rule: Rule | None, message: str, line: int | None = None) -> None:
        self.problems.append(rule_problem(rule, message, line))

    def claim_all(self) -> None:
        for rule in self.recipe.rules:
            if rule.kind in ("match", "skip"):
                self._claim_matching(rule)
            elif rule.kind == "copy":
                self._claim_copy(rule)
            else:
                self._claim_derive(rule)

    def unclaimed(self) -> None:
        unclaimed = [n for n in self.names if n not in self.claimed]
        if unclaimed:
            shown = unclaimed[:_MAX_UNCLAIMED_SHOWN]
            more = len(unclaimed) - len(shown)
            self.problems.append(
                Problem(
                    None,
                    f"{len(unclaimed)} source tensor"
                    f"{'s are' if len(unclaimed) != 1 else ' is'} claimed by no "
                    "rule or skip: " + ", ".join(shown) + (f" ... and {more} more" if more else ""),
                )
            )

    def _nothing(self, rule: Rule, shadowed: list[str], hint: str = "") -> None:
        if rule.optional:
            return
        if shadowed:
            lines = sorted({self.claimed[n].line for n in shadowed})
            self.err(
                rule,
                f"claims nothing: every tensor it matches ({len(shadowed)}, e.g. "
                f"{shadowed[0]!r}) is already claimed by the rule(s) at line(s) "
                + ", ".join(map(str, lines))
                + "; reorder the rules or mark it "
                "optional: true",
            )
        else:
            self.err(
                rule,
                "matches no source tensor"
                + (f" ({hint})" if hint else "")
                + "; fix the pattern or mark the rule optional: true",
            )

    def _claim_matching(self, rule: Rule) -> None:
        assert rule.pattern is not None  # parse guarantees it for match/skip rules
        matches = rule.pattern.regex.fullmatch  # NamePattern.matches, without the method call
        hits = [n for n in self.names if matches(n)]
        claimed = self.claimed
        free = [n for n in hits if n not in claimed]
        if not free:
            self._nothing(rule, hits)
            return
        tensors = self.source.tensors
        if rule.kind == "skip":
            ref, reason = RuleRef.of(rule), rule.reason or ""
            for n in free:
                claimed[n] = rule
                info = tensors[n]
                self.skipped.append(
                    SkippedTensor(n, info.dtype, info.shape, info.file, ref, reason)
                )
            return
        append = self.candidates.append
        for n in free:
            claimed[n] = rule
            append(_make_candidate(rule, n, [(tensors[n], "input")]))

    def _claim_copy(self, rule: Rule) -> None:
        assert rule.pattern is not None and rule.copy is not None
        tensors = self.source.tensors
        units = COPY_PATHS[rule.copy].units(self.names, tensors)
        matched = [u for u in units if rule.pattern.matches(u.output)]
        free = [u for u in matched if u.primary not in self.claimed]
        if not free:
            if matched:
                self._nothing(rule, [u.primary for u in matched])
            else:
                direct = sum(1 for n in self.names if rule.pattern.matches(n))
                hint = (
                    f"the pattern matches output names such as X.weight built from "
                    f"{rule.copy} tensors; it matches {direct} source tensor names but no "
                    "complete set of them"
                )
                self._nothing(rule, [], hint)
            return
        for unit in free:
            out, parts = unit.output, unit.parts
            ok = True
            for name, _f in parts:
                if name not in tensors:
                    self.err(
                        rule, f"{out!r}: the {rule.copy} tensor {name!r} is missing from the source"
                    )
                    ok = False
                elif name in self.claimed:
                    self.err(
                        rule,
                        f"{out!r}: {name!r} is already claimed by the rule at line "
                        f"{self.claimed[name].line}",
                    )
                    ok = False
            for name, _f in parts:  # a failed unit still owns its tensors: no follow-on noise
                if name in tensors:
                    self.claimed.setdefault(name, rule)
            if ok:
                self.candidates.append(Candidate(rule, out, [(tensors[n], f) for n, f in parts]))

    def _claim_derive(self, rule: Rule) -> None:
        assert rule.output is not None and rule.inputs
        bindings: list[dict[str, str]] = []
        seen: set[tuple[tuple[str, str], ...]] = set()
        for n in self.names:
            b = rule.inputs[0].match(n)
            if b is None:
                continue
            key = tuple(sorted(b.items()))
            if key not in seen:
                seen.add(key)
                bindings.append(b)
        first = rule.inputs[0]
        free = [b for b in bindings if first.format(b) not in self.claimed]
        if not free:
            if bindings:
                self._nothing(rule, [first.format(b) for b in bindings])
            else:
                self._nothing(rule, [], f"no tensor matches the first input {first.text!r}")
            return
        for b in free:
            names = [t.format(b) for t in rule.inputs]
            out = rule.output.format(b)
            ok = True
            for name in names:
                if name not in self.source.tensors:
                    self.err(rule, f"{out!r}: input {name!r} is missing from the source")
                    ok = False
                elif name in self.claimed:
                    self.err(
                        rule,
                        f"{out!r}: input {name!r} is already claimed by the rule at "
                        f"line {self.claimed[name].line}",
                    )
                    ok = False
            for name in names:  # a failed unit still owns its inputs: no follow-on noise
                if name in self.source.tensors:
                    self.claimed.setdefault(name, rule)
            if ok:
                self.candidates.append(
                    Candidate(rule, out, [(self.source.tensors[n], "input") for n in names])
                )
