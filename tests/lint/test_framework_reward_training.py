"""A framework's KL reward, trained by an actor worker the lint does not follow (klaudit.frameworks.drivers).

verl's driver computes the k1 reward once per rollout (`apply_kl_penalty`) and hands the batch to
`update_actor`, which takes ppo_epochs x train_batch_size / ppo_mini_batch_size optimizer steps: with verl's
defaults (1 x 1024 / 256) four, so three of them train the reward of an older policy with only the PPO token
ratio (kl-math.md section 8, row 23: KL008). One step per rollout is on-policy (row 6: right). The actor
reduces the policy loss that carries the reward by `loss_agg_mode`: a per-sequence token mean weighs each
sequence's reward by 1/L (row 21: KL007), ROLL's default.
"""

from __future__ import annotations

from pathlib import Path

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

TRAINER = '''\
def kl_penalty(logprob, ref_logprob):
    return logprob - ref_logprob


def apply_kl_penalty(data, kl_ctrl):
    response_mask = data.batch["response_mask"]
    kld = kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"]) * response_mask
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - kl_ctrl.value * kld
    return data


class RayPPOTrainer:
    def fit(self):
        batch = self.generate()
        if self.config.algorithm.use_kl_in_reward:
            batch = apply_kl_penalty(batch, self.kl_ctrl)
        self.actor_rollout_wg.update_actor(batch)
'''


def _findings(root, trainer=TRAINER, config=None, section="actor_rollout_ref"):
    module = root / "verl" / "trainer" / "ppo" / "ray_trainer.py"
    module.parent.mkdir(parents=True)
    module.write_text(trainer + f"        return self.config.{section}.actor\n")
    if config is not None:
        (root / "verl" / "trainer" / "config").mkdir(parents=True)
        (root / "verl" / "trainer" / "config" / "ppo_trainer.yaml").write_text(config)
    return lint_paths([str(module)], settings=Settings(root=root), jobs=1).findings


def test_the_k1_reward_of_verls_driver_is_stale_under_its_default_batch_sizes(tmp_path):
    [finding] = _findings(tmp_path)
    assert (finding.code, finding.line) == ("KL008", 8)
    assert "k1 in the reward (reward-to-go)" in finding.message and "token-is" in finding.message
    assert "batch-token-mean" in finding.message  # verl's default loss_agg_mode, token-mean
    assert "train_batch_size=1024 (default), ppo_mini_batch_size=256 (default), 4 optimizer steps" in finding.message


def test_the_copys_own_defaults_decide_and_one_step_per_rollout_is_right(tmp_path):
    one_step = "data:\n  train_batch_size: 64\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 64\n"
    assert _findings(tmp_path / "a", config=one_step) == []
    two_epochs = one_step + "    ppo_epochs: 2\n"
    [finding] = _findings(tmp_path / "b", config=two_epochs)
    assert finding.code == "KL008" and "ppo_epochs=2, train_batch_size=64, ppo_mini_batch_size=64, 2 optimizer" \
        in finding.message


def test_easyr1s_driver_takes_its_own_defaults(tmp_path):
    """EasyR1: 512 prompts per rollout in updates of 256, once: two steps."""
    [finding] = _findings(tmp_path, section="worker")
    assert finding.code == "KL008" and "EasyR1's actor" in finding.message and "2 optimizer steps" in finding.message


def test_a_module_that_trains_nothing_itself_stays_on_policy(tmp_path):
    """Without the hand-over to the actor the reward's use is not known: no verdict on its staleness."""
    assert _findings(tmp_path, trainer=TRAINER.replace("self.actor_rollout_wg.update_actor(batch)", "self.log(batch)")) == []


def test_a_copy_that_averages_each_sequence_weighs_the_reward_by_one_over_its_length(tmp_path):
    """A verl copy whose ppo_trainer.yaml sets seq-mean-token-mean, one step per rollout: row 21 alone."""
    config = ("data:\n  train_batch_size: 64\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 64\n"
              "    loss_agg_mode: seq-mean-token-mean\n")
    [finding] = _findings(tmp_path, config=config)
    assert (finding.code, finding.line) == ("KL007", 8) and "seq-token-mean" in finding.message
    assert "loss_agg_mode=seq-mean-token-mean, ppo_epochs=1 (default)" in finding.message


ROLL_REWARD = '''\
def compute_approx_kl(log_probs, log_probs_base):
    return log_probs - log_probs_base


def apply_kl_penalty(data, kl_ctrl):
    kld = compute_approx_kl(data.batch["old_log_probs"], data.batch["ref_log_probs"])
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - kl_ctrl.value * kld
    return data
'''


