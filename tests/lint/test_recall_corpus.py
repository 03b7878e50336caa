"""Constructs of the development corpus that once hid a KL term or its aggregation from the analysis.

Each snippet is written for this test in the shape of a corpus occurrence (a Triton/cuTile kernel,
verl's and OpenRLHF's aggregators, NeMo's importance-weighted KL) and spells a row of kl-math.md
section 8: k3 as a loss (row 3, KL002), ratio*k3 (row 2, KL003), a per-sequence token-mean (row
21, KL007). The twin that keeps the construct and removes the pitfall gives nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from snippets import module_codes

from klaudit.catalog import Aggregation
from klaudit.lint import algebra as alg
from klaudit.lint.algebra import Atom, Poly
from klaudit.lint.facts import MAX_ALTERNATIVES, bounded, tensor


def codes(source: str, tmp_path: Path) -> list:
    return module_codes(source, tmp_path)


# A forward kernel that computes the sampled token's log-prob by hand: a running max and sum over
# chunks of logits (`tl.max(x, 0)` is a reduction along an axis, not an elementwise max with 0),
# then `x * inv_temp - lse`. Numbers times values the analysis cannot explain explain nothing, so
# the name `logp` gives the policy's log-prob.
KERNEL = """\
    import triton
    import triton.language as tl


    @triton.jit
    def grpo_fwd(LOGITS, REF_LOGP, IDS, LOSS, KL, TEMPERATURE, BETA: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        inv_temp = 1.0 / TEMPERATURE
        m_i = float("-inf")
        l_i = 0.0
        for start in tl.static_range(0, N, BLOCK):
            logits = tl.load(LOGITS + row * N + start + tl.arange(0, BLOCK)).to(tl.float32) * inv_temp
            new_m = tl.maximum(m_i, tl.max(logits, 0))
            l_i = l_i * tl.exp(m_i - new_m) + tl.sum(tl.exp(logits - new_m), 0)
            m_i = new_m
        lse = m_i + tl.log(l_i)
        x = tl.load(LOGITS + row * N + tl.load(IDS + row)).to(tl.float32) * inv_temp
        logp = x - lse
        per_token_loss = -logp
        ref_logp = tl.load(REF_LOGP + row).to(tl.float32)
        kl = tl.exp(ref_logp - logp) - (ref_logp - logp) - 1
"""


def test_a_kernel_that_adds_k3_to_its_per_token_loss(tmp_path):
    source = KERNEL + """\
        per_token_loss += BETA * kl
        tl.store(KL + row, kl)
        tl.store(LOSS + row, per_token_loss)
    """
    assert codes(source, tmp_path) == [(22, "KL002")]


def test_a_kernel_that_only_stores_the_kl_value_has_no_verdict(tmp_path):
    # the stored value's use is outside the kernel: at most the informational KL100
    source = KERNEL + """\
        tl.store(KL + row, kl)
        tl.store(LOSS + row, per_token_loss)
    """
    assert [code for _, code in codes(source, tmp_path) if code != "KL100"] == []


def test_a_number_times_an_unexplained_value_is_not_a_number():
    from klaudit.lint.arithmetic import _constant
    from klaudit.lint.facts import UNKNOWN

    assert _constant(tensor(Poly.const(0.5)))
    assert not _constant(UNKNOWN)
    assert not _constant(tensor(Poly.atom(Atom(alg.POLICY, True))))


# verl's agg_loss shape: the mode is a switch, and the per-sequence token count is held in a
# variable named like a mask (`seq_mask = mask.sum(-1)`): a length, whatever its name says.
AGG = """\
    import torch


    def agg_loss(loss_mat, loss_mask, loss_agg_mode):
        if loss_agg_mode == "token-mean":
            return (loss_mat * loss_mask).sum() / loss_mask.sum()
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        return seq_losses.mean()


    def update(config, logp, ref_logp, mask, pg_loss):
        loss_agg_mode = config.loss_agg_mode
"""


def test_a_length_held_under_a_mask_name_divides_per_sequence(tmp_path):
    source = AGG + """\
        kl = 0.5 * (logp - ref_logp) ** 2
        kl_loss = agg_loss(kl, mask, loss_agg_mode)
        loss = pg_loss + kl_loss
        loss.backward()
    """
    assert codes(source, tmp_path) == [(15, "KL003"), (15, "KL007")]


def test_a_k1_reward_to_go_through_the_same_aggregator_gives_only_the_length_weight(tmp_path):
    source = AGG + """\
        kl = (logp - ref_logp).detach()
        kl_term = logp * kl.flip(-1).cumsum(-1).flip(-1)
        kl_loss = agg_loss(kl_term, mask, loss_agg_mode)
        loss = pg_loss + kl_loss
        loss.backward()
    """
    assert codes(source, tmp_path) == [(16, "KL007")]


# OpenRLHF's shape: the aggregator is re-exported by its package's __init__ (which has no KL
# vocabulary) and called with the rest of its options spread from a dict (`**loss_batch_info`): a
# None default may be overridden by the spread dict, so `if global_batch_size is None:` decides nothing.
PACKAGE_LOSS = """\
\"\"\"Losses of the trainer: policy, value and KL terms.\"\"\"
import torch


def aggregate_loss(loss, loss_mask, token_level_loss=True, global_batch_size=None):
    if token_level_loss:
        return (loss * loss_mask).sum() / loss_mask.sum()
    token_counts = loss_mask.sum(dim=-1)
    seq_loss = (loss * loss_mask).sum(dim=-1) / (token_counts + 1e-8)
    if global_batch_size is None:
        return seq_loss.mean()
    return seq_loss.sum() / global_batch_size
"""


def _package(tmp_path: Path) -> None:
    package = tmp_path / "models"
    package.mkdir()
    (package / "__init__.py").write_text("from .loss import aggregate_loss\n\n__all__ = [\"aggregate_loss\"]\n")
    (package / "loss.py").write_text(PACKAGE_LOSS)


def test_an_aggregator_re_exported_by_a_package_and_called_with_spread_options(tmp_path):
    _package(tmp_path)
    source = """\
        from models import aggregate_loss


        def train_step(log_probs, ref_log_probs, action_mask, actor_loss, loss_batch_info):
            kl = torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1
            kl_loss = aggregate_loss(kl, action_mask, **loss_batch_info)
            loss = actor_loss + kl_loss
            loss.backward()
        """
    found = codes(source, tmp_path)
    assert found == [(6, "KL002"), (6, "KL007")]


def test_a_spread_dict_the_analysis_knows_binds_its_keys(tmp_path):
    _package(tmp_path)
    source = """\
        from models import aggregate_loss


        def train_step(log_probs, ref_log_probs, action_mask, actor_loss):
            kl = torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1
            options = {"token_level_loss": True}
            kl_loss = aggregate_loss(kl, action_mask, **options)
            loss = actor_loss + kl_loss
            loss.backward()
        """
    assert codes(source, tmp_path) == [(7, "KL002")]


# NeMo's shape: the KL is weighted by exp(logp - sg logp) (value 1, gradient the score), and the
# helper keeps the weight's gradient only where the log-ratio was not clamped:
# `where(logr != clamped, w.detach(), w)` is w with its gradient cut on the clamped tokens.
WEIGHTED = """\
    import torch


    def calculate_kl(logprobs, logprobs_reference, weights, clamp_value=20.0):
        logr = logprobs_reference - logprobs
        logr_clamped = logr.clamp(min=-clamp_value, max=clamp_value)
        weights = torch.where(logr != logr_clamped, weights.detach(), weights)
        kl = torch.exp(logr_clamped) - 1 - logr_clamped
        return weights * kl


    def loss_fn(curr_logprobs, data, mask, actor_loss):
        reference_logprobs = data["reference_policy_logprobs"]
        weights = torch.exp(curr_logprobs - curr_logprobs.detach())
        kl = calculate_kl(curr_logprobs, reference_logprobs, weights)
        kl = (kl * mask).sum() / mask.sum()
        loss = actor_loss + kl
"""


def test_a_weight_detached_on_clamped_tokens_keeps_its_gradient(tmp_path):
    # ratio*k3 (row 2, KL003) and a clamp (KL010), never a plain k3 loss (KL002)
    assert codes(WEIGHTED, tmp_path) == [(17, "KL003"), (17, "KL010")]


def test_an_enum_member_selects_the_aggregation_like_a_flag(tmp_path):
    source = WEIGHTED.replace("""        kl = (kl * mask).sum() / mask.sum()
""", """        if self_loss_type == LossType.TOKEN_LEVEL:
            kl = (kl * mask).sum() / mask.sum()
        else:
            kl = ((kl * mask).sum(-1) / mask.sum(-1)).mean()
""").replace("def loss_fn(curr_logprobs,", "def loss_fn(self_loss_type, curr_logprobs,")
    assert codes(source, tmp_path) == [(20, "KL003"), (20, "KL007"), (20, "KL010")]


def test_the_current_policys_log_probs_read_with_get_carry_gradient(tmp_path):
    source = WEIGHTED.replace('weights = torch.exp(curr_logprobs - curr_logprobs.detach())',
                              'unfiltered = data.get("curr_logprobs_unfiltered")\n'
                              '        weights = torch.exp(unfiltered - unfiltered.detach())')
    assert codes(source, tmp_path) == [(18, "KL003"), (18, "KL010")]


def test_widening_keeps_a_witness_of_each_kl_use_before_policy_gradient_variants():
    # a KL term added to many variants of the policy-gradient loss: past the bound, the variants that
    # differ only in their policy-gradient part give way to the KL use that differs (its aggregation)
    d = Poly.atom(Atom(alg.DELTA, True))
    k2 = alg.mul(d, d)
    variants = [tensor(alg.add(k2, Poly.atom(Atom(alg.POLICY, True), -(i + 1.0))), origin="kl", labels=(("s", (i,)),))
                for i in range(MAX_ALTERNATIVES)]
    per_sequence = replace(variants[0], aggregation=Aggregation.SEQ_MEAN, labels=(("mode", ("seq",)),))
    kept = bounded(tuple(variants) + (per_sequence,))
    assert len(kept) <= MAX_ALTERNATIVES
    assert any(f.aggregation is Aggregation.SEQ_MEAN for f in kept)


# TRL's GKD shape: the reverse KL(student || teacher) over the vocabulary, elementwise, its positions
# flattened by a label mask and summed over every axis at once: the exact per-step KL summed over
# the tokens. As a loss on sequences the student samples it gives only the local gradient (row 2,
# KL003); the forward KL(teacher || student), no estimator of the reverse KL, gets no verdict.
DISTILL = """\
    import torch
    import torch.nn.functional as F


    def divergence_loss(student_logits, teacher_logits, labels):
        student_log_probs = F.log_softmax(student_logits, dim=-1)
        teacher_log_probs = F.log_softmax(teacher_logits, dim=-1)
        divergence = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
        divergence = divergence[labels != -100]
        return divergence.sum() / (labels != -100).sum()


    class Distiller:
        def __init__(self, student, teacher):
            self.student = student
            self.teacher = teacher

        def train_step(self, prompts):
            sequences, labels = self.student.generate(prompts, do_sample=True)
            student_logits = self.student(sequences).logits
            with torch.no_grad():
                teacher_logits = self.teacher(sequences).logits
            loss = divergence_loss(student_logits, teacher_logits, labels)
            loss.backward()
"""


def test_a_vocabulary_kl_summed_over_every_axis_on_student_samples(tmp_path):
    assert codes(DISTILL, tmp_path) == [(10, "KL003")]


def test_the_forward_kl_to_a_teacher_is_distillation_and_to_the_reference_row_3b(tmp_path):
    # the exact forward KL(teacher || student) is forward-KL distillation, an objective of its own (at most the
    # informational KL100); taken against the reference it is row 3b's KL002 where the loss also trains on rewards
    source = DISTILL.replace("F.kl_div(teacher_log_probs, student_log_probs,", "F.kl_div(student_log_probs, teacher_log_probs,")
    assert [code for _, code in codes(source, tmp_path) if code != "KL100"] == []
    toward_reference = source.replace("teacher", "ref")
    assert [code for _, code in codes(toward_reference, tmp_path) if code != "KL100"] == []
    penalised = toward_reference.replace(
        "    loss = divergence_loss(student_logits, ref_logits, labels)",
        "    loss = self.pg_loss(sequences, self.rewards(sequences)) + divergence_loss(student_logits, ref_logits, labels)")
    assert codes(penalised, tmp_path) == [(10, "KL002")]
