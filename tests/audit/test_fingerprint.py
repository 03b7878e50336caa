"""Fingerprint: a term's per-sample gradient names its catalog configuration on one batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.fingerprint import Fingerprinter, candidate_configs  # noqa: E402
from klaudit.audit.measure import fingerprint_batch, identify_clamped, standard_problems  # noqa: E402
from klaudit.audit.surrogates import build_surrogate  # noqa: E402
from klaudit.catalog import CATALOG, Aggregation, Config, Estimator, Objective, Returns, Sampling  # noqa: E402


@pytest.fixture(scope="module")
def on_policy():
    problem = standard_problems(count=1, transformer=False)[0]
    return Fingerprinter(fingerprint_batch(problem, 16, seed=0))


@pytest.fixture(scope="module")
def off_policy():
    problem = standard_problems(off_policy=True, count=1, transformer=False)[0]
    return Fingerprinter(fingerprint_batch(problem, 16, seed=0), off_policy=True)


def _summed(config: Config, factor: float = 1.0):
    surrogate = build_surrogate(config)
    return lambda batch: factor * surrogate(batch).sum()


ON_POLICY_ROWS = [row for row in CATALOG if row.config is not None and row.config.sampling is Sampling.ON_POLICY
                  and row.config.aggregation in (Aggregation.SUM, Aggregation.SEQ_MEAN)
                  and row.config.returns is not Returns.NOWHERE]  # no per-sample gradient to name: row 1c


def test_a_term_without_gradient_is_named_by_no_row(on_policy):
    """Row 1c (a detached estimate added to the loss) has no per-sample gradient: the fingerprint names no
    configuration for it (check-grad reads that row from autograd, tests/audit/test_runner.py)."""
    [row] = [r for r in CATALOG if r.config is not None and r.config.returns is Returns.NOWHERE]
    assert on_policy.identify(_summed(row.config)) is None


@pytest.mark.parametrize("row", [r for r in ON_POLICY_ROWS if r.config.aggregation is Aggregation.SUM],
                         ids=lambda row: row.label)
def test_every_row_is_named_by_its_own_class(on_policy, row):
    """A catalog surrogate is identified as itself or as a row with the same per-sample gradient,
    which has the same objective and the same verdict."""
    match = on_policy.identify(_summed(row.config))
    assert match is not None
    assert match.scale == pytest.approx(1.0, rel=1e-9)
    assert match.row.objective is row.objective
    assert match.row.unbiased is row.unbiased
    assert (match.row.rule is None) is (row.rule is None)


def test_classes_are_named_by_the_first_row(on_policy):
    """k1+, k3+, ratio*k3 and a same-token k1 reward have k2's per-sample gradient (kl-math.md 3.2)."""
    for estimator in (Estimator.K1_ST, Estimator.K3_ST, Estimator.RATIO_K3):
        assert on_policy.identify(_summed(Config(loss=estimator))).row.label == "k2 as loss"
    local = Config(reward=Estimator.K1, returns=Returns.LOCAL)
    assert on_policy.identify(_summed(local)).row.label == "k2 as loss"
    k2_future = Config(loss=Estimator.K2, reward=Estimator.K1, returns=Returns.FUTURE)
    assert on_policy.identify(_summed(k2_future)).row.label == "k1 in reward, reward-to-go"


def test_clamped_k3_is_told_from_k3(on_policy):
    """The batch holds the most extreme log-ratios, so verl's clamps act and the rows differ."""
    assert on_policy.identify(_summed(Config(loss=Estimator.K3))).row.label == "k3 as loss"
    assert on_policy.identify(_summed(Config(loss=Estimator.LOW_VAR_KL))).row.label == "low_var_kl (clamped k3) as loss"


