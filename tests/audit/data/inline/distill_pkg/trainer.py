"""On-policy distillation steps, as TRL 1.16's SDFT and IW-OPD write them.

`server_step`: the teacher's log-probs come from a server call (`teacher`, which binds by no name) read into
`teacher_per_token_logps`; the sampled-token reverse KL `sg(student - teacher) * student` is a k1 reward on
its own token (KL003, kl-math.md row 2) and the else branch (another estimator) never runs with it.
`_advantage_loss`: the KL enters as an advantage to maximise, `teacher - rollout` (the negated k1), weighted
by a detached per-token factor, on the token's own score (KL003 as well).
"""

import torch

from .helpers import clip_ratio


class Distiller:
    def server_step(self, model, inputs):
        student_logits = model(inputs["input_ids"]).logits
        completion_ids = inputs["completion_ids"]
        teacher = self.teacher_server.score(inputs)
        student_per_token_logps = torch.log_softmax(student_logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
        teacher_per_token_logps = teacher["actual_logprobs"]
        if self.args.mode == "sampled_token":
            per_token_loss = (student_per_token_logps - teacher_per_token_logps).detach() * student_per_token_logps
        else:
            per_token_loss = self.topk_divergence(student_logits, teacher)
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is not None:
            per_token_loss = clip_ratio(per_token_loss, student_per_token_logps, old_per_token_logps, 2.0)
        loss = per_token_loss.sum()
        loss.backward()

    def _advantage_loss(self, student_logits, completion_tokens, labels, teacher_actual_logprobs,
                        rollout_logprobs=None):
        student_log_probs = torch.log_softmax(student_logits, dim=-1)
        student_actual_logprobs = student_log_probs.gather(dim=-1, index=completion_tokens.unsqueeze(-1)).squeeze(-1)
        valid_mask = labels != -100
        safe_teacher_logprobs = torch.where(valid_mask, teacher_actual_logprobs, 0.0)
        if rollout_logprobs is None:
            rollout_logprobs = student_actual_logprobs
        safe_rollout_logprobs = torch.where(valid_mask, rollout_logprobs, 0.0)
        a_opd = (safe_teacher_logprobs - safe_rollout_logprobs).detach()
        share = a_opd.abs().cumsum(dim=1) / a_opd.abs().sum(dim=1, keepdim=True).clamp_min(1e-6)
        weights = (1.0 + self.gamma * (1.0 - share)).detach()
        advantages = weights * a_opd
        loss = -student_actual_logprobs * advantages
        return loss.sum() / valid_mask.sum()
