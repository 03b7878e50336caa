"""Enumerable policies: prefix indexing, padding, seeding, causality, and placement at a KL."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.exact import ExactProblem, sequence_kl  # noqa: E402
from klaudit.audit.policies import TabularPolicy, TinyCausalLM, perturbed, place_at_kl  # noqa: E402


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def _row_of(prefix: tuple[int, ...], num_plain: int) -> int:
    """The documented prefix index: all shorter prefixes first, then the base-A value of the digits."""
    offset = sum(num_plain**length for length in range(len(prefix)))
    return offset + sum(digit * num_plain ** (len(prefix) - 1 - i) for i, digit in enumerate(prefix))


@pytest.fixture(scope="module")
def tiny_lm() -> TinyCausalLM:
    return TinyCausalLM(4, 4, seed=0)


# ----- TabularPolicy -----


@pytest.mark.parametrize("vocab_size, eos, prefixes", [(4, True, 40), (3, False, 40), (3, True, 15)])
def test_tabular_has_one_float64_row_per_prefix(vocab_size, eos, prefixes):
    policy = TabularPolicy.random(vocab_size, 4, eos=eos, seed=0)
    assert policy.num_prefixes == prefixes
    assert policy.prefix_logits.shape == (prefixes, vocab_size)
    assert policy.prefix_logits.dtype == torch.float64
    assert [p.shape for p in policy.parameters()] == [(prefixes, vocab_size)]
    assert policy.eos_id == (vocab_size - 1 if eos else None)


def test_tabular_random_is_seeded_and_scaled():
    one = TabularPolicy.random(4, 4, seed=3).prefix_logits.detach()
    assert torch.equal(one, TabularPolicy.random(4, 4, seed=3).prefix_logits.detach())
    assert not torch.equal(one, TabularPolicy.random(4, 4, seed=4).prefix_logits.detach())
    assert torch.allclose(TabularPolicy.random(4, 4, seed=3, scale=2.5).prefix_logits.detach(), 2.5 * one)


def test_tabular_logits_are_the_row_of_the_prefix():
    policy = TabularPolicy.random(4, 4, seed=1)
    tokens = torch.tensor([[1, 2, 0, 3]])
    logits = policy.logits(tokens)[0]
    for t in range(4):
        expected = policy.prefix_logits[_row_of(tuple(tokens[0, :t].tolist()), 3)]
        assert torch.equal(logits[t], expected)
    # hand-computed rows for this sequence: (), (1), (1, 2), (1, 2, 0)
    assert [_row_of(tuple(tokens[0, :t].tolist()), 3) for t in range(4)] == [0, 2, 9, 28]


@pytest.mark.parametrize("vocab_size, eos", [(4, True), (3, False)])
def test_tabular_prefixes_map_one_to_one_onto_rows(vocab_size, eos):
    policy = TabularPolicy.random(vocab_size, 4, eos=eos, seed=0)
    plain = list(range(vocab_size - 1 if eos else vocab_size))
    prefixes = [p for length in range(4) for p in itertools.product(plain, repeat=length)]
    rows = []
    for prefix in prefixes:
        tokens = torch.tensor([list(prefix) + [0] * (4 - len(prefix))])
        rows.append(int(policy.prefix_index(tokens)[0, len(prefix)]))
    assert sorted(rows) == list(range(policy.num_prefixes))


def test_tabular_padding_after_eos_is_constant_zero_without_gradient():
    policy = TabularPolicy.random(4, 4, seed=2)
    tokens = torch.tensor([[0, 3, 3, 3], [3, 3, 3, 3], [1, 1, 1, 1]])
    logits = policy.logits(tokens)
    real = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.all(logits[~real] == 0)
    assert torch.all(logits[real] != 0)
    (grad,) = torch.autograd.grad(
        logits[~real].sum(), policy.prefix_logits, allow_unused=True, materialize_grads=True
    )
    assert torch.all(grad == 0)


@pytest.mark.parametrize(
    "kwargs", [dict(vocab_size=1, horizon=4), dict(vocab_size=4, horizon=0), dict(vocab_size=2.5, horizon=3)]
)
def test_tabular_rejects_impossible_shapes(kwargs):
    with pytest.raises(ValueError):
        TabularPolicy.random(**kwargs)


def test_tabular_rejects_a_table_of_the_wrong_size():
    with pytest.raises(ValueError, match="40 prefixes"):
        TabularPolicy(torch.zeros(39, 4), 4)


# ----- TinyCausalLM -----


def test_tiny_lm_logits_cover_the_generatable_vocabulary_only(tiny_lm):
    tokens = torch.tensor([[0, 1, 2, 0], [2, 2, 1, 1]])
    logits = tiny_lm.logits(tokens)
    assert logits.shape == (2, 4, 4) and logits.dtype == torch.float64
    assert tiny_lm.eos_id == 3 and tiny_lm.bos_id == 4
    assert TinyCausalLM(4, 3, eos=False, seed=0).eos_id is None
    # causal: position t sees BOS and tokens[:, :t] only
    changed = tokens.clone()
    changed[:, 1] = torch.tensor([2, 0])
    moved = tiny_lm.logits(changed)
    assert torch.equal(moved[:, :2], logits[:, :2]) and not torch.allclose(moved[:, 2:], logits[:, 2:])
    last = tokens.clone()
    last[:, -1] = 1
    assert torch.equal(tiny_lm.logits(last), logits)


def test_tiny_lm_is_seeded_and_leaves_the_global_rng_alone(tiny_lm):
    state = torch.get_rng_state()
    again = TinyCausalLM(4, 4, seed=0)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(_flat(again), _flat(tiny_lm))
    assert not torch.equal(_flat(TinyCausalLM(4, 4, seed=1)), _flat(tiny_lm))


def test_tiny_lm_is_causal(tiny_lm):
    tokens = torch.tensor([[0, 1, 2, 0]])
    base = tiny_lm.logits(tokens)
    for t in range(4):
        changed = tokens.clone()
        changed[0, t] = (changed[0, t] + 1) % 3
        logits = tiny_lm.logits(changed)
        assert torch.equal(logits[0, : t + 1], base[0, : t + 1])  # positions <= t do not see token t
        if t < 3:
            assert not torch.allclose(logits[0, t + 1 :], base[0, t + 1 :])


def test_tiny_lm_padding_after_eos_is_zero_and_real_positions_have_gradient(tiny_lm):
    tokens = torch.tensor([[1, 3, 3, 3]])
    logits = tiny_lm.logits(tokens)
    assert torch.all(logits[0, 2:] == 0)
    grads = torch.autograd.grad(logits[0, :2].sum() + logits[0, 1, 0], list(tiny_lm.parameters()), allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


# ----- perturbed / place_at_kl -----


@pytest.mark.parametrize("make", [lambda: TabularPolicy.random(4, 4, seed=0), lambda: TinyCausalLM(4, 4, seed=0)],
                         ids=["tabular", "tiny-lm"])
def test_perturbed_moves_along_a_fixed_seeded_direction(make):
    reference = make()
    before = _flat(reference).clone()
    assert torch.equal(_flat(perturbed(reference, 0.0, seed=5)), before)
    step = _flat(perturbed(reference, 0.1, seed=5)) - before
    assert torch.allclose(_flat(perturbed(reference, 0.3, seed=5)) - before, 3 * step, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(_flat(perturbed(reference, 0.1, seed=6)) - before, step)
    assert torch.equal(_flat(reference), before)  # the reference is not touched
    assert abs(step.std().item() / 0.1 - 1) < 0.2  # N(0, 1) direction


@pytest.mark.parametrize("vocab_size, eos, target", [(4, True, 0.5), (4, True, 2.0), (3, False, 1.0)])
def test_place_at_kl_reaches_the_target_on_tabular_policies(vocab_size, eos, target):
    reference = TabularPolicy.random(vocab_size, 4, eos=eos, seed=0)
    policy = place_at_kl(reference, target, seed=1)
    assert abs(sequence_kl(policy, reference) - target) <= 1e-4 * target
    assert torch.equal(_flat(place_at_kl(reference, target, seed=1)), _flat(policy))  # deterministic


def test_place_at_kl_reaches_the_target_on_the_tiny_lm(tiny_lm):
    policy = place_at_kl(tiny_lm, 0.8, seed=3, rtol=1e-3)
    assert abs(ExactProblem(policy, tiny_lm).kl_seq() - 0.8) <= 1e-3 * 0.8


def test_place_at_kl_says_when_the_target_is_out_of_reach():
    reference = TabularPolicy.random(2, 1, eos=False, seed=0)  # at most -log min_v ref(v) nats
    bound = -torch.log_softmax(reference.prefix_logits.detach()[0], -1).min().item()
    with pytest.raises(ValueError, match="out of reach"):
        place_at_kl(reference, bound + 0.5, seed=0, attempts=2)


@pytest.mark.parametrize("target", [0.0, -1.0, float("nan"), float("inf")])
def test_place_at_kl_rejects_a_meaningless_target(target):
    with pytest.raises(ValueError, match="target_kl"):
        place_at_kl(TabularPolicy.random(4, 2, seed=0), target, seed=0)


def test_the_tiny_transformer_never_takes_the_inference_fast_path(monkeypatch):
    """PyTorch's fast path of TransformerEncoderLayer (eval mode, no autograd) computes other float64 logits on
    CUDA than the regular path (1e-3 apart on an H200, which changed check-grad's verdicts there): the policy
    stays on the regular path, on every device, even after .eval()."""
    def fast_path(*args, **kwargs):
        raise AssertionError("the inference fast path was taken")

    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", fast_path)
    policy = TinyCausalLM(seed=1).eval()
    tokens = torch.randint(0, policy.vocab_size, (8, policy.horizon), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        without_autograd = policy.logits(tokens)
    torch.testing.assert_close(without_autograd, policy.logits(tokens).detach(), rtol=0, atol=0)