def test_a_whole_sequence_reward_summed_over_every_position_is_not_read_as_clamped(on_policy):
    """diegomrodrigues2/qwen3_from_scratch (forty-fifth set) sums the log-ratio over every position, padding too:
    `(logp - ref).sum(-1)` as each response's k1 reward (row 6). Padding holds no log-ratio on the fingerprint batch,
    nor on the far one, so the term is that row's there as well and no clamp is inferred (it was KL010)."""
    def unmasked(batch):
        value = (batch.logprobs - batch.ref_logprobs).sum(-1)
        return (value.detach() * (batch.logprobs * batch.mask).sum(-1)).sum()

    match, clamped = identify_clamped(unmasked, on_policy, rtol=1e-9, aggregation=Aggregation.SUM)
    assert match.row.label == "k1 in reward, whole-sequence return" and clamped is None
    clamp = lambda batch: (batch.logprobs - batch.ref_logprobs).clamp(-20, 20)  # noqa: E731
    def clamped_sum(batch):
        return (clamp(batch).sum(-1).detach() * (batch.logprobs * batch.mask).sum(-1)).sum()

    assert identify_clamped(clamped_sum, on_policy, rtol=1e-9, aggregation=Aggregation.SUM)[1] == "far"


def test_scale_is_recovered_and_only_positive(on_policy):
    match = on_policy.identify(_summed(Config(loss=Estimator.K3), factor=0.04))
    assert match.row.label == "k3 as loss" and match.scale == pytest.approx(0.04, rel=1e-9)
    bonus = on_policy.identify(_summed(Config(reward=Estimator.K1), factor=-1.0))
    assert bonus.row.rule == "KL011"


def test_length_weights_are_seen(on_policy):
    config = Config(reward=Estimator.K1)
    surrogate = build_surrogate(config)
    match = on_policy.identify(lambda batch: (surrogate(batch) / batch.lengths).mean())
    assert match.config.aggregation is Aggregation.SEQ_MEAN
    assert match.row.rule == "KL007" and match.objective is Objective.OTHER
    k1_loss = build_surrogate(Config(loss=Estimator.K1))
    match = on_policy.identify(lambda batch: (k1_loss(batch) / batch.lengths).sum())
    assert match.objective is Objective.LEN  # kl-math.md 5: k1 loss with 1/L is grad E[1/L]
    k3_loss = build_surrogate(Config(loss=Estimator.K3))
    match = on_policy.identify(lambda batch: (k3_loss(batch) / batch.lengths).sum())
    assert match.row.rule == "KL002" and match.objective is Objective.OTHER


def test_batch_aggregation_is_passed_through(on_policy):
    match = on_policy.identify(_summed(Config(reward=Estimator.K1)), aggregation=Aggregation.BATCH_MEAN)
    assert match.config.aggregation is Aggregation.BATCH_MEAN and match.row.unbiased


def test_unknown_terms_match_nothing(on_policy):
    def quartic(batch):
        return (((batch.logprobs - batch.ref_logprobs) * batch.mask) ** 4).sum()

    assert on_policy.identify(quartic) is None
    assert on_policy.identify(lambda batch: batch.ref_logprobs.sum() * 0.0) is None


def test_a_cubic_loss_has_the_per_sample_gradient_of_a_same_token_k2_reward(on_policy):
    """d(delta^3)/d theta = 3 delta^2 grad logp_t: six times the per-sample gradient of k2 = delta^2 / 2 on its own token's
    score, as k2 as a loss is k1 on its own token's score (the fingerprint names the per-sample twin)."""
    def cubic(batch):
        return (((batch.logprobs - batch.ref_logprobs) * batch.mask) ** 3).sum()

    match = on_policy.identify(cubic)
    assert match.config == Config(reward=Estimator.K2, returns=Returns.LOCAL) and abs(match.scale - 6.0) < 1e-9


