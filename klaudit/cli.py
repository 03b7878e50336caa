"""Command-line interface: argument parsing and exit codes only.

Exit codes follow the linter convention: 0 clean, 1 findings (or a biased gradient),
2 usage, configuration or internal error.
"""

import os
import sys
from typing import Any, NoReturn

import click

from klaudit import __version__
from klaudit.audit import PLACEMENTS, Role
from klaudit.config import INFORMATIONAL_CODES, ConfigError, load_settings, parse_switch
from klaudit.describe import LEGEND, OBJECTIVES, explain
from klaudit.lint.engine import DEFAULT_JOBS, LintError, lint_paths
from klaudit.lint.fixing import applicabilities, fix_findings
from klaudit.lint.formats import FORMATTERS
from klaudit.lint.report import ReportOptions, format_statistics, format_statistics_json
from klaudit.lint.rulebook import rule_page
from klaudit.lint.sources import decode_source
from klaudit.progress import Progress
from klaudit.rules import RULES

STDIN = "-"

_as_program = False  # run as the program itself: its arguments read from sys.argv (see _Program)


class _Program(click.Group):
    """The command group. Run as the program itself (its arguments read from sys.argv, not handed over
    by a test's CliRunner, which always passes them), `lint` ends the process at once (`_end`)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        global _as_program
        _as_program = (args[0] if args else kwargs.get("args")) is None
        return super().main(*args, **kwargs)


def _end(code: int) -> NoReturn:
    """Exit with `code` once a lint has printed its report. As the program itself, at once, after
    flushing the output (os._exit, as mypy ends its runs): the interpreter's own exit makes a last pass
    of the garbage collector over the syntax trees and frees them object by object, 1.3 to 1.9 s of a
    one-process lint of TRL, while the operating system takes the memory back at once. Elsewhere (a
    test's CliRunner) as usual."""
    if _as_program:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@click.group(cls=_Program, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="klaudit")
def main() -> None:
    """Find and explain wrong KL-divergence gradients in RL code for language models."""


class CommandError(click.ClickException):
    """A one-line error (bad configuration, unknown rule code, bad path); exit code 2."""

    exit_code = 2


COLORED_FORMATS = ("text", "full", "concise", "grouped")  # the formats for people; tools read the others


def _decoded(data: bytes) -> str:
    """Stdin's bytes as the code frames show them: as Python decodes them, else as UTF-8."""
    text = decode_source(STDIN, data)
    return text if isinstance(text, str) else data.decode("utf-8", errors="replace")


def _split_codes(values: tuple[str, ...]) -> list[str]:
    """`--select KL001,KL002 --select KL005` -> ["KL001", "KL002", "KL005"]."""
    return [code.strip() for value in values for code in value.split(",") if code.strip()]


def _pins(switches: tuple[str, ...]) -> dict:
    """`--switch a=k1 --switch a=kl --switch b=true` -> {"a": ("k1", "kl"), "b": (True,)}."""
    pins: dict = {}
    for text in switches:
        name, value = parse_switch(text)
        pins.setdefault(name, ())
        pins[name] += (value,)
    return pins


def _use_color() -> bool:
    """Colour on a terminal; never when NO_COLOR is set (https://no-color.org), always when
    FORCE_COLOR is (https://force-color.org; NO_COLOR wins when both are, as in CPython), never
    on TERM=dumb."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return os.environ.get("TERM") != "dumb" and sys.stdout.isatty()


@main.command("lint", short_help="Find KL terms whose gradient is not the one you meant.")
@click.argument("paths", nargs=-1, type=click.Path(allow_dash=True))
@click.option("--select", multiple=True, metavar="CODES",
              help="Rule codes or prefixes to enable (comma-separated; ALL for every rule).")
@click.option("--extend-select", multiple=True, metavar="CODES", help="Enable these on top of the selection.")
@click.option("--ignore", multiple=True, metavar="CODES", help="Rule codes or prefixes to disable.")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Replace the excluded paths (default: .git, venvs, build, unsloth_compiled_cache ...).")
@click.option("--extend-exclude", multiple=True, metavar="GLOB", help="Exclude these paths too.")
@click.option("--output-format", "--format", "output_format", default="text", show_default=True,
              type=click.Choice(list(FORMATTERS)),
              help="How to print the findings: for people (text, or full as ruff calls it; concise, grouped), tools "
                   "(json), GitHub Actions annotations (github), GitLab code quality (gitlab), JUnit XML test "
                   "reports (junit) or code scanning (sarif).")
@click.option("--statistics", is_flag=True, help="Print the number of findings per code instead of the findings.")
@click.option("--stdin-filename", metavar="PATH",
              help="With `-` as the path: the name the source read from stdin is reported and configured as.")
@click.option("--respect-gitignore/--no-respect-gitignore", default=True, show_default=True,
              help="Inside a git work tree, skip the files git ignores (named files are always linted).")
@click.option("--fix", is_flag=True, help="Apply the safe fixes (and the unsafe ones with --unsafe-fixes), then report "
                                         "what remains.")
@click.option("--unsafe-fixes", is_flag=True,
              help="Also apply (or show, with --diff) the fixes that change what is optimised: every KL fix does.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff instead of writing them; exit 1 if "
                                          "anything would change.")
@click.option("--exit-zero", is_flag=True, help="Exit with 0 even when there are findings.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the `path:line:col: CODE message` lines.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, show_default=True,
              help="Worker processes for parsing and analysis.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), metavar="PYPROJECT",
              help="Read [tool.klaudit] from this file instead of the nearest pyproject.toml.")
@click.option("--switch", "switch", multiple=True, metavar="NAME=VALUE",
              help="Judge only the code paths this switch value selects (repeatable), as `switches` in [tool.klaudit].")
@click.option("--analysis-budget", type=click.IntRange(min=0), metavar="UNITS",
              help="Work units the analysis of one file may spend (0: no limit); past it, KL099.")
@click.option("--analysis-timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Seconds the analysis of one file may take (0: no limit); past it, KL099.")
def lint_command(paths: tuple[str, ...], select: tuple[str, ...], extend_select: tuple[str, ...],
                 ignore: tuple[str, ...], exclude: tuple[str, ...], extend_exclude: tuple[str, ...],
                 output_format: str, statistics: bool, stdin_filename: str | None, respect_gitignore: bool,
                 fix: bool, unsafe_fixes: bool, diff: bool, exit_zero: bool, quiet: bool, jobs: int,
                 config_file: str | None, switch: tuple[str, ...],
                 analysis_budget: int | None, analysis_timeout: float | None) -> None:
    """Find KL terms whose gradient is not the one you meant, in PATHS (default: .; `-`: the source
    on stdin, named by --stdin-filename).

    KL099 (part of a file was not analysed) is informational: it never changes the exit status.
    """
    paths = paths or (".",)
    from_stdin = STDIN in paths
    if from_stdin and len(paths) > 1:
        raise CommandError("`-` (read the source from stdin) must be the only path")
    if stdin_filename is not None and not from_stdin:
        raise CommandError("--stdin-filename needs `-` as the path")
    reported_as = stdin_filename or STDIN
    source = sys.stdin.buffer.read() if from_stdin else b""
    try:
        settings = load_settings([reported_as] if from_stdin else paths, config_file).with_overrides(
            select=_split_codes(select) if select else None,
            extend_select=_split_codes(extend_select),
            ignore=_split_codes(ignore),
            exclude=list(exclude) if exclude else None,
            extend_exclude=list(extend_exclude),
            analysis_budget=analysis_budget,
            analysis_timeout=analysis_timeout,
            switches=_pins(switch),
        )
        targets = [reported_as] if from_stdin else list(paths)

        show_progress = output_format in COLORED_FORMATS and not from_stdin and sys.stderr.isatty()

        def lint(stdin: bytes | None = source if from_stdin else None):
            with Progress(show_progress, "linting") as progress:
                return lint_paths(targets, settings=settings, jobs=jobs, respect_gitignore=respect_gitignore,
                                  stdin=stdin, progress=progress)

        result = lint()
        if fix or diff:
            fixes = fix_findings(result.findings, applicabilities(unsafe_fixes), write=fix and not diff,
                                 sources={reported_as: source} if from_stdin else None)
            for finding, why in fixes.dropped:
                click.echo(f"warning: {finding.path}:{finding.line}: {finding.code}: fix not applied: {why}", err=True)
            if diff:
                click.echo("".join(fixes.diffs), nl=False)
                click.echo(f"Would fix {len(fixes.fixed)} error{'s' if len(fixes.fixed) != 1 else ''}.", err=True)
                sys.exit(1 if fixes.diffs else 0)
            if from_stdin:  # as ruff: the fixed source on stdout, the report on stderr
                fixed_text = fixes.texts.get(reported_as, _decoded(source))
                click.echo(fixed_text, nl=False)
                source = fixed_text.encode("utf-8")
            result = lint(source if from_stdin else None) if fixes.fixed else result
            if fixes.fixed:
                click.echo(f"Fixed {len(fixes.fixed)} error{'s' if len(fixes.fixed) != 1 else ''}.", err=True)
    except (ConfigError, LintError) as error:
        raise CommandError(str(error)) from None
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)  # 128 + SIGINT, as shells and ruff report an interrupted run
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    in_memory = {reported_as: _decoded(source)} if from_stdin else {}
    options = ReportOptions(color=_use_color() and output_format in COLORED_FORMATS, quiet=quiet,
                            sources=in_memory)
    if statistics:
        tabulate = format_statistics_json if output_format == "json" else format_statistics
        output = tabulate(result.findings, options)
    else:
        output = FORMATTERS[output_format](result.findings, options)
    if output:
        click.echo(output, color=options.color, err=from_stdin and fix)
    for message in result.errors:
        click.echo(f"error: {message}", err=True)
    if result.errors:
        _end(2)
    failing = [finding for finding in result.findings if finding.code not in INFORMATIONAL_CODES]
    _end(1 if failing and not exit_zero else 0)


_OBJECTIVES_HELP = f"The objectives check-grad names ({', '.join(OBJECTIVES)}) and 'cos REV': klaudit explain NAME."


@main.command("rule", epilog=_OBJECTIVES_HELP, short_help="Print the page of one rule, by code or name.")
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
    click.echo(rule_page(wanted).rstrip("\n"))


@main.command("explain", short_help="Say what an objective name such as REV or FWD means.")
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


@main.command("rules", epilog=_OBJECTIVES_HELP, short_help="List every rule: code, name and summary.")
def rules_command() -> None:
    """List every rule: code, name and one-line summary."""
    width = max(len(rule.name) for rule in RULES.values())
    for rule in RULES.values():
        click.echo(f"{rule.code}  {rule.name:<{width}}  {rule.summary}")


class SampleCount(click.ParamType):
    """--samples: a number of responses (at least 4) or 'auto'."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        try:
            count = int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a number of samples nor 'auto'", param, ctx)
        if count < 4:
            self.fail(f"{count} is too few: the Monte-Carlo audit needs at least 4 samples", param, ctx)
        return count


@main.command("check-grad", short_help="Measure the gradient your KL code really produces.")
@click.argument("targets", nargs=-1, required=True)
@click.option("--bind", "bindings", multiple=True, metavar="PARAM=ROLE",
              help=f"Say what a parameter receives: {', '.join(role.value for role in Role)}.")
@click.option("--placement", type=click.Choice(list(PLACEMENTS)), default="auto", show_default=True,
              help="Audit the result as a differentiated loss, a detached reward (reward-to-go), both, "
                   "the two combined (loss+reward; loss+future: future-only returns), or each token's own "
                   "detached value as its advantage (advantage: no reward-to-go).")
@click.option("--output-format", "--format", "output_format", type=click.Choice(["text", "json"]),
              default="text", show_default=True, help="How to print the report.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True,
              help="Seconds allowed for each target's audit (it runs in a child process).")
@click.option("--memory-limit", type=click.IntRange(min=0), metavar="MIB",
              help="Memory each target's audit may allocate, in MiB (default: half the physical memory; 0: no "
                   "limit).")
@click.option("--model", "model_dir", type=click.Path(exists=True, file_okay=False), metavar="DIR",
              help="Fingerprint on a causal LM from this local directory instead of the tabular policy.")
@click.option("--device", default="cpu", show_default=True,
              help="Torch device the audit runs on (cpu, cuda, cuda:1 ...): the enumerated policies, the fingerprint "
                   "batch and --model.")
@click.option("--samples", type=SampleCount(), metavar="N|auto",
              help="With --model: the Monte-Carlo audit on responses of the model, for models and lengths that "
                   "cannot be enumerated; 'auto' lets a pilot choose how many (enough to detect a bias of 5% of "
                   "|REV|, 1000 to 4000 on a CPU, 16000 on a GPU).")
@click.option("--plot", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="With --samples: draw your term's per-position gradient against the reference's (matplotlib).")
@click.option("--fail-on", type=click.Choice(["any", "used"]), default="any", show_default=True,
              help="Exit 1 when any audited row is biased, or only when a row of a placement your code uses "
                   "is (rows of targets whose use is unknown all count).")
@click.option("-v", "--verbose", is_flag=True, help="Show the traceback behind each error.")
def check_grad_command(targets: tuple[str, ...], bindings: tuple[str, ...], placement: str, output_format: str,
                       timeout: float, memory_limit: int | None, model_dir: str | None, device: str,
                       samples: int | str | None, plot: str | None, fail_on: str, verbose: bool) -> None:
    """Measure the gradient your KL code really produces: TARGETS are PATH.py, PATH.py::function,
    PATH.py::Class.method or package.module:function."""
    from klaudit.audit import TORCH_MISSING, torch_importable
    from klaudit.audit.bind import BindError, parse_overrides
    from klaudit.audit.runner import MonteCarlo, run

    if not torch_importable():
        raise CommandError(TORCH_MISSING)
    try:
        overrides = parse_overrides(bindings)
    except BindError as error:
        raise CommandError(str(error)) from None
    if samples is not None and model_dir is None:
        raise CommandError("--samples needs --model DIR: the Monte-Carlo audit samples that model's responses")
    if plot is not None:
        from klaudit.audit.picture import MATPLOTLIB_MISSING, matplotlib_importable

        if samples is None:
            raise CommandError("--plot needs --samples N (the picture is drawn from the Monte-Carlo samples)")
        if not matplotlib_importable():
            raise CommandError(MATPLOTLIB_MISSING)
    monte_carlo = (MonteCarlo(samples if isinstance(samples, int) else None, plot and os.path.abspath(plot))
                   if samples is not None else None)
    placements = PLACEMENTS[placement]
    show_progress = output_format == "text" and sys.stderr.isatty()
    report = run(targets, overrides=overrides, placements=placements, timeout=timeout, memory_limit=memory_limit,
                 model_dir=model_dir, device=device, show_progress=show_progress, monte_carlo=monte_carlo)
    click.echo(report.to_json() if output_format == "json" else report.to_text())
    if verbose:
        for detail in report.details:
            click.echo(detail.rstrip("\n"), err=True)
    if output_format == "json":
        for message in report.errors:
            click.echo(f"error: {message}", err=True)
    sys.exit(report.exit_code_for(used_only=fail_on == "used"))
