"""Shapes met on trainers klaudit was not built against (NVIDIA NeMo-Aligner, sail-sg/oat).

1. A KL reward whose sink (GAE advantages) lies in a method another method of the class calls is one use of
   the term: reported once, in the method that holds the sink, not again at each call (kl-math.md section 8,
   row 7: |log-ratio| values in the reward, KL004).
2. A buffer made by a tensor factory (`logps = torch.zeros(...)`) holds constants, whatever its name: it has a
   gradient only once a differentiable value is written into it. Filled under no_grad it is data, and a
   critic's squared error against returns that hold a k1 reward is no k2 KL loss; filled outside no_grad with
   the policy's log-probs, a k1 loss made of it has k1's zero expected gradient (row 1, KL001).
3. A reward stored into a dict the function fills and returns leaves the function as a returned reward does;
   a preference loss's implicit rewards returned the same way are no KL penalty.
4. One helper called at two statements of a function is two uses, not an echo of one (EdinburghNLP/SCOPE's
   update_policy computes its KL loss through kl_penalty and agg_loss in a distillation branch and again in
   its GRPO branch, the branch every shipped launch runs): each is reported (k1 as a loss, row 1, KL001). A
   reward that enters two sinks on one path (andrew-silva/mlx-rlhf's TRL-style compute_rewards appends its KL
   reward to `non_score_rewards` and, with the score added, to `rewards`) is one use (mse in the reward: row 8,
   KL004).
5. A training step that backpropagates the loss a helper method built (liyuan24/dgx_spark_summary_from_human_feedback's
   `train` calling `get_grpo_loss`, which adds `kl_coeff * agg_losses(kl_penalty(...))`) does not enter the KL
   term in a loss of its own: its use is the helper's, reported once where the helper enters it, with what the
   step shows (several optimizer steps on one rollout: row 22, KL008), not again at each return of the
   aggregation helper the term passes through.
"""

from __future__ import annotations

from pathlib import Path

from snippets import module_codes


def codes(source: str, tmp_path: Path, **modules: str) -> list[tuple[int, str]]:
    """(line, code) of the findings in `source` (written as trainer.py beside `modules`)."""
    return module_codes(source, tmp_path, "trainer.py", **modules)


PPO_UTILS = """\
    def calculate_kl_penalty(log_probs_a, log_probs_b, use_absolute_kl=True):
        init_policy_kl = log_probs_a - log_probs_b
        if use_absolute_kl:
            init_policy_kl = init_policy_kl.abs()
        return init_policy_kl


    def calculate_ppo_rewards(values, rewards, init_policy_kl, penalty_factor=0.0):
        rewards_sequence = values * 0
        rewards_sequence[:, -1] = rewards
        return rewards_sequence - penalty_factor * init_policy_kl


    def calculate_advantages_and_returns(values, rewards, discount_factor=1.0, gae_lambda=0.95):
        last_gae = 0
        advantages = values * 0
        for t in reversed(range(rewards.size(-1))):
            delta = rewards[:, t] + discount_factor * values[:, t + 1] - values[:, t]
            last_gae = delta + discount_factor * gae_lambda * last_gae
            advantages[:, t] = last_gae
        return advantages, advantages + values
    """


def test_a_sink_inside_a_called_method_is_reported_there_only(tmp_path):
    assert codes("""\
        import torch
        from ppo_utils import calculate_advantages_and_returns, calculate_kl_penalty, calculate_ppo_rewards


        class PPOTrainer:
            def generate_ppo_data(self, rollout_batch):
                ppo_rollout_data = {}
                values = rollout_batch["values"]
                init_policy_kl = calculate_kl_penalty(
                    log_probs_a=rollout_batch["logprobs"],
                    log_probs_b=rollout_batch["init_logprobs"],
                    use_absolute_kl=self.cfg.use_absolute_kl,
                )
                rewards_with_kl = calculate_ppo_rewards(values, rollout_batch["rewards"], init_policy_kl,
                                                        self.cfg.initial_policy_kl_penalty)
                advantages, returns = calculate_advantages_and_returns(values=values, rewards=rewards_with_kl)
                ppo_rollout_data["advantages"] = advantages
                ppo_rollout_data["returns"] = returns
                return ppo_rollout_data, {}

            @torch.no_grad()
            def generate_rollouts(self):
                rollout_batch, rollout_metrics = self._run_inference(self.dataloader)
                ppo_rollout_data, ppo_rollout_metrics = self.generate_ppo_data(rollout_batch)
                return ppo_rollout_data, rollout_metrics | ppo_rollout_metrics
        """, tmp_path, ppo_utils=PPO_UTILS) == [(14, "KL004")]