def test_off_policy_rows(off_policy):
    """Token importance ratios and per-decision weights are told apart; an uncorrected term is KL008."""
    for config in (Config(loss=Estimator.K3, sampling=Sampling.TOKEN_IS),
                   Config(reward=Estimator.K1, sampling=Sampling.PER_DECISION_IS)):
        assert off_policy.identify(_summed(config)).config == config
    uncorrected = off_policy.identify(_summed(Config(reward=Estimator.K1)))
    assert uncorrected.config.sampling is Sampling.OFF_POLICY and uncorrected.row.rule == "KL008"


def test_candidates_cover_each_row_once():
    configs = candidate_configs(off_policy=False)
    assert len(configs) == len(set(configs))
    assert all(config.sampling is Sampling.ON_POLICY for config in configs)
    assert {dataclasses.replace(c, aggregation=Aggregation.SUM) for c in configs} >= {
        r.config for r in ON_POLICY_ROWS if r.config.aggregation is Aggregation.SUM}


def test_an_on_policy_verdict_does_not_give_an_off_policy_objective(off_policy):
    """Off-policy k2 as a loss is judged by its estimator (KL003, row 3), but with samples from pi_old
    its exact expected gradient is no target at all (row 22): the match must say OTHER, not PART."""
    from klaudit.audit.exact import match_objective

    config = Config(loss=Estimator.K2)
    match = off_policy.identify(_summed(config))
    assert match.config.sampling is Sampling.OFF_POLICY and match.row.rule == "KL003"
    assert match.objective is Objective.OTHER
    problem = standard_problems(off_policy=True, count=1, transformer=False)[0]
    gradient = problem.exact.expected_gradient(build_surrogate(config), aggregation=Aggregation.SUM,
                                               off_policy=True)
    assert match_objective(gradient, problem.targets, proportional=True) is Objective.OTHER


# ----- the log-probs as a leaf of their own: the chain rule, and the comparison in the row basis -----


def _through_log_softmax(objective, batch_factory):
    """d objective / d logits by autograd through log_softmax(logits)[y], the log-probs computed from the logits
    leaf (how the fingerprint took it before the log-probs were a leaf of their own), float64, zero at padding."""
    from klaudit.audit.fingerprint import _token_logprobs

    batch = batch_factory()
    leaf = batch.logits.detach().requires_grad_(True)
    value = objective(dataclasses.replace(batch, logits=leaf, logprobs=_token_logprobs(leaf, batch.tokens)))
    (gradient,) = torch.autograd.grad(value, leaf)
    return gradient.to(torch.float64) * batch.mask.to(torch.float64).unsqueeze(-1)


def _random_batch(vocabulary: int = 300):
    from klaudit.audit.fingerprint import leaf_batches

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, vocabulary, generator=generator, dtype=torch.float64)
    tokens = torch.randint(0, vocabulary, (3, 5), generator=generator)
    mask = (torch.arange(5).unsqueeze(0) < torch.tensor([[5], [3], [4]])).to(torch.float64)
    return leaf_batches(tokens, mask, logits, logits + torch.randn(logits.shape, generator=generator,
                                                                     dtype=torch.float64))


@pytest.mark.parametrize("reads_logits", [False, True])
def test_the_two_leaves_give_the_chain_rule_gradient(reads_logits):
    """a (e_y - p) + D from the separate leaves equals autograd through log_softmax, for a term of the log-probs
    alone (D is None) and for one that also reads the logits (the exact per-step KL)."""
    from klaudit.audit.fingerprint import gradient_parts, logits_gradient

    full_kl = build_surrogate(Config(loss=Estimator.FULL))
    k3 = build_surrogate(Config(loss=Estimator.K3))
    objective = (lambda batch: (full_kl(batch) + k3(batch)).sum()) if reads_logits else (lambda batch: k3(batch).sum())
    batches = _random_batch()
    _, direct = gradient_parts(objective, batches)
    assert (direct is None) is not reads_logits
    expected = _through_log_softmax(objective, batches)
    torch.testing.assert_close(logits_gradient(objective, batches), expected, rtol=0, atol=1e-13)