def test_rolls_reward_functions_meet_its_per_sequence_token_mean(tmp_path):
    """ROLL's actors reduce the policy loss by loss_agg_mode, seq-mean-token-mean by default: 1/L weights on
    the k1 reward (KL007); a copy whose config class defaults to token-mean is right."""
    module = tmp_path / "roll" / "utils" / "functionals.py"
    module.parent.mkdir(parents=True)
    module.write_text(ROLL_REWARD)
    [finding] = lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings
    assert (finding.code, finding.line) == ("KL007", 7)
    assert "ROLL's actor at this copy's defaults: loss_agg_mode=seq-mean-token-mean" in finding.message
    (tmp_path / "roll" / "configs").mkdir()
    (tmp_path / "roll" / "configs" / "base_config.py").write_text(
        'class PPOConfig:\n    loss_agg_mode: str = field(default="token-mean")\n')
    assert lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings == []


MAKER = '''\
def compute_reward(r, kl_coef, kl, action_mask):
    return r * action_mask - kl_coef * kl


class ExperienceMaker:
    def make_experience(self, samples):
        kl = samples.action_log_probs - samples.base_action_log_probs
        samples.rewards = compute_reward(samples.score, self.kl_ctl.value, kl, samples.action_mask)
        return samples
'''


def test_openrlhfs_experience_maker_feeds_eight_steps_per_rollout_by_default(tmp_path):
    """OpenRLHF trains each rollout of 1024 x 1 samples in steps of 128, once: eight steps (row 23)."""
    module = tmp_path / "openrlhf" / "trainer" / "ppo_utils" / "experience_maker.py"
    module.parent.mkdir(parents=True)
    module.write_text(MAKER)
    [finding] = lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings
    assert (finding.code, finding.line) == ("KL008", 8) and "8 optimizer steps per rollout" in finding.message
    other = tmp_path / "mine" / "experience_maker.py"  # the same code outside OpenRLHF's layout: not its trainer
    other.parent.mkdir()
    other.write_text(MAKER)
    assert lint_paths([str(other)], settings=Settings(root=tmp_path), jobs=1).findings == []


def test_a_forks_copy_of_the_experience_maker_in_another_folder_is_trained_alike(tmp_path):
    """typoverflow/OpenRLHF (thirty-seventh set) copies the maker to openrlhf/reasoning_utils/ppo_utils/ for its
    reasoning PPO, trained by the same loop: eight steps per rollout on the k1 reward (row 23), as the original."""
    module = tmp_path / "openrlhf" / "reasoning_utils" / "ppo_utils" / "experience_maker.py"
    module.parent.mkdir(parents=True)
    module.write_text(MAKER)
    [finding] = lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings
    assert (finding.code, finding.line) == ("KL008", 8) and "8 optimizer steps per rollout" in finding.message


def test_an_openrlhf_copy_before_0_7_takes_each_responses_token_mean(tmp_path):
    """Up to 0.6 OpenRLHF's policy loss is each response's token mean: 1/L weights on the k1 reward (row 21)
    beside the eight steps per rollout (row 23)."""
    module = tmp_path / "openrlhf" / "trainer" / "ppo_utils" / "experience_maker.py"
    module.parent.mkdir(parents=True)
    module.write_text(MAKER)
    (tmp_path / "version.txt").write_text("0.6.0\n")
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='openrlhf')\n")
    findings = lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(f.code, f.line) for f in findings] == [("KL007", 8), ("KL008", 8)]
    assert "the policy loss each response's token mean (openrlhf 0.6" in findings[0].message


SLIME_LOSS = '''\
def compute_advantages_and_returns(args, rollout_data):
    log_probs, ref_log_probs = rollout_data["log_probs"], rollout_data["ref_log_probs"]
    kl = [lp - ref for lp, ref in zip(log_probs, ref_log_probs)]
    returns = []
    for kl_i, reward in zip(kl, rollout_data["rewards"]):
        token_rewards = -args.kl_coef * kl_i
        token_rewards[-1] += reward
        returns.append(token_rewards.flip(0).cumsum(0).flip(0))
    rollout_data["advantages"] = returns


def policy_loss_function(args, batch, logits, sum_of_sample_mean):
    ratio = (batch["log_probs_new"] - batch["log_probs"]).exp()
    return sum_of_sample_mean(-ratio * batch["advantages"])
'''


