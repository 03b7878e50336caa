"""Shapes of KL code met in the thirtieth fresh set's review.

Verdicts (kl-math.md section 8): k3 differentiated as a loss follows the per-token forward KL (row 3, KL002); a
per-sequence token mean weighs each sequence by 1/L (row 21, KL007); the exact per-step reverse KL (over the whole
vocabulary or over each position's k most likely tokens) as a loss on the policy's own samples gives the local
gradient only (row 2, KL003); the summed k1 of each sequence, detached, in a REINFORCE reward on the summed
log-prob is right (row 6).
"""

from __future__ import annotations

from snippets import module_codes

# a from-scratch trainer's own model class: one method gives the summed log-prob, the per-token log-probs and the
# mask; the policy and the frozen reference are two instances, told apart only by the object the method is called on
TOY_MODEL = """\
import torch


class TinyLM(torch.nn.Module):
    def logits(self, seq):
        hidden, _ = self.gru(self.embed(seq))
        return self.head(hidden)

    def seq_logprob(self, seq):
        logits = self.logits(seq[:, :-1])
        lp = torch.log_softmax(logits, dim=-1)
        tok_lp = lp.gather(-1, seq[:, 1:].unsqueeze(-1)).squeeze(-1)
        mask = (seq[:, 1:] != 0).float()
        return (tok_lp * mask).sum(-1), tok_lp, mask


def reinforce_step(lm, ref, rm, opt, beta):
    seqs = lm.sample(64)
    with torch.no_grad():
        score = rm(seqs)
        lp_ref, _, _ = ref.seq_logprob(seqs)
    lp_pi, _, _ = lm.seq_logprob(seqs)
    shaped = score - beta * (lp_pi.detach() - lp_ref)
    adv = shaped - shaped.mean()
    loss = -(lp_pi * adv).mean()
    opt.zero_grad(); loss.backward(); opt.step()


def grpo_step(lm, ref, opt, adv, beta):
    seqs = lm.sample(64)
    with torch.no_grad():
        _, tok_ref, mask = ref.seq_logprob(seqs)
    _, tok_pi, _ = lm.seq_logprob(seqs)
    log_ratio = tok_ref - tok_pi
    kl = torch.exp(log_ratio) - log_ratio - 1.0
    per_tok = (torch.exp(tok_pi - tok_pi.detach()) * adv.unsqueeze(1) - beta * kl) * mask
    loss = -(per_tok.sum(1) / mask.sum(1)).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def test_a_model_classs_own_method_is_followed_on_the_object_it_is_called_on(tmp_path):
    """`ref.seq_logprob(x)` runs TinyLM.seq_logprob on the reference: its per-token log-probs are the reference's,
    its first result the summed log-prob. The detached summed k1 in the sequence's reward is right (row 6); the
    per-token k3 loss is row 3 (KL002), divided by each sequence's length (row 21, KL007). Before, the names alone
    were read: the summed log-probs as per-token ones (a same-token reward, KL003) and `tok_ref` as nothing."""
    assert module_codes(TOY_MODEL, tmp_path) == [(37, "KL002"), (37, "KL007")]
    # two classes of the module define the method: which one runs is not known, and none is followed
    twice = TOY_MODEL.replace("def reinforce_step(", "class OtherLM:\n    def seq_logprob(self, seq):\n"
                              "        return seq\n\n\ndef reinforce_step(")
    assert all(code != "KL002" for _, code in module_codes(twice, tmp_path))


TOP_K_SELF_DISTILLATION = """\
import torch
import torch.nn.functional as F


def sdpo_loss(student_model, teacher_model, student_batch, teacher_batch, top_k, mask):
    student_logits = student_model(**student_batch).logits
    with torch.no_grad():
        teacher_logits = teacher_model(**teacher_batch).logits
    _, top_k_indices = torch.topk(student_logits, top_k, dim=-1)
    student_topk = torch.gather(student_logits, -1, top_k_indices)
    teacher_topk = torch.gather(teacher_logits, -1, top_k_indices)
    student_log_probs = F.log_softmax(student_topk, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_topk, dim=-1)
    kl_per_token = (student_log_probs.exp() * (student_log_probs - teacher_log_probs)).sum(dim=-1)
    return (kl_per_token * mask).sum() / mask.sum()
"""


def test_logits_gathered_at_the_top_k_tokens_stay_a_slice_of_the_vocabulary(tmp_path):
    """A gather at `torch.topk`'s indices keeps each position's k most likely tokens, not the sampled one: the sum
    over them is the truncated exact reverse KL (row 2, KL003). Before, the gather was read as picking the
    sampled tokens, and the sum as a k1 (KL001)."""
    assert module_codes(TOP_K_SELF_DISTILLATION, tmp_path) == [(15, "KL003")]


ONE_EXAMPLE_AT_A_TIME = """\
import torch
import torch.nn.functional as F


