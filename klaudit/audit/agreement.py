"""Do the two wings agree? The lint's verdict on each KL site against check-grad's measurement of it.

For every KL term the lint judges in a file (`klaudit.lint.query.site_verdicts`, one record per switch
branch), check-grad audits the code that computes it: the inline statements cut out of the step
(klaudit.audit.inline) or the helper the step calls, in the placement the lint reads (loss, reward,
loss+reward ...), at the switch values that select the branch. The lint's rules split in two:

* the rules of the part check-grad runs: the estimator in its placement, the sign and a clamp
  (`catalog.defects` of the configuration summed per sequence and sampled on-policy, as check-grad
  audits a helper, kl-math.md section 8);
* the rules decided by the code around it, which check-grad does not run: how the step aggregates
  (KL007), whether its samples are stale (KL008) and the sign the sink gives the term (KL011); the
  function that holds the sink, audited whole, runs its own aggregation and sign.

A branch agrees when each of check-grad's rows for those switch values and that placement carries the
first (most severe) rule of the first kind, or no rule where there is none (check-grad names one
configuration, and so one rule, per row; a second defect of the part, e.g. a clamp beside a wrong
placement, is listed). A switch value check-grad audits and no lint branch selects is compared too:
the lint's silence agrees only with an unbiased row. A site check-grad cannot run (a step that needs
models, a term passed through stored state) is listed with why, not compared. Nothing here decides a
verdict: both sides come from the wings as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from klaudit.audit.discover import DiscoveryError, discover_kl_functions
from klaudit.audit.inline import slices_of
from klaudit.audit.report import Report, ResultRow
from klaudit.audit.roles import Role
from klaudit.audit.runner import Target
from klaudit.catalog import Aggregation, Returns, Sampling, defects
from klaudit.lint.facts import is_literal, takes
from klaudit.lint.query import InlineSite, KLSite, instance_switches, numeric_comparison, site_verdicts

# (target, placements, {parameter: role}) -> check-grad's report; the roles are --bind overrides
Audit = Callable[[Target, Sequence[str], Mapping[str, str]], Report]


@dataclass(frozen=True)
class Verdict:
    """One branch of one lint site, compared: the lint's rules (all, and those of the audited part),
    check-grad's target, rows and rules for it, and whether they agree (with why not)."""

    site: KLSite
    target: str
    lint_rules: tuple[str, ...]
    audited_rules: tuple[str, ...]
    modes: tuple[str, ...]  # check-grad's modes compared, as `name=value, ...`
    objectives: tuple[str, ...]
    check_grad_rules: tuple[str, ...]
    agree: bool
    reason: str = ""
    audited: bool = True  # False: check-grad cannot run this code (the reason says why); no verdict to compare

    @property
    def caller_rules(self) -> tuple[str, ...]:
        """The lint's rules that the code around the audited part decides (aggregation, sampling, sign)."""
        return tuple(rule for rule in self.lint_rules if rule not in self.audited_rules)


def audited_part(site: KLSite, whole: bool = False, scored: bool = False, clamped: bool | None = None) -> tuple[str, ...]:
    """The lint's rules for the part check-grad runs. A helper or a cut-out term: the site's configuration
    summed per sequence and on-policy (a reward propagated by reward-to-go, which has the expectation of
    a whole-sequence return, unless the cut-out code multiplies it by the score itself: `scored`). The
    function that holds the sink, audited `whole`: its own aggregation too. `clamped`: whether the audited
    code clamps the term (None: where the site does; a helper's caller may clamp what it returns)."""
    config = dataclasses.replace(site.config, sampling=Sampling.ON_POLICY)
    if not whole:
        config = dataclasses.replace(config, aggregation=Aggregation.SUM, sign=1)
        if config.reward is not None and config.loss is None and not scored:
            config = dataclasses.replace(config, returns=Returns.TO_GO)
    return tuple(row.rule for row in defects(config, site.clamped if clamped is None else clamped)
                 if row.rule is not None)


class _Auditable:
    """The functions of each file that check-grad can call alone (klaudit.audit.discover), and why not."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[list[str], list[str]]] = {}

    def why_not(self, path: str, qualname: str) -> str | None:
        """None when `qualname` of `path` can be audited alone, else the discovery's line for it."""
        if path not in self._found:
            try:
                found = discover_kl_functions(path)
                self._found[path] = (found.auditable, found.skipped)
            except DiscoveryError as error:
                self._found[path] = ([], [str(error)])
        auditable, skipped = self._found[path]
        if qualname in auditable:
            return None
        return next((line for line in skipped if f"::{qualname} " in line),
                    f"{path}::{qualname} is not a function check-grad can call alone")