def test_the_comparison_in_the_row_basis_is_the_entry_by_entry_one(monkeypatch):
    """A term of the log-probs alone is compared with the catalog through its coefficients (SpanGradient); on a
    batch of a vocabulary of 300 every catalog row, and a few terms no row matches, get the same match, scale
    and relative error as the entry-by-entry comparison of the gradient taken through log_softmax."""
    from klaudit.audit.fingerprint import FullGradient, SpanGradient

    batches = _random_batch()
    terms = [_summed(row.config, 0.3) for row in ON_POLICY_ROWS] + [
        lambda batch: (((batch.logprobs - batch.ref_logprobs) * batch.mask) ** 3).sum(),
        lambda batch: -(batch.logprobs * batch.mask).sum()]
    in_basis = Fingerprinter(batches)
    entry_by_entry = Fingerprinter(batches)
    monkeypatch.setattr(entry_by_entry, "user_gradient", lambda objective: FullGradient(
        entry_by_entry.basis, _through_log_softmax(objective, batches)))
    spans = 0
    for term in terms:
        spans += isinstance(in_basis.user_gradient(term), SpanGradient)
        found, expected = in_basis.identify(term), entry_by_entry.identify(term)
        assert (found is None) is (expected is None)
        if found is not None:
            assert (found.config, found.twins) == (expected.config, expected.twins)
            assert found.scale == pytest.approx(expected.scale, rel=1e-12)
            assert found.relative_error == pytest.approx(expected.relative_error, abs=1e-9)
    assert spans > len(terms) // 2  # most catalog rows read the log-probs alone


def test_a_span_gradient_measures_as_its_vocabulary_entries_do():
    """SpanGradient's projections, norm and residuals against any a (e_y - p) + b d + c f equal those of the same
    gradient written out over the vocabulary (FullGradient), for a gradient and coefficients drawn at random."""
    from klaudit.audit.fingerprint import FullGradient, RowBasis, SpanGradient, with_score

    basis = RowBasis(_random_batch())
    generator = torch.Generator().manual_seed(5)
    score, a, b, c = (torch.randn(basis.mask.shape, generator=generator, dtype=torch.float64) * basis.mask
                      for _ in range(4))
    coefficients = torch.stack([a, b, c])
    span = SpanGradient(basis, score)
    full = FullGradient(basis, with_score(None, score, basis.probs, basis.tokens.squeeze(-1)))
    torch.testing.assert_close(span.projections(), full.projections(), rtol=0, atol=1e-13)
    assert span.squared_norm() == pytest.approx(full.squared_norm(), rel=1e-12)
    for scale in (0.5, 2.0):
        assert span.residual_norm(scale, coefficients) == pytest.approx(full.residual_norm(scale, coefficients),
                                                                         rel=1e-10)
    assert span.residual_norm(2.0, torch.stack([score / 2.0, 0 * b, 0 * c])) == pytest.approx(0.0, abs=1e-14)


def test_the_row_basis_gram_matrix_is_that_of_its_directions_over_the_vocabulary():
    """RowBasis's per-row Gram matrix equals the inner products of e_y - p, p (log p - log q - KL_t) and p - q
    written out over the vocabulary, and a catalog row's coefficients rebuild its gradient through log_softmax
    (the exact forward KL's row too, whose logits gradient is p - q)."""
    from klaudit.audit.fingerprint import RowBasis, _weighted, logits_gradient, with_score

    batches = _random_batch()
    basis = RowBasis(batches)
    along_token = with_score(None, torch.ones_like(basis.mask), basis.probs, basis.tokens.squeeze(-1))
    vectors = torch.stack([along_token, *basis.directions], -1)  # [N, T, V, 3]
    torch.testing.assert_close(torch.einsum("ntvi,ntvj->ntij", vectors, vectors), basis.gram, rtol=0, atol=1e-12)
    for estimator in (Estimator.FULL, Estimator.FULL_FORWARD, Estimator.K3):
        objective = _weighted(Config(loss=estimator))
        rebuilt = torch.einsum("ntvi,int->ntv", vectors, basis.coefficients(objective)) * basis.mask.unsqueeze(-1)
        torch.testing.assert_close(rebuilt, logits_gradient(objective, batches), rtol=0, atol=1e-12)


