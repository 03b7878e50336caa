"""Which KL estimators a project's verl runs select: the values its configurations give `kl_penalty` and `kl_loss_type`.

A trainer built on verl (a subclass or edited copy of its RayPPOTrainer, an actor of its own) hands the estimator's
name to verl's `kl_penalty` function from its configuration: `kl_penalty=self.config.algorithm.kl_penalty` for the KL
in the reward, `self.config.kl_loss_type` for the KL loss. The lint follows each branch of that switch, and a verdict
that holds only where it names `abs` says nothing about a project whose every launch leaves it at `kl`. So, as
`[tool.klaudit] switches` would pin them, the values are read from everything in the project that may set them:
Hydra overrides (`algorithm.kl_penalty=k3`, in scripts, YAML `run:` blocks and Python argument lists), YAML keys,
`--kl_penalty` options and `config.kl_penalty = ...` written to a configuration object; verl's default (`kl` for the
reward, `low_var_kl` for the loss) always counts, since a launch may leave the key out. A computed value (`$KL`) keeps
every verdict, and so does a project with no verl launch or configuration among the linted files, or one that carries
a copy of verl (a fork, whose recipes every user of it configures).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

from klaudit.frameworks import trl_runs, verl

# the switch (as the lint labels it: the configuration attribute read) -> verl's default
KEYS = {verl.KL_PENALTY.rsplit(".", 1)[-1]: verl.DEFAULTS[verl.KL_PENALTY],
        verl.KL_LOSS_TYPE.rsplit(".", 1)[-1]: verl.DEFAULTS[verl.KL_LOSS_TYPE]}

# a launch of one of verl's modules (a script's `python -m verl.trainer.main_ppo`, a Python argument list's
# "verl.trainer.main_ppo"), or, in a script or YAML file, one of the flags that turn its KL on; a trainer's own
# `self.config.algorithm.use_kl_in_reward` is no run
_LAUNCH = re.compile(r"-m\s+verl\.|[\"']verl\.trainer\.main_\w+[\"']")
_FLAGS = re.compile(r"\b(?:use_kl_in_reward|use_kl_loss)\b")


# code built on the installed verl imports it (a self-contained copy of its trainer's code, like a fork, is
# configured by every user of it)
IMPORTS_VERL = re.compile(r"^[ \t]*(?:from[ \t]+verl[ \t.]|import[ \t]+verl\b)", re.MULTILINE)


def _overrides(key: str) -> re.Pattern:
    """A Hydra override of `key` under any section: `algorithm.kl_penalty=k3`, `+actor.kl_loss_type="k1"`."""
    return re.compile(rf"(?<![\w.])\+{{0,2}}(?:\w+\.)+{key}=([^\s,)\]\\]*)")


def written_values(text: str, key: str, *, yaml: bool = False) -> Iterator[str | None]:
    """The values of `key` that `text` writes (None where computed): a Hydra override, besides what
    `trl_runs.written_values` reads (an option, a YAML key where `yaml`, a configuration's attribute)."""
    yield from trl_runs.written_values(text, key, yaml=yaml)
    for match in _overrides(key).finditer(text):
        written = match.group(1).strip("\"'")
        yield written if re.fullmatch(r"[\w.+-]+", written) else None


def selected(code: Iterable[str], configs: Iterable[tuple[str, bool]]) -> Mapping[str, tuple[str, ...]] | None:
    """The values each switch of KEYS may take in the project's runs, from the texts of its Python modules `code` and
    of its launch scripts and YAML files `configs` (each with whether it is YAML), as `[tool.klaudit] switches` pins
    them: a key with a computed value is left out (any value holds); None where nothing launches or configures verl."""
    values: dict[str, set[str | None]] = {key: {default} for key, default in KEYS.items()}
    runs = False
    for text, yaml, python in [(text, False, True) for text in code] + [(t, y, False) for t, y in configs]:
        if not any(key in text for key in KEYS) and "verl" not in text:
            continue
        runs = runs or _LAUNCH.search(text) is not None or not python and _FLAGS.search(text) is not None
        for key in KEYS:
            values[key].update(written_values(text, key, yaml=yaml))
    if not runs:
        return None
    return {key: tuple(sorted(str(v) for v in found)) for key, found in values.items() if None not in found}