def targets_of(path: str, sites: Iterable[KLSite]) -> tuple[dict[KLSite, Target], dict[KLSite, str], set[Target]]:
    """check-grad's target for each site, why for the sites that have none, and the targets audited in
    the placement of their own result: the function holding the sink itself, and the terms cut out of
    it (whatever weights them inside the cut is part of their value)."""
    sites = list(sites)
    auditable = _Auditable()
    to_slice = [site for site in sites if site.inline and auditable.why_not(path, site.function) is not None]
    slices, failures = slices_of(path, [InlineSite(s.function, s.origin_line, s.sink_line, s.placement, s.line)
                                        for s in to_slice if s.origin_line is not None])
    by_origin = {(piece.qualname, piece.origin): piece for piece in slices}
    targets: dict[KLSite, Target] = {}
    missing: dict[KLSite, str] = {}
    whole: set[Target] = set()
    switched: dict[tuple[str, str], set[str]] = {}  # helper -> the switches it reads from its instance
    for site in sites:
        if site.inline and site not in to_slice:
            targets[site] = Target(path=path, qualname=site.function)
            whole.add(targets[site])
        elif site.inline:
            piece = by_origin.get((site.function, site.origin_line or 0))
            if piece is None:
                missing[site] = next((line for line in failures if f"line {site.origin_line} " in line),
                                     f"the KL term of {site.function} cannot be cut out")
            else:  # audited as its sink takes it: a weight inside the cut-out code is part of its value
                targets[site] = Target(path=path, qualname=piece.name, label=str(piece), source=piece.source,
                                       placement=piece.placement)
                whole.add(targets[site])
        elif site.helpers():  # the outermost helper check-grad can call alone, else the function holding the sink
            why = {helper: auditable.why_not(*helper) for helper in site.helpers()}
            chosen = next((helper for helper, reason in why.items() if reason is None), None)
            if chosen is not None and chosen not in switched:
                switched[chosen] = instance_switches(*chosen)
            fixed = switched[chosen] - {name for name, _ in site.labels} if chosen is not None else set()
            if chosen is not None and fixed:  # KLEstimator("k1") built by the caller: values the site has no label of
                missing[site] = (f"{chosen[1]} reads {', '.join(sorted('self.' + name for name in fixed))} from an "
                                 f"instance its caller builds, with a value the lint's record of the site does not name")
            elif chosen is not None:
                targets[site] = _helper_target(site, chosen)
            elif auditable.why_not(path, site.function) is None:  # what the helpers take is made in `function`:
                targets[site] = Target(path=path, qualname=site.function)  # audited whole, as it forms the sink
                whole.add(targets[site])
            else:
                missing[site] = next(iter(why.values())) or ""
        else:
            missing[site] = "the term reaches the sink through stored state (a field, a buffer), not a call"
    return targets, missing, whole


def _helper_target(site: KLSite, helper: tuple[str, str]) -> Target:
    """check-grad's target for `helper` of `site`, with the inputs the site's call hands it bound as the lint reads
    them (KLSite.inputs_of): a target of its own for each such binding, apart from the calls that hand it
    what names alone say. Where that is an importance ratio (slime's compute_approx_kl(..., importance_ratio=exp(logp
    - old))), the weighted result is audited as the loss it is."""
    inputs = site.inputs_of(helper)
    if not inputs:
        return Target(path=helper[0], qualname=helper[1])
    weighted = any(role == Role.RATIO.value for _, role in inputs)
    return Target(path=helper[0], qualname=helper[1], placement="loss" if weighted else None,
                  label=f"{helper[0]}::{helper[1]} ({', '.join(name + '=' + role for name, role in inputs)})")


def compare(path: str, audit: Audit, sites: Sequence[KLSite] | None = None) -> list[Verdict]:
    """The lint's verdict on each KL site of `path` against check-grad's (`audit` runs check-grad;
    placements None: the target's own)."""
    sites = list(site_verdicts(path) if sites is None else sites)
    targets, missing, whole = targets_of(path, sites)
    reports: dict[Target, Report] = {}
    for target in dict.fromkeys(targets.values()):
        chosen_by = [site for site, chosen in targets.items() if chosen == target]
        placements = sorted({site.placement for site in chosen_by})
        own = [target.placement] if target.placement else []
        # a helper's inputs bound as the lint reads them at the call (log-probs over the vocabulary), not by name
        roles = {name: role for site in chosen_by if not site.inline
                 for name, role in site.inputs_of(_helper_of(target))}
        reports[target] = audit(target, own if target in whole or target.placement else placements, roles)
    verdicts = []
    for site in sites:
        lint_rules = tuple(dict.fromkeys(site.rules))
        if site in missing:
            verdicts.append(Verdict(site, "-", lint_rules, audited_part(site), (), (), (), False, missing[site],
                                    audited=False))
            continue
        target = targets[site]
        # the audited code weights it by the score: as a loss, or as each token's own advantage
        scored = target.placement == "loss" and site.placement == "reward" or target.placement == "advantage"
        expected = audited_part(site, whole=target in whole and target.source is None, scored=scored,
                                clamped=None if site.inline else site.clamped_in(_helper_of(target)))
        report = reports[target]
        rows = [row for row in report.results if (target in whole or row.placement == (target.placement or site.placement))
                and selects(_labels(site, target), row.mode, report.results)]
        modes = tuple(_mode(row) for row in rows)
        found = tuple(sorted({row.rule for row in rows if row.rule}))
        objectives = tuple(sorted({row.objective for row in rows}))
        skipped = [note for note in report.notes if note.startswith("skipped: ")]
        if report.errors or not rows:
            reason = "; ".join(report.errors) or (  # values it cannot run here (an input only they read)
                f"check-grad skipped switch values: {skipped[0][len('skipped: '):]}" if skipped else
                f"check-grad has no {site.placement} row for these switch values")
            verdicts.append(Verdict(site, str(target), lint_rules, expected, modes, objectives, found, False, reason,
                                    audited=not report.errors and not skipped))
            continue
        wrong = [row for row in rows if _rules(row) != set(expected[:1]) or row.unbiased != (not expected)]
        reason = "; ".join(f"{_mode(row)}: check-grad {row.rule or 'no rule'} ({row.configuration})" for row in wrong)
        verdicts.append(Verdict(site, str(target), lint_rules, expected, modes, objectives, found, not wrong, reason))
    return verdicts + _unjudged(targets, reports, whole)


