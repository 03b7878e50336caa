"""The check-grad report: one row per audited (target, switch value, placement), and errors.

Plain data (no torch), so the parent process builds it from the child's JSON. `to_json` prints
exactly the schema of issue 4; the text view is a table per target.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from klaudit import __version__
from klaudit.describe import legend_footer

JSON_FIELDS = ("target", "mode", "placement", "configuration", "objective", "unbiased", "cos_rev",
               "rel_err_rev", "value_bias", "rule", "fix")


@dataclass
class ResultRow:
    """What one (target, mode, placement) really optimises.

    objective: the target E[grad] is a positive multiple of on every audited policy (REV, FWD,
    PART, PFWD, FUT, ZERO, LEN) or OTHER. cos_rev / rel_err_rev: against grad KL(pi || ref) on
    the first tabular policy (cos is None when E[grad] is zero). value_bias: E[value] - KL_seq
    there. configuration / rule / fix: from the fingerprint's catalog row.
    """

    target: str
    mode: dict
    placement: str
    configuration: str
    objective: str
    unbiased: bool
    cos_rev: float | None
    rel_err_rev: float
    value_bias: float
    rule: str | None
    fix: str
    aggregation: str = ""
    fingerprint_objective: str | None = None
    per_policy: dict = field(default_factory=dict)
    same_gradient_as: list = field(default_factory=list)  # configurations the fingerprint cannot tell apart
    used: bool = False  # the placement the surrounding code uses (from the lint analysis), when known
    monte_carlo: dict | None = None  # the Monte-Carlo audit's test (samples, z, p, scale, policy); objective "MC"

    def as_json(self) -> dict:
        """The issue's schema, then `used` (whether the user's own code takes this placement)."""
        extra = {"monte_carlo": self.monte_carlo} if self.monte_carlo is not None else {}
        return {**{key: getattr(self, key) for key in JSON_FIELDS}, "used": self.used, **extra}

    @property
    def verdict(self) -> str:
        """The verdict cell: the exact audit's, or the Monte-Carlo test's with its p-value."""
        rule = f", {self.rule}" if self.rule else ""
        if self.monte_carlo is not None:
            p, detectable = self.monte_carlo["p"], self.monte_carlo.get("detectable")
            if not self.unbiased:
                return f"biased (p = {p:.1g}{rule})"
            if self.monte_carlo.get("identical"):
                return "no bias (the reference's gradient, sample by sample)"
            if detectable is None or not detectable < 1:
                return "no bias detected at this sample size"
            return f"no bias larger than {detectable:.1%} of |REV| (p < 1e-6)"
        return "unbiased" if self.unbiased else f"biased ({self.rule})" if self.rule else "biased"


@dataclass
class Report:
    """All rows of a run and the one-line errors; `.unbiased` is what a CI assertion wants."""

    results: list[ResultRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # tracebacks, shown with --verbose

    def __repr__(self) -> str:
        biased = [f"{row.target} {row.mode or ''} as {row.placement}: {row.objective}"
                  for row in self.results if not row.unbiased]
        return f"Report(unbiased={self.unbiased}, biased={biased}, errors={self.errors})"

    @property
    def unbiased(self) -> bool:
        """True when every audited row is unbiased and nothing failed."""
        return bool(self.results) and not self.errors and all(row.unbiased for row in self.results)

    @property
    def exit_code(self) -> int:
        """0 every row unbiased, 1 any biased, 2 any error."""
        return self.exit_code_for(used_only=False)

    def exit_code_for(self, *, used_only: bool) -> int:
        """`exit_code`; with `used_only`, a target's rows count only where its code uses them (all of
        them when no use of the target is known)."""
        if self.errors or not self.results:
            return 2
        used_targets = {row.target for row in self.results if row.used}
        counted = [row for row in self.results
                   if not used_only or row.used or row.target not in used_targets]
        return 0 if all(row.unbiased for row in counted) else 1

    def extend(self, other: Report) -> None:
        self.results += other.results
        self.errors += [error for error in other.errors if error not in self.errors]
        self.notes += [note for note in other.notes if note not in self.notes]
        self.details += other.details

    def to_json(self) -> str:
        return json.dumps({"version": __version__, "results": [row.as_json() for row in self.results],
                           "errors": list(self.errors), "notes": list(self.notes)}, indent=2)

    def to_dict(self) -> dict:
        return {"results": [asdict(row) for row in self.results], "errors": self.errors, "notes": self.notes,
                "details": self.details}

    @classmethod
    def from_dict(cls, data: dict) -> Report:
        return cls([ResultRow(**row) for row in data.get("results", [])], list(data.get("errors", [])),
                   list(data.get("notes", [])), list(data.get("details", [])))

    def to_text(self) -> str:
        """A table per target, then notes, errors and a summary line."""
        lines: list[str] = []
        targets = list(dict.fromkeys(row.target for row in self.results))
        for target in targets:
            lines.append(f"{target}")
            rows = [row for row in self.results if row.target == target]
            table = [("mode", "placement", "configuration", "objective", "cos REV", "verdict")]
            for row in rows:
                mode = ", ".join(f"{k}={v}" for k, v in row.mode.items()) or "-"
                cos = "-" if row.cos_rev is None else f"{row.cos_rev:+.3f}"
                placement = row.placement + (" (used)" if row.used else "")
                table.append((mode, placement, row.configuration, row.objective, cos, row.verdict))
            widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]))]
            for cells in table:
                lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip())
            for configuration, twins in dict.fromkeys((row.configuration, tuple(row.same_gradient_as))
                                                      for row in rows if row.same_gradient_as):
                lines.append(f"  {configuration}: the same per-sample gradient as {'; '.join(twins)}")
            monte_carlo = next((row.monte_carlo for row in rows if row.monte_carlo), None)
            if monte_carlo is not None:
                lines.append(f"  Monte Carlo: {monte_carlo['samples']} responses of {monte_carlo['policy']}; cos REV and "
                             f"the verdict compare the mean LM-head gradient with the Rao-Blackwellized reference's "
                             f"(paired split-sample z-test of equal means with control variates, biased when "
                             f"p < 1e-6; 'no bias larger than X%': a bias of X% of |REV| would have been found "
                             f"9 times in 10)")
            aggregations = sorted({row.aggregation for row in rows if row.aggregation})
            if aggregations:
                lines.append(f"  aggregation: {'; '.join(aggregations)}")
            for fix in dict.fromkeys(row.fix for row in rows if row.fix and not row.unbiased):
                lines.append(f"  fix: {fix}")
            lines.append("")
        if self.results:
            lines += ["objectives (what the exact expected gradient follows):",
                      *legend_footer(row.objective for row in self.results), ""]
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"error: {error}" for error in self.errors]
        biased = sum(not row.unbiased for row in self.results)
        lines.append(f"{len(self.results)} row{'s' if len(self.results) != 1 else ''} audited, "
                     f"{biased} biased, {len(self.errors)} error{'s' if len(self.errors) != 1 else ''}")
        return "\n".join(lines)
