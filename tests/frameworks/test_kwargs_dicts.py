"""A configuration's keywords taken from a dict the code builds before the call (klaudit.frameworks.kwargs_dicts).

KG_GRPO (twelfth fresh set) builds `grpo_kwargs = {..., "beta": config.beta}`, updates it with another dict
holding `num_iterations` and `loss_type`, and calls `GRPOConfig(**grpo_kwargs)`: with the dataclass
defaults beta 0.02, num_iterations 2 and TRL 1.16's bias correction that is ratio*k3 as a loss (row 2,
KL003) on reused samples with token ratios only (row 23, KL008), reported at the dict's entries.
"""

from __future__ import annotations

import textwrap

import pytest

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

KG_GRPO = '''\
from dataclasses import dataclass
from trl import GRPOConfig


@dataclass
class TrainingConfig:
    beta: float = 0.02
    num_iterations: int = 2
    use_vllm: bool = False


def build(config: TrainingConfig, output_dir: str) -> GRPOConfig:
    grpo_kwargs = {
        "output_dir": output_dir,
        "beta": config.beta,
    }
    optional = {"num_iterations": config.num_iterations}
    grpo_kwargs.update(optional)
    if config.use_vllm:
        grpo_kwargs["use_vllm"] = True
    if grpo_kwargs.get("use_vllm", False):
        grpo_kwargs["generation_kwargs"] = {"a": 1}
    else:
        grpo_kwargs["generation_kwargs"] = {"b": 1}
    try:
        return GRPOConfig(**grpo_kwargs)
    except TypeError:
        grpo_kwargs.pop("num_iterations", None)
        return GRPOConfig(**grpo_kwargs)
'''


def _found(tmp_path, source):
    (tmp_path / "train.py").write_text(source)
    return [(f.line, f.code) for f in lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1).findings]


def test_a_dict_built_with_updates_and_item_stores_gives_the_keywords(tmp_path):
    # the second call, after the pop in the except clause, takes a dict that is no longer known: no report
    assert _found(tmp_path, KG_GRPO) == [(15, "KL003"), (17, "KL008")]


@pytest.mark.parametrize("change", [
    '    grpo_kwargs.pop("beta")\n',  # removed before the call
    "    log(grpo_kwargs)\n",  # handed to a function, which may change it
    "    grpo_kwargs |= other\n",
    '    del grpo_kwargs["beta"]\n',
    "    grpo_kwargs = dict(other)\n",  # bound again to what is not read
])
def test_a_dict_changed_in_a_way_not_read_is_unknown(tmp_path, change):
    source = KG_GRPO.replace("    try:\n", change + "    try:\n", 1)
    assert _found(tmp_path, source) == []


def test_a_key_set_twice_is_unknown_and_the_others_stay_known(tmp_path):
    source = textwrap.dedent('''\
        from trl import GRPOConfig


        def build(fast):
            kwargs = dict(num_iterations=1)
            if fast:
                kwargs["beta"] = 0.0
            else:
                kwargs["beta"] = 0.1
            kwargs["loss_type"] = "grpo"
            return GRPOConfig(**kwargs)
        ''')
    assert _found(tmp_path, source) == []  # beta, 0.0 or 0.1, decides whether there is a KL at all
    once = source.replace('        kwargs["beta"] = 0.0\n', "        pass\n")
    assert _found(tmp_path, once) == [(9, "KL003"), (10, "KL007")]  # the loss_type entry carries KL007


def test_a_module_level_dict(tmp_path):
    source = 'from trl import GRPOConfig\n\nSETTINGS = {"beta": 0.04, "use_bias_correction_kl": False}\n' \
             "config = GRPOConfig(**SETTINGS)\n"
    assert _found(tmp_path, source) == [(3, "KL002")]


