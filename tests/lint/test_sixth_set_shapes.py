"""Shapes of KL code met in the sixth fresh set (Agentic-RAG-R1, LLM-RLHF-Tuning, ...): a loss helper handed
the PPO ratio by its caller, log-probs named with the `lp` abbreviation, and per-sequence rewards appended to
a list named `rewards_with_kl_penalty`, PRIME's implicit process reward stored as the rewards, and the rollout's log-probs joined from per-sample
pieces (`torch.cat(experience.action_log_probs)`) into one packed row, and a distillation script that imports its KL helper
from the `utils.py` beside it (one of several in the repository), by name or with `import *`.

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the forward KL (row 3, KL002); on
samples of an older policy, with no prefix weights, it follows neither KL (row 22, KL008); |log-ratio| or k2
values in a reward-to-go are not k1 values (rows 7 and 8, KL004). An implicit reward, log pi_rm - log ref
of a reward model, is that model's score, not a KL term of the policy (no finding). The exact per-token KL
differentiated as a loss on the student's own samples is the local gradient (row 2's PART, KL003), here
averaged per sequence (1/L, KL007); a mean over the last axis of one packed row of every sequence's tokens
is a token mean over the batch (row 20), whose weights are right.
"""

from __future__ import annotations

import textwrap

import pytest
from snippets import module_codes

from klaudit.config import Settings
from klaudit.lint.engine import lint_paths

# Agentic-RAG-R1's DAPO step: the loss helper gets the ratio to the rollout's log-probs from its caller,
# which runs `mu` updates on each rollout
RATIO_HANDED_TO_A_LOSS_HELPER = """\
    import torch


    def compute_dapo_loss(ratio, advantages, mask, ref_log_probs, curr_log_probs, beta):
        pg1 = -advantages * ratio
        pg2 = -advantages * torch.clamp(ratio, 0.8, 1.28)
        kl = torch.exp(ref_log_probs - curr_log_probs) - (ref_log_probs - curr_log_probs) - 1
        per_token = torch.maximum(pg1, pg2) + beta * kl
        return (per_token * mask).sum() / mask.sum()


    def step(model, rollout, optimizer, beta):
        old_lp = rollout["old_log_probs"]
        ref_lp = rollout["ref_log_probs"]
        curr_lp = model(rollout["input_ids"])
        ratio = {ratio}
        loss = compute_dapo_loss(ratio=ratio, advantages=rollout["adv"], mask=rollout["mask"],
                                 ref_log_probs=ref_lp, curr_log_probs=curr_lp, beta=beta)
        loss.backward()
        optimizer.step()
    """


@pytest.mark.parametrize("ratio, codes", [
    ("torch.exp(curr_lp - old_lp)", [(9, "KL002"), (9, "KL008")]),  # the caller shows the samples are older
    ("torch.exp(curr_lp - curr_lp.detach())", [(9, "KL002")]),  # a ratio of one: on-policy
])
def test_a_ratio_handed_to_a_loss_helper_shows_older_samples(tmp_path, ratio, codes):
    assert module_codes(RATIO_HANDED_TO_A_LOSS_HELPER.format(ratio=ratio), tmp_path) == codes


# LLM-RLHF-Tuning's PPO rewards: each sequence's penalty, with the score at its last token, appended to a list
REWARDS_APPENDED_PER_SEQUENCE = """\
    import torch


    class Trainer:
        def compute_rewards_with_kl_penalty(self, scores, actor_log_probs, ref_log_probs, responses_mask):
            masks = responses_mask[:, 1:]
            {target} = []
            for i in range(scores.shape[0]):
                kl = actor_log_probs[i] - ref_log_probs[i]
                if self.args.kl_penalty_method == "abs":
                    kl = torch.abs(kl)
                elif self.args.kl_penalty_method == "mse":
                    kl = kl ** 2 * 0.5
                kl_penalty = -self.args.kl_penalty_beta * kl
                kl_penalty[masks[i].nonzero()[-1].item()] += scores[i]
                {target}.append(kl_penalty)
            return torch.stack({target})
    """


@pytest.mark.parametrize("target, codes", [
    ("rewards_with_kl_penalty", [(16, "KL004"), (16, "KL004")]),  # abs and mse values in the reward; k1 is row 6
    # a list whose name says nothing holds the terms to the return: its caller decides their use
    ("penalised_sequences", []),
])
def test_rewards_appended_to_a_list_named_as_rewards(tmp_path, target, codes):
    assert module_codes(REWARDS_APPENDED_PER_SEQUENCE.format(target=target), tmp_path) == codes


# Spurious_Rewards' PRIME trainer: the reward model's log-ratio summed into each step's last token
IMPLICIT_PROCESS_REWARD = """\
    import torch


    class Trainer:
        def {helper}(self, log_prob, ref_log_prob, ends):
            q = log_prob - ref_log_prob
            token_level_score = torch.zeros_like(q)
            with torch.no_grad():
                for b in range(q.shape[0]):
                    token_level_score[b, ends[b]] = q[b].sum()
            return token_level_score, q

        def score(self, samples):
            with torch.no_grad():
                policy_log_probs, _ = self.prime_model(samples.sequences, samples.num_actions)
                token_level_score, q = self.{helper}(policy_log_probs, samples.base_action_log_probs, samples.ends)
                samples.process_rewards = token_level_score
            return samples
    """