ALGOS = """\
    def agg_loss(loss_mat, loss_mask):
        return (loss_mat * loss_mask).sum() / loss_mask.sum()


    def kl_penalty(logprob, ref_logprob):
        return logprob - ref_logprob
    """


def test_one_helper_called_in_two_branches_is_two_uses(tmp_path):
    assert codes("""\
        from algos import agg_loss, kl_penalty


        class Actor:
            def update_policy(self, batch):
                log_prob = self.model(batch)
                if batch["teacher_ids"] is not None:
                    policy_loss = self.distillation_loss(log_prob, batch)
                    kld = kl_penalty(logprob=log_prob, ref_logprob=batch["ref_log_prob"])
                    kl_loss = agg_loss(loss_mat=kld, loss_mask=batch["response_mask"])
                    policy_loss = policy_loss + kl_loss * self.kl_loss_coef
                else:
                    policy_loss = self.policy_gradient_loss(log_prob, batch)
                    kld = kl_penalty(logprob=log_prob, ref_logprob=batch["ref_log_prob"])
                    kl_loss = agg_loss(loss_mat=kld, loss_mask=batch["response_mask"])
                    policy_loss = policy_loss + kl_loss * self.kl_loss_coef
                policy_loss.backward()
        """, tmp_path, algos=ALGOS) == [(10, "KL001"), (15, "KL001")]


def test_one_estimate_averaged_over_two_masks_into_the_loss_is_two_uses(tmp_path):
    """CycleGRPO-OPSD (the fourteenth set) adds its KL estimate to the loss over the response mask and again
    over the caption tokens of safe routes (an anchor KL): two KL losses (k1 as a loss, row 1, KL001)."""
    assert codes("""\
        from algos import agg_loss, kl_penalty


        def update_policy(model, batch, kl_coef, anchor_coef):
            log_prob = model(batch)
            loss = model.policy_gradient_loss(log_prob, batch)
            kld = kl_penalty(logprob=log_prob, ref_logprob=batch["ref_log_prob"])
            kl_loss = agg_loss(loss_mat=kld, loss_mask=batch["response_mask"])
            loss = loss + kl_loss * kl_coef
            anchor_kl_loss = agg_loss(loss_mat=kld, loss_mask=batch["anchor_mask"])
            loss = loss + anchor_kl_loss * anchor_coef
            loss.backward()
        """, tmp_path, algos=ALGOS) == [(8, "KL001"), (10, "KL001")]


def test_a_reward_appended_to_two_lists_on_one_path_is_one_use(tmp_path):
    assert codes("""\
        import torch


        class Trainer:
            def compute_rewards(self, scores, logprobs, ref_logprobs, masks):
                rewards, non_score_rewards = [], []
                for score, logprob, ref_logprob, mask in zip(scores, logprobs, ref_logprobs, masks):
                    kl_p = self._kl_penalty(logprob, ref_logprob)
                    non_score_rew = -self.kl_coef * kl_p
                    non_score_rewards.append(non_score_rew)
                    non_score_rew[mask.nonzero()[-1]] += score
                    rewards.append(non_score_rew)
                return torch.stack(rewards), torch.stack(non_score_rewards)

            def _kl_penalty(self, logprob, ref_logprob):
                return 0.5 * (logprob - ref_logprob) ** 2
        """, tmp_path) == [(9, "KL004")]


