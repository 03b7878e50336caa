"""Shapes of code met in the fifty-third blind set that the lint misread.

- Sathvik-ai's notebook PPO keeps the sampled ids in range before it picks their log-probs
  (`gen_ids_clamped = torch.clamp(gen_ids, ...)`, then `lp[torch.arange(n), gen_ids_clamped]`): the index's name was
  not read as token ids, so neither log-prob was one, and its k1 loss went unreported (row 1, KL001). The
  eighty-third set's intellicredit names them `shift_labels_s` (`= shift_labels.clamp(0, V - 1)`): ids by what they
  are bound to, not by their spelling.
- YukoiWang/Emo-Agent-RL-finetune trains one multi-turn dialogue per pass, over `enumerate(rollout_results)` or
  `range(total_count)` picking `all_rollouts_flat[idx]`, and divides each KL sum by that dialogue's own token count:
  per-sequence 1/L weights (row 21, KL007), read as a batch token mean.
- zeropointnine/glm-tts-packaged's KL helper switches on an estimator keyword that its one caller, in another
  package folder, leaves at its default: the branches it never takes were judged as if some caller took them.
"""

from __future__ import annotations

import pytest

from klaudit.lint.engine import lint_paths
from tests.lint.snippets import K3_STEP

PICKED = """\
import torch
import torch.nn.functional as F


class Trainer:
    @torch.no_grad()
    def _ref_log_probs(self, full_ids, prompt_len):
        logits = self.ref_model(full_ids).logits[0, prompt_len - 1:-1]
        lp = F.log_softmax(logits, dim=-1)
        gen_ids = full_ids[0, prompt_len:]
        {ref_ids} = torch.clamp(gen_ids, 0, lp.shape[-1] - 1)
        return lp[torch.arange(len(gen_ids)), {ref_ids}]

    def step(self, full_ids, prompt_len, advantage):
        gen_ids = full_ids[0, prompt_len:]
        logits = self.model(full_ids).logits[0, prompt_len - 1:-1]
        lp_all = F.log_softmax(logits, dim=-1)
        {ids} = torch.clamp(gen_ids, 0, lp_all.shape[-1] - 1)
        new_lp = lp_all[torch.arange(len(gen_ids)), {ids}]
        ref_lp = self._ref_log_probs(full_ids, prompt_len)
        kl = (new_lp - ref_lp).mean()
        loss = -(new_lp.sum() * advantage) + self.beta * kl
        loss.backward()
        self.optimizer.step()
"""