def test_slimes_advantages_meet_its_per_sample_token_mean(tmp_path):
    """slime reduces the policy loss that carries the k1 returns by `sum_of_sample_mean`, each sample's token
    mean by default (`--calculate-per-token-loss` off): 1/L weights on a reward that is otherwise right (row 6,
    weighed as row 21). The module's own code shows none of it: the advantages reach the loss through the
    rollout's dict."""
    module = tmp_path / "slime" / "backends" / "megatron_utils" / "loss.py"
    module.parent.mkdir(parents=True)
    module.write_text(SLIME_LOSS)
    [finding] = lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings
    assert (finding.code, finding.line) == ("KL007", 6)
    assert "k1 in the reward (reward-to-go), seq-token-mean" in finding.message
    assert "slime's actor at its defaults: calculate-per-token-loss=False" in finding.message
    fork = tmp_path / "miles" / "backends" / "training_utils" / "loss.py"  # radixark/miles keeps the reduction
    fork.parent.mkdir(parents=True)
    fork.write_text(SLIME_LOSS)
    [finding] = lint_paths([str(fork)], settings=Settings(root=tmp_path), jobs=1).findings
    assert (finding.code, finding.line) == ("KL007", 6)
    assert "miles's actor at its defaults: calculate-per-token-loss=False" in finding.message
    other = tmp_path / "mine" / "loss.py"  # outside slime's layout the same reward-to-go is right
    other.parent.mkdir()
    other.write_text(SLIME_LOSS)
    assert lint_paths([str(other)], settings=Settings(root=tmp_path), jobs=1).findings == []


SKYRL_TRAINER = '''\
import torch


class RayPPOTrainer:
    def apply_reward_kl_penalty(self, data):
        with torch.no_grad():
            kl = data["action_log_probs"] - data["base_action_log_probs"]
        data["rewards"] = data["rewards"] - kl * self.cfg.trainer.algorithm.kl_loss_coef
        return data
'''

SKYRL_CONFIG = '''\
@dataclass
class TrainerConfig:
    update_epochs_per_batch: int = 1
    train_batch_size: int = {train}
    policy_mini_batch_size: int = 256
'''


def test_skyrls_trainer_feeds_four_steps_per_rollout_by_default(tmp_path):
    """SkyRL's policy worker trains the k1 reward, computed once per rollout, in update_epochs_per_batch x
    train_batch_size / policy_mini_batch_size optimizer steps, read from the copy's config dataclasses: 1 x 1024 /
    256 = 4, stale after the first with the token ratio only (row 23, KL008); 1 x 256 / 256 is on-policy (row 6)."""
    module = tmp_path / "skyrl" / "train" / "trainer.py"
    (module.parent / "config").mkdir(parents=True)
    module.write_text(SKYRL_TRAINER)
    for train, expected in (("1024", [("KL008", 8)]), ("256", [])):
        (module.parent / "config" / "config.py").write_text(SKYRL_CONFIG.format(train=train))
        found = lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings
        assert [(f.code, f.line) for f in found] == expected, train
        assert all(f"train_batch_size={train}, policy_mini_batch_size=256, 4 optimizer steps" in f.message for f in found)


def test_the_records_check_grad_is_compared_with_carry_the_same_staleness(tmp_path):
    """klaudit.lint.query.site_verdicts, which scripts/agreement.py compares with check-grad, reads the driver's
    reward as the report does: its KL008 (older samples, the actor's steps) is a rule of the code around the
    audited helper. Without it, verl 0.9.1's and OpenRLHF 0.11.2's reported KL008 had no record to explain it."""
    from klaudit.lint.query import site_verdicts

    _findings(tmp_path)
    module = tmp_path / "verl" / "trainer" / "ppo" / "ray_trainer.py"
    [site] = [site for site in site_verdicts(str(module)) if site.line == 8]
    assert site.placement == "reward" and site.rules == ("KL008",)


