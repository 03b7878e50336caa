"""The Monte-Carlo audit against the exact one, on a policy small enough for both.

The toy is a tabular policy (V = 4 with EOS, T = 4; reference seed 0) placed at KL_seq = 3 nats, where
every biased on-policy token-sum catalog row is biased by at least 7.9% of |REV| (kl-math.md 4.3: nearer the
reference the biases shrink). The smallest is low_var_kl loss + low_var_kl reward (KL010): its clamps act on
tokens with pi < ref / 13.6, which the policy itself draws rarely, but the audit draws from the proposal
0.8 pi + 0.2 ref, so those tokens are sampled (and weighted back), and the exact verdict and the Monte-Carlo
one rest on the same tokens. For every such row the exact expected gradient (enumeration, float64) gives the
verdict; the Monte-Carlo audit at the sample size it chooses itself (a pilot of 256, here 1000 samples)
must give the same verdict on every row, biased at p < 1e-6 and no false positive. Over the six sampler
seeds 0..5 the smallest z of a biased row was 10.5 (KL010; the others above 24) and the largest z of an
unbiased row 2.4, so the verdicts do not hang on the seed; the test runs seeds 0..2.

The statistical parts are exact identities checked by enumeration (the control variates' zero mean, the
importance weights, the reference's gradient), and the null distribution of z is checked over 24 seeds.
That check is loose on purpose: over 200 seeds the z's of k3 loss + k3 reward have sd 1.32, not 1 (its
terms ref/pi are heavy even under the proposal), and 3 of 200 fell below p = 1e-6 (README).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit import montecarlo  # noqa: E402
from klaudit.audit.batch import Batch  # noqa: E402
from klaudit.audit.bind import Binding, Role  # noqa: E402
from klaudit.audit.exact import ExactProblem, positive_multiple, relerr  # noqa: E402
from klaudit.audit.fingerprint import leaf_batches, logits_gradient  # noqa: E402
from klaudit.audit.policies import TabularPolicy, place_at_kl  # noqa: E402
from klaudit.audit.surrogates import build_surrogate  # noqa: E402
from klaudit.audit.variates import VariateBasis, knots_from  # noqa: E402
from klaudit.catalog import CATALOG, Aggregation, Sampling, Target  # noqa: E402

ROWS = {row.label: row for row in CATALOG if row.config is not None and row.config.sampling is Sampling.ON_POLICY
        and row.config.aggregation is Aggregation.SUM}
CLAMP_ROW = "low_var_kl loss + low_var_kl reward (R-C with clamps)"
# The unbiased rows with distinct per-sample gradients (their twins, e.g. k2 loss + later k1, add nothing).
NULL_ROWS = ("k1 in reward, reward-to-go", "k1 in reward, whole-sequence return",
             "k3 as loss + k3 in reward, reward-to-go", "k1 left undetached in the advantage (kl-rb, Monte Carlo)",
             "exact KL left undetached in the advantage (kl-rb, Rao-Blackwellized)")


@pytest.fixture(autouse=True)
def one_thread():
    """The toy's tensors are tiny: more threads only contend for a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def toy():
    reference = TabularPolicy.random(4, 4, eos=True, seed=0)
    return place_at_kl(reference, 3.0, seed=0, rtol=0.02), reference


def catalog_row(logprobs, ref_logprobs, mask, logits, ref_logits, row="k1 as loss"):
    """A catalog row's per-sequence surrogate, written as a user's KL loss over a batch's tensors."""
    return build_surrogate(ROWS[row].config)(Batch(logprobs, ref_logprobs, mask, logits, ref_logits))


def _binding(rows) -> Binding:
    return Binding({"logprobs": Role.LOGPROBS, "ref_logprobs": Role.REF_LOGPROBS, "mask": Role.MASK,
                    "logits": Role.LOGITS, "ref_logits": Role.REF_LOGITS, "row": Role.SWITCH}, {"row": tuple(rows)})


# ----- the identities the test statistic rests on, by enumeration -----


def _every_response(toy):
    """The enumeration of the toy's responses with pi(y), features (one-hot prefix) and the VariateBasis."""
    policy, reference = toy
    exact = ExactProblem(policy, reference)
    with torch.no_grad():
        batch = exact.batch()
        probabilities = (batch.logprobs * batch.mask).sum(-1).exp()
        features = torch.nn.functional.one_hot(policy.prefix_index(exact.tokens), policy.num_prefixes).double()
        basis = VariateBasis(batch.logits, batch.ref_logits, exact.tokens, exact.mask,
                             knots_from(torch.linspace(-3, 3, 50, dtype=torch.float64)))
    return exact, probabilities, features, basis