@pytest.mark.parametrize("helper, codes", [
    ("compute_implicit_reward", []),  # the reward model's score
    ("compute_token_scores", [(17, "KL011")]),  # read as the policy's k1 stored as a reward with a bonus's sign
])
def test_an_implicit_reward_is_the_reward_models_score(tmp_path, helper, codes):
    assert module_codes(IMPLICIT_PROCESS_REWARD.format(helper=helper), tmp_path) == codes


# CURE's packed-sequence actor step (OpenRLHF-style): the rollout's log-probs joined from the buffer's pieces
LOG_PROBS_JOINED_FROM_THE_BUFFER = """\
    import torch


    class Actor:
        def training_step(self, experience):
            old_action_log_probs = {old}
            base_action_log_probs = torch.cat(experience.base_action_log_probs, dim=0).unsqueeze(0)
            action_log_probs, output = self.model(experience.sequences, return_output=True)
            actor_loss = self.actor_loss_fn(action_log_probs, old_action_log_probs, experience.advantages)
            kl_loss = (action_log_probs - base_action_log_probs).mean()
            loss = actor_loss + kl_loss * self.args.kl_loss_coef
            loss.backward()
    """


@pytest.mark.parametrize("old", [
    "torch.cat(experience.action_log_probs, dim=0).unsqueeze(0)",
    "torch.stack(experience.action_log_probs).view(1, -1)",
    "experience.action_log_probs",
])
def test_log_probs_joined_from_the_buffer_are_the_behaviour_policys(tmp_path, old):
    # the policy loss compares the policy with the samples' policy: the k1 loss is on older samples
    codes = module_codes(LOG_PROBS_JOINED_FROM_THE_BUFFER.format(old=old), tmp_path)
    assert codes == [(10, "KL001"), (10, "KL008")]


# llm_related's on-policy distillation: the student samples, and the reverse KL to the teacher, exact over the
# vocabulary, is the loss; the helper lives in the utils.py beside the script, and the repository has others
DISTILLATION_SCRIPT = """\
    import torch
    {import_line}


    def compute_loss(model, teacher, prompt_ids, pad_id):
        sequences = model.generate(prompt_ids)
        logits = model(sequences).logits[:, prompt_ids.shape[-1]:]
        with torch.no_grad():
            teacher_logits = teacher(sequences).logits[:, prompt_ids.shape[-1]:]
        kl = compute_rkl(logits, teacher_logits, sequences[:, prompt_ids.shape[-1]:], pad_id)
        return kl.mean()
    """
REVERSE_KL_HELPER = """\
    import torch


    def compute_rkl(logits, teacher_logits, target, padding_id):
        probs = torch.softmax(logits, -1)
        log_probs = torch.log_softmax(logits, -1)
        teacher_log_probs = torch.log_softmax(teacher_logits, -1)
        kl = (probs * (log_probs - teacher_log_probs)).sum(-1)
        pad_mask = target.eq(padding_id)
        kl = kl.masked_fill(pad_mask, 0.0)
        return kl.sum(dim=1) / (~pad_mask).sum(dim=1)
    """
UNRELATED_UTILS = """\
    def compute_rkl(*args):
        return 0.0
    """


@pytest.mark.parametrize("import_line", ["from utils import compute_rkl", "from utils import *"])
def test_a_script_imports_the_helper_beside_it(tmp_path, import_line):
    for folder, files in {"distill": {"train.py": DISTILLATION_SCRIPT.format(import_line=import_line),
                                      "utils.py": REVERSE_KL_HELPER},
                          "tools/utils": {"__init__.py": UNRELATED_UTILS}}.items():
        (tmp_path / folder).mkdir(parents=True)
        for name, text in files.items():
            (tmp_path / folder / name).write_text(textwrap.dedent(text))
    result = lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)  # the whole tree, as `lint .`
    assert sorted((f.path.split("/")[-1], f.line, f.code) for f in result.findings) == [
        ("train.py", 11, "KL003"), ("train.py", 11, "KL007")]


# Open-Reasoner-Zero's and CURE's actor step: the samples packed into one row, so the mean over the last
# axis is over every sequence's tokens; Spurious_Rewards' copy also has the unpacked branch
PACKED_OR_NOT = """\
    import torch


    class Actor:
        def training_step(self, experience):
            if isinstance(experience.sequences, list):
                base_action_log_probs = torch.cat(experience.base_action_log_probs, dim=0).unsqueeze(0)
            else:
                base_action_log_probs = {unpacked}
            action_log_probs, output = self.model(experience.sequences, return_output=True)
            kl = base_action_log_probs - action_log_probs
            kl_loss = kl.exp() - 1 - kl
            kl_loss = masked_mean(kl_loss, experience.action_mask, dim=-1).mean()
            loss = kl_loss * self.args.kl_loss_coef
            loss.backward()


    def masked_mean(values, mask, dim=None):
        return (values * mask).sum(dim) / mask.sum(dim)
    """


@pytest.mark.parametrize("unpacked, codes", [
    ("torch.cat(experience.base_action_log_probs, dim=0).unsqueeze(0)", [(12, "KL002")]),  # packed either way
    ("experience.base_action_log_probs", [(12, "KL002"), (12, "KL007")]),  # the unpacked path: 1/L
    # stacked, not concatenated: a row per sequence under a new axis, so the mean is per sequence
    ("torch.stack(experience.base_action_log_probs).unsqueeze(0)", [(12, "KL002"), (12, "KL007")]),
])
def test_a_mean_over_one_packed_row_is_over_the_batch(tmp_path, unpacked, codes):
    assert module_codes(PACKED_OR_NOT.format(unpacked=unpacked), tmp_path) == codes