def _codes(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = lint_paths([str(tmp_path)], jobs=1)
    assert result.errors == []
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize("ids", ["gen_ids_clamped", "gen_ids", "labels_safe", "target_ids_long"])
def test_token_ids_kept_in_range_still_pick_the_sampled_tokens_log_probs(tmp_path, ids):
    assert "KL001" in _codes(tmp_path, {"ppo.py": PICKED.format(ids=ids, ref_ids=ids)})


@pytest.mark.parametrize("bound", ["shift_labels.clamp(0, lp_all.shape[-1] - 1)",
                                   "torch.clamp(gen_ids, max=lp_all.shape[-1] - 1).long()",
                                   "picked_s.to(lp_all.device)"])
def test_a_name_bound_to_token_ids_kept_in_range_picks_the_sampled_tokens(tmp_path, bound):
    text = PICKED.format(ids="picked_s", ref_ids="gen_ids_clamped").replace(
        "        picked_s = torch.clamp(gen_ids, 0, lp_all.shape[-1] - 1)\n",
        "        shift_labels = gen_ids\n        picked_s = torch.clamp(shift_labels, 0, lp_all.shape[-1] - 1)\n"
        f"        picked_s = {bound}\n")
    assert "picked_s = " + bound in text
    assert "KL001" in _codes(tmp_path, {"ppo.py": text})


def test_an_index_not_named_for_token_ids_picks_nothing(tmp_path):
    text = PICKED.format(ids="gen_ids_clamped", ref_ids="clamped_rows")
    assert _codes(tmp_path, {"ppo.py": text.replace("torch.clamp(gen_ids, 0, lp.shape", "torch.clamp(row_index, 0, lp.shape")}) == []


def test_a_name_bound_to_ids_in_one_branch_and_to_rows_in_another_picks_nothing(tmp_path):
    text = PICKED.format(ids="gen_ids_clamped", ref_ids="clamped_rows").replace(
        "        return lp[torch.arange(len(gen_ids)), clamped_rows]",
        "        if prompt_len > 1:\n            clamped_rows = row_index\n"
        "        return lp[torch.arange(len(gen_ids)), clamped_rows]")
    assert "clamped_rows = row_index" in text
    assert _codes(tmp_path, {"ppo.py": text}) == []


DIALOGUES = """\
import torch


def train(actor, ref_model, optimizer, prompts, beta, steps_per_gen):
    for prompt in prompts:
        {collected} = []
        for _ in range(4):
            {collected}.append(rollout(actor, prompt))
        optimizer.zero_grad()
{loop}
            n_resp = resp_mask.sum().clamp(min=1)
            actor_lp = masked_log_probs(actor, full_ids, resp_mask)
            with torch.no_grad():
                ref_lp = masked_log_probs(ref_model, full_ids, resp_mask)
            log_ratio = actor_lp - ref_lp
            kl = ((torch.exp(-log_ratio) + log_ratio - 1) * resp_mask).sum() / n_resp
            loss = -(actor_lp * resp_mask).sum() * adv + beta * kl
            loss.backward()
        optimizer.step()


def masked_log_probs(model, ids, mask):
    logits = model(ids).logits[:, :-1]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1) * mask
"""

ENUMERATED = """\
        for i, (full_ids, resp_mask, adv) in enumerate({collected}):"""
INDEXED = """\
        for idx in range(len({collected})):
            full_ids, resp_mask, adv = {collected}[idx]"""


@pytest.mark.parametrize("loop", [ENUMERATED, INDEXED])
@pytest.mark.parametrize("collected", ["rollout_results", "all_rollouts_flat", "trajectories"])
def test_a_kl_sum_over_one_drawn_dialogues_tokens_per_pass_is_a_per_sequence_mean(tmp_path, loop, collected):
    source = DIALOGUES.format(collected=collected, loop=loop.format(collected=collected))
    assert "KL007" in _codes(tmp_path, {"grpo.py": source})


@pytest.mark.parametrize("loop", [ENUMERATED, INDEXED])
def test_a_list_not_named_for_drawn_samples_holds_a_batch_per_entry(tmp_path, loop):
    source = DIALOGUES.format(collected="minibatches", loop=loop.format(collected="minibatches"))
    assert "KL007" not in _codes(tmp_path, {"grpo.py": source})


HELPER = """\
import torch


def compute_kl_loss(log_probs, ref_log_probs, estimator="k3"):
    log_ratio = log_probs - ref_log_probs
    if estimator == "k1":
        return log_ratio
    return torch.exp(-log_ratio) - 1 + log_ratio
"""

CALLER = """\
from {imported}


def train_step(model, ref, batch, optimizer, beta):
    logp = torch.log_softmax(model(batch.ids).logits, -1).gather(-1, batch.ids[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_logp = torch.log_softmax(ref(batch.ids).logits, -1).gather(-1, batch.ids[..., None]).squeeze(-1)
    loss = -(logp * batch.adv).mean() + beta * ({call} * batch.mask).sum() / batch.mask.sum()
    loss.backward()
    optimizer.step()
"""


def _helper_codes(tmp_path, imported="pkg.rl.kl import compute_kl_loss", call="compute_kl_loss(logp, ref_logp)"):
    header = "import torch\n"
    return _codes(tmp_path, {"pkg/__init__.py": "", "pkg/rl/__init__.py": "", "pkg/rl/kl.py": HELPER,
                             "pkg/train/__init__.py": "",
                             "pkg/train/deep/loop.py": header + CALLER.format(imported=imported, call=call)})


def test_a_helpers_branch_its_one_caller_afar_never_takes_is_not_judged(tmp_path):
    assert _helper_codes(tmp_path) == ["KL002"]  # the k3 the default selects, not the k1 branch (KL001)


@pytest.mark.parametrize(("imported", "call"), [
    ("pkg.rl.kl import compute_kl_loss", 'compute_kl_loss(logp, ref_logp, estimator="k1")'),
    # called as a method of some object: callers the text hides
    ("pkg.rl import kl", "batch.losses.compute_kl_loss(logp, ref_logp)"),
])
def test_a_caller_afar_that_takes_the_branch_or_hides_its_call_keeps_it_judged(tmp_path, imported, call):
    assert "KL001" in _helper_codes(tmp_path, imported, call)


@pytest.mark.parametrize("imported", ["pkg.rl import kl", "pkg.rl import kl as kl_helpers"])
def test_a_call_through_the_imported_module_is_a_call_of_the_helper(tmp_path, imported):
    call = f"{imported.rsplit(' ', 1)[-1]}.compute_kl_loss(logp, ref_logp)"
    assert _helper_codes(tmp_path, imported, call) == ["KL002"]


SCRIPT = "import torch\n{imports}\n" + K3_STEP


def _script_codes(tmp_path, imports, beside, package=False):
    folder = tmp_path / "src"
    folder.mkdir()
    for name in beside:
        (folder / name).mkdir() if name.endswith("/") else (folder / name).write_text("PROMPT = 'judge this'\n")
    if package:
        (folder / "__init__.py").write_text("")
    (folder / "rl_trainer.py").write_text(SCRIPT.format(imports=imports))
    result = lint_paths([str(tmp_path)], jobs=1)
    return sorted({finding.code for finding in result.findings})


@pytest.mark.parametrize("imports", ["from rl_judge_prompts import PROMPT", "import rl_judge_prompts"])
def test_a_script_importing_a_module_its_folder_holds_only_as_a_data_file_never_trains(tmp_path, imports):
    # chahal-navi/Secret_Loyalties (fifty-third set): src/rl_trainer.py imports its judge prompts from a .txt file
    assert _script_codes(tmp_path, imports, ["rl_judge_prompts.txt"]) == []


@pytest.mark.parametrize(("beside", "package"), [
    (["rl_judge_prompts.txt", "rl_judge_prompts.py"], False),  # the module is there too
    (["rl_judge_prompts/"], False),  # a package of that name
    (["rl_judge_prompts.txt"], True),  # a package's module imports absolutely from the path, not from its folder
    ([], False),  # nothing of that name: an installed module, perhaps
])
def test_a_module_the_folder_or_the_path_may_hold_leaves_the_script_linted(tmp_path, beside, package):
    assert _script_codes(tmp_path, "from rl_judge_prompts import PROMPT", beside, package) == ["KL002"]


@pytest.mark.parametrize(("imports", "beside"), [
    ("from accelerate.utils import gather", ["accelerate.yaml"]),  # KimGyunYeop (fresh85), xjr1051 (fresh80)
    ("from openenv import Env", ["openenv.yaml"]),  # an OpenEnv environment's manifest
    ("import logging", ["logging.conf"]),  # Python's own module
    ("import deepspeed", ["deepspeed.json"]),
])
def test_a_configuration_file_named_after_an_installed_package_leaves_the_script_linted(tmp_path, imports, beside):
    """A configuration file named after the tool it configures stands in for no module: the import finds the
    installed package, the script runs, and its k3 loss is row 3 (KL002). KimGyunYeop/TA-GRPO-d's d1 trainer beside
    accelerate.yaml was dropped whole (two recorded misses)."""
    assert _script_codes(tmp_path, imports, beside) == ["KL002"]


def test_a_package_of_the_project_above_the_script_is_what_its_import_finds(tmp_path):
    """qwertyuiop41/RLHF (ninety-second set): grpo/train.py, launched from the root by grpo/grpo.sh as `python
    grpo/train.py` after `sys.path.append('./')`, imports `from grpo.kk import compute_score`: the project's grpo/
    folder, not the shell script beside it. The script trains, and its k3 loss is row 3 (KL002)."""
    assert _script_codes(tmp_path, "from src.kk import score", ["src.sh"]) == ["KL002"]
