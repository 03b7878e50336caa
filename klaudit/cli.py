"""Command-line interface: argument parsing and exit codes only.

Exit codes follow the linter convention: 0 clean, 1 findings (or a biased gradient),
2 usage, configuration or internal error.
"""

import click

from klaudit import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="klaudit")
def main() -> None:
    """Find and explain wrong KL-divergence gradients in RL code for language models."""