def _unjudged(targets: dict[KLSite, Target], reports: dict[Target, Report], whole: set[Target]) -> list[Verdict]:
    """check-grad's rows, in a placement the lint reads for that target, that no lint branch selects: the
    switch values where the lint gives no verdict. They agree when check-grad finds the row unbiased. A
    row at values outside the names a registry runs every caller under is unreachable, not shown."""
    verdicts = []
    for target, report in reports.items():
        sites = [site for site, chosen in targets.items() if chosen == target]
        for row in report.results:
            placed = [site for site in sites if target in whole or (target.placement or site.placement) == row.placement]
            if not placed or any(selects(_labels(site, target), row.mode, report.results) for site in placed):
                continue
            if all(site.admits and not site.admits.intersection(map(str, row.mode.values())) for site in placed):
                continue  # a value no caller's registry runs it under (verl's distillation loss: no '+')
            if all(_passes_other(site, target, row.mode) for site in placed):
                continue  # a value no call passes (every caller fixes kl_penalty="k3")
            site = dataclasses.replace(placed[0], labels=(), rules=())
            verdicts.append(Verdict(site, str(target), (), (), (_mode(row),), (row.objective,),
                                    (row.rule,) if row.rule else (), row.unbiased,
                                    "" if row.unbiased else f"the lint gives no verdict for {_mode(row)}; check-grad: "
                                    f"{row.objective}, {row.rule or 'biased'} ({row.configuration})"))
    return verdicts


def _helper_of(target: Target) -> tuple[str, str]:
    """The (path, qualified name) a target names, as KLSite keys its helpers."""
    return target.path or "", target.qualname or ""


def _labels(site: KLSite, target: Target) -> tuple:
    """The switch values that select the branch of `site` in `target`'s rows: its labels, and where `target` is a
    helper the term passes through, the literals its call passes it (`KLSite.passed_to`)."""
    return site.labels + site.passed_to(_helper_of(target))


def _passes_other(site: KLSite, target: Target, mode: dict) -> bool:
    """Whether the call of `site`'s helper `target` fixes one of `mode`'s switches to literals other than its value."""
    fixed = dict(site.passed_to(_helper_of(target)))
    return any(key in fixed and str(value) not in fixed[key] for key, value in mode.items())


def _rules(row: ResultRow) -> set[str]:
    return {row.rule} if row.rule else set()


def _mode(row: ResultRow) -> str:
    return ", ".join(f"{key}={value}" for key, value in row.mode.items()) or "-"


def selects(labels: tuple, mode: dict, rows: Sequence[ResultRow]) -> bool:
    """Whether the switch values of a lint branch (`labels`: ((name, values), ...)) select check-grad's
    `mode`. A mode key is matched with the labels of the same name, or, where the lint names the switch
    as the caller or the helper spells it (`kl_penalty=config.kl_loss_type`, `alpha` for `distillation_alpha`),
    with the labels of other names whose values are all values check-grad audits for that key. A value set
    is literals or endswith/startswith patterns (klaudit.lint.facts.takes); a numeric comparison's label
    (`alpha == 1`, True or False) selects the values equal to the number or not, for the key of its name or of a
    name that holds it (`alpha`, `distillation_alpha`; not `temperature == 1` for an audited alpha of 1). A key
    no label names is not decided by the branch: every value is selected."""
    for key, value in mode.items():
        audited = {row.mode.get(key) for row in rows}
        named = [values for name, values in labels if name == key]
        if not named and isinstance(value, str):  # a string switch renamed between the caller and the helper
            named = [values for name, values in labels if name not in mode and _literals(values)
                     and all(isinstance(v, str) for v in _literals(values)) and set(_literals(values)) <= audited]
        if not all(takes(value, values) for values in named):
            return False
        for name, values in labels:
            compared = numeric_comparison(name)
            if compared is None or isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
                continue
            switch, number = compared
            renamed = switch not in mode and (switch in key or key in switch) and number in audited
            if (switch == key or renamed) and (value == number) != values[0]:
                return False
    return True


def _literals(values: tuple) -> list:
    return [value for value in values if is_literal(value)]


def shown(path: str, root: str | Path) -> str:
    """`path` relative to `root` where it is below it."""
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return path
