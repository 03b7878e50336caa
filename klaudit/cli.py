"""Command-line interface: argument parsing and exit codes only.

Exit codes follow the linter convention: 0 clean, 1 findings (or a biased gradient),
2 usage, configuration or internal error.
"""

import os
import sys
from importlib import resources
from typing import Optional

import click

from klaudit import __version__
from klaudit.audit import PLACEMENTS
from klaudit.audit.bind import Role
from klaudit.catalog import RULES
from klaudit.config import INFORMATIONAL_CODES, ConfigError, load_settings
from klaudit.describe import LEGEND, OBJECTIVES, explain
from klaudit.lint.engine import DEFAULT_JOBS, LintError, lint_paths
from klaudit.lint.report import FORMATTERS, ReportOptions


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="klaudit")
def main() -> None:
    """Find and explain wrong KL-divergence gradients in RL code for language models."""


class CommandError(click.ClickException):
    """A one-line error (bad configuration, unknown rule code, bad path); exit code 2."""

    exit_code = 2


def _split_codes(values: tuple[str, ...]) -> list[str]:
    """`--select KL001,KL002 --select KL005` -> ["KL001", "KL002", "KL005"]."""
    return [code.strip() for value in values for code in value.split(",") if code.strip()]


def _use_color() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


@main.command("lint")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--select", multiple=True, metavar="CODES",
              help="Rule codes or prefixes to enable (comma-separated; ALL for every rule).")
@click.option("--extend-select", multiple=True, metavar="CODES", help="Enable these on top of the selection.")
@click.option("--ignore", multiple=True, metavar="CODES", help="Rule codes or prefixes to disable.")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Replace the excluded paths (default: .git, venvs, build ...).")
@click.option("--extend-exclude", multiple=True, metavar="GLOB", help="Exclude these paths too.")
@click.option("--output-format", "--format", "output_format", default="text", show_default=True,
              type=click.Choice(sorted(FORMATTERS)), help="How to print the findings.")
@click.option("--exit-zero", is_flag=True, help="Exit with 0 even when there are findings.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the `path:line:col: CODE message` lines.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, show_default=True,
              help="Worker processes for parsing and analysis.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), metavar="PYPROJECT",
              help="Read [tool.klaudit] from this file instead of the nearest pyproject.toml.")
@click.option("--analysis-budget", type=click.IntRange(min=0), metavar="UNITS",
              help="Work units the analysis of one file may spend (0: no limit); past it, KL099.")
@click.option("--analysis-timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Seconds the analysis of one file may take (0: no limit); past it, KL099.")
def lint_command(paths: tuple[str, ...], select: tuple[str, ...], extend_select: tuple[str, ...],
                 ignore: tuple[str, ...], exclude: tuple[str, ...], extend_exclude: tuple[str, ...],
                 output_format: str, exit_zero: bool, quiet: bool, jobs: int,
                 config_file: Optional[str], analysis_budget: Optional[int],
                 analysis_timeout: Optional[float]) -> None:
    """Find KL terms whose gradient is not the one you meant, in PATHS (default: .).

    KL099 (part of a file was not analysed) is informational: it never changes the exit status.
    """
    paths = paths or (".",)
    try:
        settings = load_settings(paths, config_file).with_overrides(
            select=_split_codes(select) if select else None,
            extend_select=_split_codes(extend_select),
            ignore=_split_codes(ignore),
            exclude=list(exclude) if exclude else None,
            extend_exclude=list(extend_exclude),
            analysis_budget=analysis_budget,
            analysis_timeout=analysis_timeout,
        )
        result = lint_paths(paths, settings=settings, jobs=jobs)
    except (ConfigError, LintError) as error:
        raise CommandError(str(error)) from None
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)  # 128 + SIGINT, as shells and ruff report an interrupted run
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    options = ReportOptions(color=_use_color(), quiet=quiet)
    output = FORMATTERS[output_format](result.findings, options)
    if output:
        click.echo(output, color=options.color)
    for error in result.errors:
        click.echo(f"error: {error}", err=True)
    if result.errors:
        sys.exit(2)
    failing = [finding for finding in result.findings if finding.code not in INFORMATIONAL_CODES]
    sys.exit(1 if failing and not exit_zero else 0)


def _rule_page(code: str) -> str:
    """The rule's page shipped in the package, or a short page built from its catalog entry."""
    page = resources.files("klaudit").joinpath("rules", f"{code}.md")
    if page.is_file():
        return page.read_text(encoding="utf-8")
    rule = RULES[code]
    return f"# {rule.code} {rule.name}\n\n{rule.summary}\n"