# menloresearch/ReZero (ninety-sixth set): `UnslothGRPOConfig(**TRAINING_CONFIG, ...)` with the dict in config.py
@pytest.mark.parametrize(("settings", "change", "expected"), [
    ('{"beta": 0.04, "use_bias_correction_kl": False}', "", [(5, "KL002")]),
    ('{"beta": float(os.environ["BETA"]), "use_bias_correction_kl": False}', "", []),  # a key not literal: unknown
    ('{"beta": 0.04, "use_bias_correction_kl": False}', 'SETTINGS["beta"] = 0.0\n', []),  # changed where imported
    ('dict(beta=0.04, use_bias_correction_kl=False)', "", []),  # not a dict literal
])
def test_a_dict_literal_imported_from_another_module(tmp_path, settings, change, expected):
    (tmp_path / "config.py").write_text(f"import os\n\nSETTINGS = {settings}\n")
    source = f"from trl import GRPOConfig\n\nfrom config import SETTINGS\n{change}\nconfig = GRPOConfig(**SETTINGS)\n"
    assert _found(tmp_path, source) == [(line + bool(change), code) for line, code in expected]


def test_a_dict_chosen_between_two_displays_keeps_the_keys_neither_sets(tmp_path):
    """posix4e/tmuxbench (fifty-first set) spreads `{} if args.no_vllm else {"use_vllm": True, ...}` into its
    GRPOConfig: only the generation keys may come from it, so beta = 0.04 with TRL 1.16's defaults is
    ratio*k3 as a loss (row 2, KL003) at the beta keyword, not a configuration of unknown keys."""
    source = textwrap.dedent('''\
        from trl import GRPOConfig


        def build(no_vllm):
            extra = ({} if no_vllm else
                     {"use_vllm": True, "vllm_mode": "colocate"})
            return GRPOConfig(output_dir="out", beta=0.04, **extra)
        ''')
    assert _found(tmp_path, source) == [(7, "KL003")]
    # a KL key that one side sets and the other leaves out may be either: unknown, as a key set twice is;
    # an unknown loss_type keeps what every loss type gives (row 2), not grpo's 1/L (KL007)
    chosen = source.replace('{"use_vllm": True,', '{"loss_type": "grpo", "use_vllm": True,')
    assert _found(tmp_path, chosen) == [(7, "KL003")]
    same = chosen.replace("({} if no_vllm", '({"loss_type": "grpo"} if no_vllm')
    assert _found(tmp_path, same) == [(5, "KL007"), (7, "KL003")]  # both give grpo's 1/L (row 21), at the first
    both = source.replace("({} if no_vllm", '({"beta": 0.0} if no_vllm').replace('{"use_vllm": True,', '{"beta": 0.0,')
    assert _found(tmp_path, both.replace("beta=0.04, ", "")) == []  # both sides turn the KL off


@pytest.mark.parametrize("spread", [
    '**({"vllm_mode": mode} if use_vllm else {})',
    '**{"vllm_mode": mode}',
    '**dict(vllm_mode=mode)',
])
def test_a_display_spread_in_the_call_gives_only_its_keys(tmp_path, spread):
    """shatianming5/goodhart-cascade (seventy-sixth set) writes `**({"vllm_mode": args.vllm_mode} if args.use_vllm
    else {})` and five more such spreads into its GRPOConfig beside `beta=args.beta`: no KL key comes from them, so
    beta 0.04 with TRL 1.16's defaults is ratio*k3 as a loss (row 2, KL003); a spread that may set beta is unknown."""
    source = textwrap.dedent(f'''\
        from trl import GRPOConfig


        def build(use_vllm, mode):
            return GRPOConfig(output_dir="out", beta=0.04, {spread})
        ''')
    assert _found(tmp_path, source) == [(5, "KL003")]
    assert _found(tmp_path, source.replace("beta=0.04, ", "").replace('"vllm_mode": mode', '"beta": mode')
                  .replace("vllm_mode=mode", "beta=mode")) == []


TWO_DICTS = textwrap.dedent('''\
    from trl import GRPOConfig


    def build(algo, beta):
        shared = dict(output_dir="out", beta=0.04, num_iterations=1)
        extra = {}
        if algo == "dr_grpo":
            extra = {"scale_rewards": False, "loss_type": "dr_grpo"}
        return GRPOConfig(**shared, **extra)
    ''')