def test_a_reward_an_openrlhf_helper_forms_whole_is_reported_at_the_experience_makers_call(tmp_path):
    """OpenRLHF 0.4's compute_reward (openrlhf/models/utils.py) forms the k1 reward from the log-probs itself, a
    reward on fresh samples where it is written. The experience maker that calls it knows OpenRLHF's actor trains it
    over eight steps per rollout (row 23) with each response's token mean (row 21): reported at its call."""
    (tmp_path / "openrlhf" / "models").mkdir(parents=True)
    (tmp_path / "openrlhf" / "models" / "utils.py").write_text(
        "def compute_reward(r, kl_coef, log_probs, log_probs_base, action_mask):\n"
        "    kl = (log_probs - log_probs_base) * action_mask\n"
        "    reward = -kl_coef * kl\n"
        "    reward[:, -1] += r\n"
        "    return reward, kl\n")
    module = tmp_path / "openrlhf" / "trainer" / "ppo_utils" / "experience_maker.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from openrlhf.models.utils import compute_reward\n\n\n"
        "class ExperienceMaker:\n"
        "    def make_experience(self, samples):\n"
        "        reward, kl = compute_reward(samples.score, self.kl_ctl.value, samples.action_log_probs,\n"
        "                                    samples.base_action_log_probs, samples.action_mask)\n"
        "        samples.advantages = self.get_advantages_and_returns(samples.values, reward)\n"
        "        return samples\n")
    (tmp_path / "version.txt").write_text("0.4.4\n")
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='openrlhf')\n")
    findings = lint_paths([str(tmp_path / "openrlhf")], settings=Settings(root=tmp_path), jobs=1).findings
    assert [(Path(f.path).name, f.code, f.line) for f in findings] == [("experience_maker.py", "KL007", 6),
                                                                     ("experience_maker.py", "KL008", 6)]


def test_the_step_count_of_an_openrlhf_copy_is_read_from_its_own_command_line(tmp_path):
    """TreeRL's OpenRLHF copy defaults --rollout_batch_size to 512 against --train_batch_size 128: its experience
    maker's k1 reward feeds four optimizer steps per rollout, not OpenRLHF's eight."""
    module = tmp_path / "openrlhf" / "trainer" / "ppo_utils" / "experience_maker.py"
    module.parent.mkdir(parents=True)
    module.write_text(MAKER)
    cli = tmp_path / "openrlhf" / "cli" / "train_ppo_ray.py"
    cli.parent.mkdir(parents=True)
    cli.write_text('import argparse\nparser = argparse.ArgumentParser()\n'
                   'parser.add_argument("--rollout_batch_size", type=int, default=512)\n'
                   'parser.add_argument("--train_batch_size", type=int, default=128)\nargs = parser.parse_args()\n')
    [finding] = lint_paths([str(module)], settings=Settings(root=tmp_path), jobs=1).findings
    assert finding.code == "KL008" and "rollout_batch_size=512" in finding.message
    assert "4 optimizer steps per rollout" in finding.message


PER_RESPONSE_LOSS = '''\
import torch


class PolicyLoss(torch.nn.Module):
    def forward(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
        loss = masked_mean(loss, action_mask, dim=-1).mean()
        return loss
'''


def _renamed_copy(tmp_path, cli=True, loss=PER_RESPONSE_LOSS):
    """jihuazhongg/nanorl (seventy-third fresh set), 'a nano version of OpenRLHF': OpenRLHF's layout under the package
    name nanorl, its own command line defaulting to 512 rollouts against train batches of 128, and the policy loss
    of OpenRLHF before 0.7, each response's token mean."""
    package = tmp_path / "nanorl"
    (package / "trainer" / "ppo_utils").mkdir(parents=True)
    (package / "trainer" / "ppo_utils" / "experience_maker.py").write_text(MAKER)
    if cli:
        (package / "cli").mkdir()
        (package / "cli" / "train_ppo.py").write_text(
            'import argparse\nparser = argparse.ArgumentParser()\n'
            'parser.add_argument("--rollout_batch_size", type=int, default=512)\n'
            'parser.add_argument("--train_batch_size", type=int, default=128)\nargs = parser.parse_args()\n')
    (package / "models").mkdir()
    (package / "models" / "loss.py").write_text(loss)
    found = lint_paths([str(package / "trainer")], settings=Settings(root=tmp_path), jobs=1).findings
    return [(f.code, f.line) for f in found], [f.message for f in found]


def test_a_package_of_openrlhfs_layout_under_another_name_is_trained_as_its_command_line_says(tmp_path):
    codes, messages = _renamed_copy(tmp_path)
    assert codes == [("KL007", 8), ("KL008", 8)]  # rows 21 and 23
    assert "nanorl (OpenRLHF's layout)'s actor" in messages[0] and "4 optimizer steps per rollout" in messages[0]


def test_a_renamed_copy_whose_loss_takes_the_batchs_tokens_is_not_weighted_by_length(tmp_path):
    codes, _ = _renamed_copy(tmp_path, loss=PER_RESPONSE_LOSS.replace("dim=-1).mean()", "dim=None)"))
    assert codes == [("KL008", 8)]


def test_an_experience_maker_of_a_package_without_openrlhfs_command_line_is_not_openrlhfs(tmp_path):
    codes, _ = _renamed_copy(tmp_path, cli=False)
    assert codes == []