_OBJECTIVES_HELP = f"The objectives check-grad names ({', '.join(OBJECTIVES)}) and 'cos REV': klaudit explain NAME."


@main.command("rule", epilog=_OBJECTIVES_HELP)
@click.argument("code")
def rule_command(code: str) -> None:
    """Print the page of one rule (by code, e.g. KL002, or by name)."""
    by_name = {rule.name: rule.code for rule in RULES.values()}
    wanted = by_name.get(code.lower(), code.upper())
    if wanted not in RULES:
        meaning = explain(code)
        if meaning is not None:
            click.echo(meaning)
            return
        raise CommandError(f"unknown rule {code!r}; known codes: {', '.join(RULES)} (objectives: klaudit explain)")
    click.echo(_rule_page(wanted).rstrip("\n"))


@main.command("explain")
@click.argument("name", nargs=-1)
def explain_command(name: tuple[str, ...]) -> None:
    """What an objective name (REV, FWD, PART, PFWD, FUT, ZERO, LEN, OTHER) or 'cos REV' means; all of
    them without NAME."""
    if not name:
        for key in LEGEND:
            click.echo(explain(key))
        return
    meaning = explain(" ".join(name))
    if meaning is None:
        raise CommandError(f"unknown name {' '.join(name)!r}; known: {', '.join(LEGEND)}")
    click.echo(meaning)


@main.command("rules", epilog=_OBJECTIVES_HELP)
def rules_command() -> None:
    """List every rule: code, name and one-line summary."""
    width = max(len(rule.name) for rule in RULES.values())
    for rule in RULES.values():
        click.echo(f"{rule.code}  {rule.name:<{width}}  {rule.summary}")


@main.command("check-grad")
@click.argument("targets", nargs=-1, required=True)
@click.option("--bind", "bindings", multiple=True, metavar="PARAM=ROLE",
              help=f"Say what a parameter receives: {', '.join(role.value for role in Role)}.")
@click.option("--placement", type=click.Choice(list(PLACEMENTS)), default="auto", show_default=True,
              help="Audit the result as a differentiated loss, a detached reward (reward-to-go), both, or "
                   "the two combined (loss+reward; loss+future: future-only returns).")
@click.option("--output-format", "--format", "output_format", type=click.Choice(["text", "json"]),
              default="text", show_default=True, help="How to print the report.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              help="Seconds allowed for each target's audit (it runs in a child process).")
@click.option("--memory-limit", type=click.IntRange(min=0), metavar="MIB",
              help="Memory each target's audit may allocate, in MiB (default: half the physical memory; 0: no "
                   "limit).")
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="Fingerprint on a causal LM from this local directory instead of the tabular policy.")
@click.option("--device", default="cpu", show_default=True, help="Torch device of the fingerprint batch.")
@click.option("--fail-on", type=click.Choice(["any", "used"]), default="any", show_default=True,
              help="Exit 1 when any audited row is biased, or only when a row of a placement your code uses "
                   "is (rows of targets whose use is unknown all count).")
@click.option("-v", "--verbose", is_flag=True, help="Show the traceback behind each error.")
def check_grad_command(targets: tuple[str, ...], bindings: tuple[str, ...], placement: str, output_format: str,
                       timeout: float, memory_limit: Optional[int], model_dir: Optional[str], device: str,
                       fail_on: str, verbose: bool) -> None:
    """Measure the gradient your KL code really produces: TARGETS are PATH.py, PATH.py::function,
    PATH.py::Class.method or package.module:function."""
    from klaudit.audit import TORCH_MISSING, torch_importable
    from klaudit.audit.bind import BindError, parse_overrides
    from klaudit.audit.runner import run

    if not torch_importable():
        raise CommandError(TORCH_MISSING)
    try:
        overrides = parse_overrides(bindings)
    except BindError as error:
        raise CommandError(str(error)) from None
    placements = PLACEMENTS[placement]
    show_progress = output_format == "text" and sys.stderr.isatty()
    report = run(targets, overrides=overrides, placements=placements, timeout=timeout, memory_limit=memory_limit,
                 model_dir=model_dir, device=device, show_progress=show_progress)
    click.echo(report.to_json() if output_format == "json" else report.to_text())
    if verbose:
        for detail in report.details:
            click.echo(detail.rstrip("\n"), err=True)
    if output_format == "json":
        for error in report.errors:
            click.echo(f"error: {error}", err=True)
    sys.exit(report.exit_code_for(used_only=fail_on == "used"))