def test_two_dicts_unpacked_one_bound_in_a_branch(tmp_path):
    """levi-hsu/text-to-sql (sixty-fifth set) builds `GRPOConfig(**shared_kwargs, **extra_kwargs)`, extra_kwargs
    empty or, for Dr. GRPO, setting loss_type: beta 0.04 over TRL 1.16's defaults is ratio*k3 as a loss (row 2,
    KL003) at beta whichever loss type runs; KL007 (row 21) would need grpo's 1/L, which neither gives."""
    assert _found(tmp_path, TWO_DICTS) == [(5, "KL003")]
    # grpo's 1/L in the branch: the key is either grpo or absent (dapo), so still no KL007
    assert _found(tmp_path, TWO_DICTS.replace('"dr_grpo"}', '"grpo"}')) == [(5, "KL003")]
    # a key both dicts may set is unknown: num_iterations, which decides whether samples are reused
    assert _found(tmp_path, TWO_DICTS.replace('"scale_rewards": False', '"num_iterations": 4')) == []
    # beta 0.0 in the branch: the KL may be off, so nothing is reported
    assert _found(tmp_path, TWO_DICTS.replace('"scale_rewards": False', '"beta": 0.0')) == []
    # a dict bound to what is not a display, or unpacked from an expression, leaves every key unknown
    assert _found(tmp_path, TWO_DICTS.replace("extra = {}", "extra = dict(other)")) == []
    assert _found(tmp_path, TWO_DICTS.replace("**extra)", "**load(extra))")) == []


def test_a_dict_a_helper_of_the_module_returns(tmp_path):
    """tripathysagar/rlhf-gsm8k (sixty-sixth set) spreads `**precision_args` into its GRPOConfig, bound by
    `dtype, precision_args, use_compile = get_dtype_config()`, whose every return gives a dict of bf16 and fp16
    only: beta 0.04 over TRL 1.16's defaults is then ratio*k3 as a loss (row 2, KL003) at beta."""
    source = textwrap.dedent('''\
        from trl import GRPOConfig


        def get_dtype_config(major):
            if major >= 8:
                return "bf16", {"bf16": True, "fp16": False}, True
            return "fp32", {"bf16": False, "fp16": False}, False


        dtype, precision_args, use_compile = get_dtype_config(8)
        config = GRPOConfig(output_dir="out", beta=0.04, **precision_args)
        ''')
    assert _found(tmp_path, source) == [(11, "KL003")]
    # a KL key one return sets to a constant and another to a name of the helper's own: unknown
    keyed = source.replace('{"bf16": True,', '{"beta": 0.0, "bf16": True,').replace(
        '{"bf16": False, "fp16": False}, False', '{"beta": major, "bf16": False}, False')
    assert _found(tmp_path, keyed.replace("beta=0.04, ", "")) == []
    # every return setting the same constant gives it
    same = source.replace('{"bf16": True,', '{"loss_type": "grpo", "bf16": True,').replace(
        '{"bf16": False, "fp16": False}, False', '{"loss_type": "grpo"}, False')
    assert sorted(_found(tmp_path, same)) == [(6, "KL007"), (11, "KL003")]
    # a return that is not a display there (a dict built elsewhere) leaves the mapping unknown
    assert _found(tmp_path, source.replace('return "fp32", {"bf16": False, "fp16": False}, False',
                                           'return "fp32", FALLBACK, False')) == []
    assert _found(tmp_path, source.replace("= get_dtype_config(8)", "= other(8)")) == []


FILTERED = textwrap.dedent('''\
    import dataclasses
    from trl import GRPOConfig


    def build(args):
        desired = dict(output_dir="out", beta=0.04, use_bias_correction_kl=False, dynamic_sampling=True)
        accepted = {f.name for f in dataclasses.fields(GRPOConfig)}
        unknown = sorted(set(desired) - accepted)
        print(f"dropping {unknown}", desired)
        return GRPOConfig(**{k: v for k, v in desired.items() if k in accepted})
    ''')


def test_a_dict_filtered_to_the_fields_the_configuration_takes(tmp_path):
    """CanadaApollo6/gridiron-grpo (sixty-seventh set) drops what the installed GRPOConfig does not take:
    `GRPOConfig(**{k: v for k, v in desired.items() if k in accepted})`, accepted its dataclass fields. A
    release that runs the call takes beta, so beta 0.04 without the bias correction is k3 as a loss (row 3,
    KL002) at the dict's entry; reading the dict with set() and print() leaves it as it is."""
    assert _found(tmp_path, FILTERED) == [(6, "KL002")]
    signature = FILTERED.replace("{f.name for f in dataclasses.fields(GRPOConfig)}",
                                 "set(inspect.signature(GRPOConfig.__init__).parameters)")
    assert _found(tmp_path, signature) == [(6, "KL002")]
    # a filter by any other set may drop beta: not known
    assert _found(tmp_path, FILTERED.replace("dataclasses.fields(GRPOConfig)", "dataclasses.fields(Other)")) == []
    assert _found(tmp_path, FILTERED.replace("if k in accepted})", "if k in accepted and v})")) == []
    assert _found(tmp_path, FILTERED.replace("{k: v for k, v in", "{k: 0 for k, v in")) == []
    # a function that is not known to only read the dict may change it
    assert _found(tmp_path, FILTERED.replace("print(f", "log(f")) == []