def one_example_distillation_loss(student_model, teacher_model, encoding, prompt_len, completion_len):
    student_logits = student_model(**encoding).logits
    with torch.no_grad():
        teacher_logits = teacher_model(**encoding).logits
    student = student_logits[0, prompt_len - 1:prompt_len - 1 + completion_len, :]
    teacher = teacher_logits[0, prompt_len - 1:prompt_len - 1 + completion_len, :]
    log_p = F.log_softmax(student, dim=-1)
    kl_per_token = (log_p.exp() * (log_p - F.log_softmax(teacher, dim=-1))).sum(dim=-1)
    return kl_per_token.mean()
"""


def test_the_one_sequence_of_a_batch_of_one_is_averaged_over_its_own_tokens(tmp_path):
    """`logits[0, start:end]` is the response of a single example encoded alone: the mean over its positions is that
    sequence's token mean, 1/L for each response trained (row 21, KL007), beside the local gradient (KL003)."""
    assert module_codes(ONE_EXAMPLE_AT_A_TIME, tmp_path) == [(13, "KL003"), (13, "KL007")]
    # the first row taken whole, no response cut out: nothing says the batch holds one sequence
    whole = ONE_EXAMPLE_AT_A_TIME.replace("[0, prompt_len - 1:prompt_len - 1 + completion_len, :]", "[0, :, :]")
    assert module_codes(whole, tmp_path) == [(13, "KL003")]


LENGTHS_ADDED_UP = """\
import torch


def reinforce_step(policy, batch, ref_log_probs, credits, kl_coeff, optimizer):
    total_tokens = 0
    for action_mask in batch.action_masks:
        total_tokens += action_mask.sum()
    log_probs = torch.log_softmax(policy(batch.input_ids).logits, -1).gather(-1, batch.ids[..., None]).squeeze(-1)
    log_ratio = ref_log_probs - log_probs
    kl = (torch.exp(log_ratio) - log_ratio - 1) * batch.mask
    pg = -(log_probs * credits * batch.mask)
    loss = (pg + kl_coeff * kl).sum() / total_tokens
    loss.backward()
    optimizer.step()
"""


def test_each_rows_length_added_up_over_the_batch_is_its_token_count(tmp_path):
    """`total_tokens += action_mask.sum()` over the rows of the batch is the batch's token count, a constant of the
    batch: the k3 loss over it is row 3 (KL002) and no 1/L weighting (KL007). Before, the sum of one row's length
    was kept as that row's length."""
    assert module_codes(LENGTHS_ADDED_UP, tmp_path) == [(12, "KL002")]


MLX_SEQUENCE_KL_IN_THE_ADVANTAGES = """\
import mlx.core as mx


def compute_loss(model, ref_model, input_ids, advantages, loss_mask, kl_coef, kl_clip_max):
    logprobs = get_per_token_logps(model, input_ids)
    ref_logprobs = mx.stop_gradient(get_per_token_logps(ref_model, input_ids))
    k1_seq = ((logprobs - ref_logprobs) * loss_mask).sum(axis=1) / mx.maximum(loss_mask.sum(axis=1), 1.0)
    k1_seq = mx.clip(k1_seq, -kl_clip_max, kl_clip_max)
    adjusted_advantages = advantages - kl_coef * mx.expand_dims(mx.stop_gradient(k1_seq), axis=1)
    per_token = -mx.exp(logprobs - mx.stop_gradient(logprobs)) * adjusted_advantages
    return (per_token * loss_mask).sum() / loss_mask.sum()
"""


def test_a_sequences_mean_k1_folded_into_the_advantages_by_mlx(tmp_path):
    """Each sequence's token-mean k1, clipped and detached, subtracted from every token's advantage (MLX's
    `expand_dims` is an unsqueeze; `adjusted_advantages` are the advantages): the whole-sequence k1 reward divided
    by each sequence's length (row 21, KL007) and clipped (KL010), reported where it enters the advantages. Before,
    `expand_dims` lost the term."""
    assert module_codes(MLX_SEQUENCE_KL_IN_THE_ADVANTAGES, tmp_path) == [(9, "KL007"), (9, "KL010")]


RATIO_TO_THE_REFERENCE_TIMES_MINUS_THE_ADVANTAGES = """\
import torch


def grpo_loss(logprobs, ref_logprobs, rewards, kl_coeff=0.1, clip_range=0.2):
    advantages = (rewards - rewards.mean(dim=-1, keepdim=True)) / rewards.std(dim=-1, keepdim=True)
    ratio = (logprobs - ref_logprobs).exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1 - clip_range, 1 + clip_range)
    policy_loss = torch.max(pg1, pg2).mean()
    kl = (logprobs - ref_logprobs).mean()
    return policy_loss + kl_coeff * kl
"""


def test_minus_the_advantages_times_a_ratio_is_a_policy_gradient_term_not_an_estimator(tmp_path):
    """`-advantages * ratio`, the ratio taken to the reference: a policy-gradient surrogate, whatever KL is added to
    it; the KL is the k1 loss beside it (row 1, KL001). Before, the negated advantages were read as a sign and the
    ratio joined the log-ratio into a reversed k3 added as a bonus (KL009, KL011)."""
    found = module_codes(RATIO_TO_THE_REFERENCE_TIMES_MINUS_THE_ADVANTAGES, tmp_path)
    assert [item for item in found if item[1] != "KL100"] == [(11, "KL001")]  # KL100: the ratio, no estimator