def test_a_model_batch_gives_the_rows_of_the_entry_by_entry_comparison(tmp_path, monkeypatch):
    """check-grad --model on a causal LM of a vocabulary of 40: verl's kl_penalty, all its switch values, and the
    exact-KL loss (which reads the logits) get every field of every row as when each term's gradient is taken
    through log_softmax and compared entry by entry, and the verdicts of the tabular batch (test_runner proves
    them by enumeration)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from klaudit.audit.fingerprint import FullGradient
    from klaudit.audit.runner import Target, audit_target

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(tmp_path)
    data = Path(__file__).parent / "data"
    targets = [Target(path=str(data / "verl_style.py"), qualname="kl_penalty"),
               Target(path=str(data / "correct_estimators.py"), qualname="rb_kl_loss")]
    in_basis = [audit_target(target, model_dir=str(tmp_path)) for target in targets]
    tabular = [audit_target(target) for target in targets]
    monkeypatch.setattr(Fingerprinter, "user_gradient", lambda self, objective: FullGradient(
        self.basis, _through_log_softmax(objective, self.batch_factory)))
    entry_by_entry = [audit_target(target, model_dir=str(tmp_path)) for target in targets]
    for found, expected, enumerated in zip(in_basis, entry_by_entry, tabular):
        assert not found.errors and len(found.results) == len(expected.results) > 0
        assert found.to_dict() == expected.to_dict()
        assert ([(row.mode, row.placement, row.objective, row.unbiased, row.rule) for row in found.results]
                == [(row.mode, row.placement, row.objective, row.unbiased, row.rule) for row in enumerated.results])


def test_the_model_batch_samples_from_the_cached_prefix_as_from_the_whole_one(tmp_path):
    """batch_from_model draws each token from the logits of the model's cached prefix: the same responses as
    drawing it from a forward pass over the whole prefix, with the same seeded generator."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from klaudit.audit.fingerprint import batch_from_model

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0)).eval()
    model.save_pretrained(tmp_path)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.zeros((4, 1), dtype=torch.long)
    with torch.no_grad():
        for _ in range(8):
            logits = model(input_ids=tokens).logits[:, -1, :].to(torch.float64)
            tokens = torch.cat([tokens, torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)], 1)
        whole_prefix = model(input_ids=tokens[:, :-1]).logits.to(torch.float64)
    batch = batch_from_model(str(tmp_path), size=4, horizon=8, seed=0)()
    assert torch.equal(batch.tokens, tokens[:, 1:])
    torch.testing.assert_close(batch.logits, whole_prefix, rtol=0, atol=0)


@pytest.mark.parametrize("fingerprinter", ["on_policy", "off_policy"])
def test_seq_token_mean_coefficients_are_the_differentiated_ones(fingerprinter, request):
    """The basis divides a token-sum configuration's coefficients by each sequence's length for its seq-token-mean
    twin instead of differentiating it: the same coefficients as autograd through the 1/L weighting."""
    from klaudit.audit.fingerprint import _weighted

    fingerprinter = request.getfixturevalue(fingerprinter)
    derived = [index for index, config in enumerate(fingerprinter._configs)
               if config.aggregation is Aggregation.SEQ_MEAN]
    assert derived
    for index in derived:
        coefficients = fingerprinter.basis.coefficients(_weighted(fingerprinter._configs[index]))
        assert coefficients.abs().max() > 0
        torch.testing.assert_close(fingerprinter._coefficients[index], coefficients, rtol=1e-12, atol=1e-15)