# chenkuanchung/ai-rlhf-labs (seventy-seventh set): `GRPO_CONFIG = {..., "beta": 0.01}` at the top of the script,
# spread into GRPOConfig inside main()
SCRIPT_CONSTANT = '''\
from trl import GRPOConfig

GRPO_CONFIG = {
    "output_dir": "out",
    "beta": 0.01,
}


def main():
    {change}
    return GRPOConfig(**GRPO_CONFIG, remove_unused_columns=False)


def log():
    print(GRPO_CONFIG["output_dir"])
'''


@pytest.mark.parametrize("change, expected", [
    ("pass", [(5, "KL003")]),  # the module's dict, as main reads it when it runs
    ('GRPO_CONFIG = {"output_dir": "o"}', []),  # main's own dict, which sets no beta
    ('GRPO_CONFIG["beta"] = 0.0', []),  # changed where main runs: the beta is main's to read, not the display's
    ("global GRPO_CONFIG", []),  # main may rebind it
])
def test_a_module_dict_spread_in_a_function(tmp_path, change, expected):
    assert _found(tmp_path, SCRIPT_CONSTANT.replace("{change}", change)) == expected


def test_a_module_dict_a_function_changes_is_unknown(tmp_path):
    source = SCRIPT_CONSTANT.replace("{change}", "pass") + "\n\ndef tune():\n    GRPO_CONFIG.update(beta=0.1)\n"
    assert _found(tmp_path, source) == []


# boradorish/text-to-json (seventy-ninth set): the keywords go through a helper that keeps those the installed
# GRPOConfig's signature takes, and `max_prompt_length` (refused from TRL 0.28) is among them
FILTERING_HELPER = textwrap.dedent('''\
    import inspect
    from trl import GRPOConfig


    def build(args):
        supported = set(inspect.signature(GRPOConfig.__init__).parameters)

        def _cfg(**kwargs):
            kept = {k: v for k, v in kwargs.items() if k in supported}
            print(set(kwargs) - set(kept))
            return kept

        return GRPOConfig(**_cfg(output_dir="out", beta=0.01, max_prompt_length=512, use_bias_correction_kl=False))
    ''')


def test_a_helper_that_keeps_the_keywords_the_configuration_takes(tmp_path):
    """What reaches GRPOConfig is each keyword the running release takes: beta 0.01 without the bias correction is
    k3 as a loss (row 3, KL002) at the keyword. A keyword the helper may drop bounds no release: the verdict is the
    newest TRL's (dapo, a batch token-mean), not that of 0.27, the last to take max_prompt_length."""
    found = lint_paths([str(_written(tmp_path, FILTERING_HELPER))], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.line, f.code) for f in found] == [(13, "KL002")]
    assert "trl 0.27" not in found[0].message
    # the same keywords written in the call do bound the release
    direct = FILTERING_HELPER.replace("**_cfg(", "**dict(")
    assert "trl 0.27" in lint_paths([str(_written(tmp_path, direct))], settings=Settings(root=tmp_path),
                                    jobs=1).findings[0].message
    # a helper that changes a value, or takes another parameter, may give anything
    assert _found(tmp_path, FILTERING_HELPER.replace("{k: v for", "{k: str(v) for")) == []
    assert _found(tmp_path, FILTERING_HELPER.replace("def _cfg(**kwargs)", "def _cfg(scale, **kwargs)")
                  .replace("_cfg(output_dir", "_cfg(1, output_dir")) == []
    assert _found(tmp_path, FILTERING_HELPER.replace("return kept", "return {**kept, 'beta': 0.0}")) == []


def _written(tmp_path, source):
    (tmp_path / "train.py").write_text(source)
    return tmp_path