def test_every_control_variate_has_mean_zero_under_the_policy(toy):
    """E_pi of each variate's head gradient is 0 to rounding (float64 enumeration): subtracting any fixed
    combination keeps the mean of the user's gradient."""
    _, probabilities, features, basis = _every_response(toy)
    variates = basis.coefficients.shape[-1]
    assert variates == 3 * basis.knots.numel() + 2 * features.shape[1]
    for j in range(variates):
        beta = torch.zeros(variates, dtype=torch.float64)
        beta[j] = 1.0
        vectors = basis.combination(beta)
        mean = torch.einsum("n,ntv,ntf->vf", probabilities, vectors, features)
        assert mean.abs().max() < 1e-12, j
        assert vectors.abs().max() > 1e-3, j  # and it is not the zero vector


def test_the_variate_algebra_equals_the_vectors_it_stands_for(toy):
    """The scatter-built Gram matrix, projections and combinations equal those of the basis written out."""
    _, _, _, basis = _every_response(toy)
    count = basis.knots.numel()
    score = torch.nn.functional.one_hot(basis.tokens.squeeze(-1), basis.p.shape[-1]).double() - basis.p
    hats = torch.stack([basis.hat_function(torch.eye(count, dtype=torch.float64)[k].expand(*basis.mask.shape, count))
                        for k in range(count)], -1)
    vectors = torch.cat([score.unsqueeze(-1), basis.p.unsqueeze(-1) * (hats - basis.hat_means.unsqueeze(-2))], -1)
    assert torch.allclose(torch.einsum("ntva,ntvb->ntab", vectors, vectors), basis.gram, atol=1e-12)
    x = torch.randn(basis.p.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(torch.einsum("ntva,ntv->nta", vectors, x), basis.projections_of(x), atol=1e-12)
    beta = torch.randn(basis.coefficients.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    written_out = torch.einsum("ntva,ntaj,j->ntv", vectors, basis.coefficients, beta)
    assert torch.allclose(written_out, basis.combination(beta), atol=1e-12)


def test_the_importance_weights_move_the_proposal_to_the_policy(toy):
    """proposal(y) w(y) = pi(y) for every response: weighted proposal draws estimate expectations under pi."""
    sampler = montecarlo.TabularSampler(*toy)
    exact, probabilities, features, _ = _every_response(toy)
    logits, ref_logits = sampler.logits(features)
    weights = montecarlo.proposal_log_weights(logits, ref_logits, exact.tokens, exact.mask).exp()
    assert torch.allclose(sampler.probabilities * weights, probabilities, rtol=1e-12, atol=0)
    assert weights.max() <= (1 - montecarlo.MIX) ** -exact.horizon * (1 + 1e-12)


def test_the_reference_gradient_is_kl_penalty_rb_and_user_gradients_are_autograds(toy):
    """The closed forms the audit uses: R-D's logits gradient c (e_y - p) + m dKL/dlogits, and a term's
    gradient through the log-probs and the logits as leaves, against autograd through log_softmax."""
    sampler = montecarlo.TabularSampler(*toy, seed=3)
    draw = sampler.draw(64)
    local = montecarlo._Local(draw, sampler, knots_from(torch.randn(100, dtype=torch.float64)))
    batches = leaf_batches(draw.tokens, draw.mask, *sampler.logits(draw.features))
    assert torch.allclose(logits_gradient(montecarlo.reference_objective, batches), local.reference, atol=1e-13)
    for label in ("k1 in reward, reward-to-go", "Rao-Blackwellized: exact KL as loss + future exact KL in reward"):
        surrogate = build_surrogate(ROWS[label].config)
        difference = montecarlo._Difference(local, montecarlo._Row(None, "loss", surrogate, surrogate))
        expected = logits_gradient(lambda batch, surrogate=surrogate: surrogate(batch).sum(), batches) - local.reference
        assert torch.allclose(difference.vectors(None), expected, atol=1e-13)


# ----- the verdicts against the exact audit -----


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_monte_carlo_agrees_with_the_exact_audit_on_every_row(toy, seed):
    policy, reference = toy
    exact = ExactProblem(policy, reference)
    rev = exact.targets()[Target.REV]
    gradients = {label: exact.expected_gradient(build_surrogate(row.config)) for label, row in ROWS.items()}
    exactly_biased = {label: positive_multiple(gradient, rev) is None for label, gradient in gradients.items()}
    assert exactly_biased[CLAMP_ROW]  # the clamp acts on this toy
    rows, notes, _ = montecarlo.audit(catalog_row, _binding(ROWS), name="catalog", placements=["loss"],
                                      sampler=montecarlo.TabularSampler(policy, reference, seed=seed))
    assert {row.mode["row"] for row in rows} == set(ROWS)
    assert [(row.mode["row"], row.monte_carlo["z"]) for row in rows
            if row.unbiased == exactly_biased[row.mode["row"]]] == []
    samples = rows[0].monte_carlo["samples"]
    assert montecarlo.MIN_SAMPLES <= samples <= 2000 and any(f"{samples} samples, chosen" in note for note in notes)
    assert sum(exactly_biased.values()) >= 25 and sum(not biased for biased in exactly_biased.values()) >= 6
    # The reported relative error estimates the exact one: a ratio of cross products of two halves' means, each
    # unbiased, with a few percent of noise at ~1000 samples; within 25%, plus the noise floor of a zero bias,
    # which is the bias the row could have detected.
    for row in rows:
        exact_error = relerr(gradients[row.mode["row"]], rev)
        tolerance = 0.25 * exact_error + row.monte_carlo["detectable"] + 1e-12
        assert abs(row.rel_err_rev - exact_error) < tolerance, row.mode["row"]
    # An unbiased row says how small a bias it would have caught: about the target the pilot sized N for (the
    # pilot's variance comes from 128 samples, so within a factor 2).
    for row in rows:
        assert row.unbiased or row.verdict.startswith("biased (p = ")
        if row.unbiased and not row.monte_carlo["identical"]:
            assert 0 < row.monte_carlo["detectable"] < 2 * montecarlo.TARGET_RELATIVE_BIAS


def test_z_of_unbiased_rows_is_standard_normal_over_seeds(toy):
    """Under equal means z is a standardized mean of i.i.d. terms: over 24 seeds x 5 rows the z's must look
    N(0, 1). Tolerances for 120 draws: the mean within 0.5 (4.5 standard errors; the rows share samples, so
    the draws are correlated within a seed), the standard deviation within [0.6, 1.5], and no |z| above 4.5
    (P(max |z| > 4.5) < 1e-3 for 120 standard normals)."""
    policy, reference = toy
    z = []
    for seed in range(100, 124):
        rows, _, _ = montecarlo.audit(catalog_row, _binding(NULL_ROWS), name="null", placements=["loss"],
                                      samples=montecarlo.MIN_SAMPLES,
                                      sampler=montecarlo.TabularSampler(policy, reference, seed=seed))
        z += [row.monte_carlo["z"] for row in rows]
    z = torch.tensor(z)
    assert z.numel() == 24 * len(NULL_ROWS)
    assert abs(z.mean()) < 0.5 and 0.6 < z.std() < 1.5 and z.abs().max() < 4.5


def test_identical_per_sample_gradients_read_as_no_bias_with_a_unit_scale(toy):
    """The Rao-Blackwellized row is the reference itself: its difference is rounding, not a bias."""
    rows, _, _ = montecarlo.audit(catalog_row, _binding(["Rao-Blackwellized: exact KL as loss + future exact KL in "
                                                         "reward"]),
                                  name="rb", placements=["loss"], samples=64,
                                  sampler=montecarlo.TabularSampler(*toy, seed=1))
    (row,) = rows
    assert row.unbiased and row.monte_carlo["identical"] and row.monte_carlo["scale"] == pytest.approx(1.0)
    assert row.cos_rev == pytest.approx(1.0) and row.rel_err_rev < 1e-12


def test_too_few_samples_is_refused(toy):
    binding = Binding({"logprobs": Role.LOGPROBS, "ref_logprobs": Role.REF_LOGPROBS, "mask": Role.MASK,
                       "logits": Role.LOGITS, "ref_logits": Role.REF_LOGITS})
    with pytest.raises(ValueError, match="at least 4 samples"):
        montecarlo.audit(catalog_row, binding, name="x", samples=2, sampler=montecarlo.TabularSampler(*toy))


# ----- the command: `check-grad TARGET --model DIR --samples N|auto [--plot FILE.png] [--device cuda]` -----

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def test_the_models_draws_carry_the_importance_weights_of_their_whole_logits(tiny_model):
    """The sampler reads each draw's weight at the drawn token while it samples; the same weight from the full
    logits of the drawn responses (proposal_log_weights over the vocabulary) must agree."""
    transformers = pytest.importorskip("transformers")
    sampler = montecarlo.CausalLMSampler(transformers.AutoModelForCausalLM.from_pretrained(tiny_model), horizon=6)
    draw = sampler.draw(32)
    logits, ref_logits = sampler.logits(draw.features)
    expected = montecarlo.proposal_log_weights(logits, ref_logits, draw.tokens, draw.mask, sampler.mix).exp()
    assert not torch.equal(draw.weights, torch.ones_like(draw.weights))
    torch.testing.assert_close(draw.weights, expected, rtol=1e-12, atol=0.0)


def _check_grad(*args: str):
    from click.testing import CliRunner

    from klaudit.cli import main

    return CliRunner().invoke(main, ["check-grad", *args])


def test_the_command_audits_a_model_by_sampling_and_draws_the_picture(tiny_model, tmp_path):
    pytest.importorskip("matplotlib")
    picture = tmp_path / "kl.png"
    result = _check_grad(f"{DATA}/correct_estimators.py::k1_kl_loss", "--model", str(tiny_model), "--samples", "64",
                         "--plot", str(picture), "--format", "json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["results"]
    assert row["objective"] == "MC" and row["unbiased"] and row["monte_carlo"]["samples"] == 64
    assert "LlamaForCausalLM (V=64" in row["monte_carlo"]["policy"]
    assert picture.read_bytes().startswith(b"\x89PNG")


def test_the_command_chooses_its_sample_size_and_finds_grpos_k3_loss(tiny_model):
    result = _check_grad(f"{DATA}/trl_style.py::grpo_kl_loss", "--model", str(tiny_model), "--samples", "auto")
    assert result.exit_code == 1, result.output
    assert "biased (p = " in result.output and "samples, chosen on a pilot" in result.output


def test_the_command_refuses_incomplete_monte_carlo_requests(tiny_model, monkeypatch):
    target = f"{DATA}/correct_estimators.py::k1_kl_loss"
    refused = _check_grad(target, "--samples", "64")
    assert refused.exit_code == 2 and "--samples needs --model DIR" in refused.output
    refused = _check_grad(target, "--model", str(tiny_model), "--samples", "many")
    assert refused.exit_code == 2 and "neither a number of samples nor 'auto'" in refused.output
    refused = _check_grad(target, "--model", str(tiny_model), "--samples", "3")
    assert refused.exit_code == 2 and "at least 4 samples" in refused.output
    refused = _check_grad(target, "--model", str(tiny_model), "--plot", "x.png")
    assert refused.exit_code == 2 and "--plot needs --samples N" in refused.output
    monkeypatch.setattr("klaudit.audit.picture.matplotlib_importable", lambda: False)
    refused = _check_grad(target, "--model", str(tiny_model), "--samples", "64", "--plot", "x.png")
    assert refused.exit_code == 2 and refused.output.strip().endswith("pip install 'klaudit[plot]'")
    assert len(refused.output.strip().splitlines()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_sampler_keeps_every_tensor_on_the_models_device(tiny_model):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model).to("cuda")
    draw = montecarlo.CausalLMSampler(model, horizon=4).draw(3)
    assert {tensor.device.type for tensor in (draw.tokens, draw.mask, draw.features, draw.weights)} == {"cuda"}


def estimate_table(logprobs, ref_logprobs, mask):
    """Two per-token estimates in a dict, a caller picking one by key (compose-rl's approx_kl)."""
    log_ratio = logprobs - ref_logprobs
    return {"k1": log_ratio * mask, "k3": ((-log_ratio).exp() - 1 + log_ratio) * mask}


def test_each_estimate_of_a_returned_dict_is_sampled_as_its_own_row(toy):
    """k1 in the reward with its reward-to-go is row 6 (unbiased) and k3 as a loss row 3 (biased, PFWD):
    the sampled verdicts agree with the exact ones, entry by entry. Seeded: k3's bias at KL_seq = 3 nats is
    many times the bias 512 samples can detect, and the unbiased row's z is a standard normal draw."""
    policy, reference = toy
    binding = Binding({"logprobs": Role.LOGPROBS, "ref_logprobs": Role.REF_LOGPROBS, "mask": Role.MASK}, {})
    rows, _, _ = montecarlo.audit(estimate_table, binding, name="table", placements=["loss", "reward"], samples=512,
                                  sampler=montecarlo.TabularSampler(policy, reference, seed=0))
    verdicts = {(row.mode["entry"], row.placement): row.unbiased for row in rows}
    assert verdicts[("k1", "reward")] and not verdicts[("k3", "loss")]