TRAINER = """\
    import torch


    class Learner:
        def gae(self, rewards, values, masks):
            advantages = torch.zeros_like(rewards)
            last = 0.0
            for t in reversed(range(rewards.size(1))):
                last = rewards[:, t] - values[:, t] + last
                advantages[:, t] = last
            return advantages, advantages + values

        def step(self, input_ids, response_masks, rewards, values, value_pred, new_logps):
            logps = torch.zeros_like(response_masks).float()
            ref_logps = torch.zeros_like(response_masks).float()
            with torch.no_grad():
                for i in range(len(input_ids)):
                    logps[i] = self.get_logps(self.model, input_ids[i])
                    ref_logps[i] = self.get_logps(self.ref_model, input_ids[i])
            kl_rewards = -self.kl_coef * (logps - ref_logps) * response_masks
            adv, returns = self.gae(rewards + kl_rewards, values, response_masks)
            pg_loss = -(new_logps * adv).mean()
            vf_loss = torch.square(value_pred - returns).mean()
            loss = pg_loss + 0.5 * vf_loss
            loss.backward()
    """


def test_a_buffer_filled_under_no_grad_is_data_whatever_its_name(tmp_path):
    assert codes(TRAINER, tmp_path) == []


def test_a_buffer_filled_with_the_policys_log_probs_carries_their_gradient(tmp_path):
    assert codes("""\
        import torch


        def kl_loss(policy, input_ids, ref_logprobs, mask):
            logprobs = torch.zeros_like(mask)
            for i in range(len(input_ids)):
                logprobs[i] = policy.token_logprobs(input_ids[i])
            kl = logprobs - ref_logprobs
            loss = (kl * mask).sum() / mask.sum()
            loss.backward()
        """, tmp_path) == [(9, "KL001")]


def test_a_reward_that_leaves_in_a_dict_filled_here_is_a_reward(tmp_path):
    """NeMo-Aligner's REINFORCE: the per-sequence mean |log-ratio| penalty leaves generate_reinforce_data as
    an entry of the rollout dict it returns (its loss reads it in another module): rows 7 and 21 (KL004, KL007)."""
    assert codes("""\
        def generate_reinforce_data(rollout_batch, penalty, mask):
            data = {}
            kl = (rollout_batch["logprobs"] - rollout_batch["init_logprobs"]).abs()
            kl = (kl * mask).sum(-1) / mask.sum(-1)
            rewards_with_kl = rollout_batch["rewards"] - penalty * kl
            data["rewards_with_kl"] = rewards_with_kl
            data["mask"] = mask
            return data
        """, tmp_path) == [(5, "KL004"), (5, "KL007")]


def test_a_preference_losss_implicit_rewards_in_a_returned_dict_stay_silent(tmp_path):
    assert codes("""\
        import torch.nn.functional as F


        def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
            out = {}
            logits = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
            out["loss"] = -F.logsigmoid(beta * logits).mean()
            out["chosen_rewards"] = beta * (policy_chosen_logps - ref_chosen_logps).detach()
            out["rejected_rewards"] = beta * (policy_rejected_logps - ref_rejected_logps).detach()
            return out
        """, tmp_path) == []


def test_a_step_that_backpropagates_a_helpers_loss_reports_it_where_the_helper_enters_it(tmp_path):
    source = """\
        import torch


        class Trainer:
            def agg_losses(self, losses, mask, mode):
                if mode == "token-mean":
                    return (losses * mask).sum() / mask.sum()
                seq_losses = (losses * mask).sum(dim=-1) / mask.sum(dim=-1)
                return seq_losses.mean()

            def kl_penalty(self, logp, ref_logp):
                return logp - ref_logp

            def grpo_loss(self, logp, ref_logp, adv, mask, mode):
                pg_loss = self.agg_losses(-adv * logp, mask, mode)
                kl_loss = self.agg_losses(self.kl_penalty(logp, ref_logp), mask, mode)
                return pg_loss + self.kl_coeff * kl_loss

            def train(self):
                batch = self.generate(self.prompts)
                with torch.no_grad():
                    ref_logp = self.forward(self.ref_model, batch)
                for epoch in range(EPOCHS):
                    logp = self.forward(self.policy_model, batch)
                    loss = self.grpo_loss(logp, ref_logp, batch.adv, batch.mask, self.mode)
                    loss.backward()
                    self.optimizer.step()
        """
    assert codes(source.replace("EPOCHS", "4"), tmp_path) == [(16, "KL001"), (16, "KL008")]
    assert codes(source.replace("EPOCHS", "1"), tmp_path) == [(16, "KL001")]
