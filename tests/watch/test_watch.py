"""`klaudit.watch.watch` in a real training loop: a tiny random-init Llama (V = 32000) trained for a few steps
on CPU, the watch naming the configuration and the fix of each KL term, and never touching the training."""

from __future__ import annotations

import gc
import json
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from klaudit.estimators import kl_penalty  # noqa: E402
from klaudit.watch import KLGradientError, KLGradientWarning, Reporter, watch  # noqa: E402

VOCAB = 32000
PROMPT, RESPONSE, BATCH = 3, 6, 4


def k3_loss(logprobs, ref_logprobs, mask):
    """GRPO's per-token k3 loss, token-mean per sequence then over the batch (KL002 + KL007)."""
    log_ratio = ref_logprobs - logprobs
    k3 = torch.exp(log_ratio) - log_ratio - 1
    return ((k3 * mask).sum(-1) / mask.sum(-1)).mean()


def k1_loss(logprobs, ref_logprobs, mask):
    """The log-ratio differentiated as a loss, summed per sequence (KL001)."""
    return ((logprobs - ref_logprobs) * mask).sum(-1).mean()


def correct_loss(logprobs, ref_logprobs, mask):
    return kl_penalty(logprobs, ref_logprobs, mask).loss.mean()


@pytest.fixture(scope="module")
def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    return config


def _train(config, kl_fn, steps: int = 3, seed: int = 0) -> list[torch.Tensor]:
    """A few PPO-shaped steps: a REINFORCE term plus beta * kl_fn on the model's own log-probs; returns the
    gradients of the last step (for the no-change test)."""
    torch.manual_seed(seed)
    policy = transformers.LlamaForCausalLM(config)
    reference = transformers.LlamaForCausalLM(config)
    reference.load_state_dict(policy.state_dict())
    with torch.no_grad():
        reference.lm_head.weight.add_(0.5 * torch.randn_like(reference.lm_head.weight))
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    gradients: list[torch.Tensor] = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (BATCH, PROMPT + RESPONSE), generator=generator)
        lengths = torch.tensor([RESPONSE, RESPONSE - 2, RESPONSE - 1, 2])
        mask = (torch.arange(RESPONSE) < lengths.unsqueeze(-1)).float()
        logprobs = _token_logprobs(policy, ids)
        with torch.no_grad():
            ref_logprobs = _token_logprobs(reference, ids)
        advantages = torch.randn(BATCH, 1, generator=generator)
        pg_loss = -(advantages * logprobs * mask).sum(-1).mean()
        loss = pg_loss + 0.1 * kl_fn(logprobs, ref_logprobs, mask)
        optimizer.zero_grad()
        loss.backward()
        gradients = [p.grad.detach().clone() for p in policy.parameters()]
        optimizer.step()
    return gradients


def _token_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """log pi(y_t | h_t) of the response tokens ids[:, PROMPT:]."""
    logits = model(input_ids=ids).logits[:, PROMPT - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, PROMPT:].unsqueeze(-1)).squeeze(-1)


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_training_run_logs_each_configuration_and_its_fix(tiny_llama, tmp_path):
    """The log of three watched runs names a k3 loss (KL002 and its 1/L weights, KL007), a k1 loss (KL001) and a
    correct kl_penalty (unbiased), each with the catalog's fix; the correct one raises no warning."""
    log = tmp_path / "watch.jsonl"
    reporter = Reporter("log", log)
    for fn in (k3_loss, k1_loss, correct_loss):
        with warnings.catch_warnings():
            warnings.simplefilter("error", KLGradientWarning)  # mode "log" never warns
            _train(tiny_llama, watch(fn, reporter=reporter, every=1))
    by_function = {record["function"]: record for record in _records(log)}
    assert set(by_function) == {"k3_loss", "k1_loss", "correct_loss"}  # each once, though audited at 3 steps
    k3 = by_function["k3_loss"]
    assert k3["configuration"] == "k3 differentiated as a loss, seq-token-mean, on-policy"
    assert k3["rules"] == ["KL002", "KL007"] and k3["unbiased"] is False
    assert any('estimator="k3"' in fix for fix in k3["fixes"])
    k1 = by_function["k1_loss"]
    assert k1["configuration"] == "k1 differentiated as a loss, token-sum, on-policy" and k1["rules"] == ["KL001"]
    assert "kl_penalty(logprobs, ref_logprobs, mask).loss.mean()" in k1["fixes"][0]
    correct = by_function["correct_loss"]
    assert correct["unbiased"] is True and correct["rules"] == [] and correct["fixes"] == []
    assert correct["configuration"] == "k1 in the reward (reward-to-go), token-sum, on-policy"


def test_warn_mode_warns_once_per_configuration(tiny_llama):
    with pytest.warns(KLGradientWarning, match="KL001 k1 differentiated as a loss") as caught:
        _train(tiny_llama, watch(k1_loss, every=1))
    assert len([w for w in caught if issubclass(w.category, KLGradientWarning)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train(tiny_llama, watch(correct_loss, every=1))


def test_the_watch_changes_no_value_and_no_gradient(tiny_llama):
    plain = _train(tiny_llama, k3_loss, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KLGradientWarning)
        watched = _train(tiny_llama, watch(k3_loss, every=1), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched))


def test_raise_mode_raises_for_a_biased_term_only():
    logprobs = torch.randn(3, 5, requires_grad=True)
    ref, mask = torch.randn(3, 5), torch.ones(3, 5)
    with pytest.raises(KLGradientError, match="KL001"):
        watch(k1_loss, mode="raise")(logprobs, ref, mask)
    assert watch(correct_loss, mode="raise")(logprobs, ref, mask).requires_grad


def test_the_batch_is_freed_once_the_call_returns():
    logprobs = torch.randn(3, 5, requires_grad=True)
    ref, mask = torch.randn(3, 5), torch.ones(3, 5)
    refs = [weakref.ref(tensor) for tensor in (logprobs, ref, mask)]
    watched = watch(k3_loss, mode="log", log_file=None, reporter=Reporter("warn"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KLGradientWarning)
        watched(logprobs, ref, mask).backward()
    del logprobs, ref, mask
    gc.collect()
    assert all(r() is None for r in refs)


def test_an_internal_failure_is_one_warning_and_never_stops_training():
    def fails_on_float64(logprobs, ref_logprobs):
        if logprobs.dtype == torch.float64:
            raise RuntimeError("only float32 here")
        return logprobs - ref_logprobs

    watched = watch(fails_on_float64, mode="raise", every=1)
    with pytest.warns(RuntimeWarning, match="could not audit .*fails_on_float64: .*raised RuntimeError: only float32") as caught:
        for _ in range(3):
            watched(torch.randn(2, 3, requires_grad=True), torch.randn(2, 3))
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1


def test_every_samples_the_first_call_then_every_nth():
    def kl(logprobs, ref_logprobs):
        return logprobs - ref_logprobs

    watched = watch(kl, every=4, mode="log", reporter=Reporter("warn"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KLGradientWarning)
        for _ in range(9):
            watched(torch.randn(2, 3, requires_grad=True), torch.randn(2, 3))
    state = watched.__klaudit_watch__
    assert (state.calls, state.audits) == (9, 3)  # calls 0, 4 and 8
    assert watched.__name__ == "kl" and watched.__wrapped__ is kl


def test_a_reward_computed_under_no_grad_is_audited_as_a_reward():
    """verl's apply_kl_penalty: the rollout's log-probs carry no gradient, so the placement is the reward."""
    def kl_in_reward(logprobs, ref_logprobs):
        d = ref_logprobs - logprobs
        return torch.exp(d) - d - 1

    with torch.no_grad(), pytest.warns(KLGradientWarning, match="as reward: KL004 k3 in the reward"):
        watch(kl_in_reward)(torch.randn(2, 4), torch.randn(2, 4))
    with torch.inference_mode(), pytest.warns(KLGradientWarning, match="as reward: KL004"):
        watch(kl_in_reward)(torch.randn(2, 4), torch.randn(2, 4))


def test_arguments_named_by_the_user_and_actual_values_kept():
    """A loss whose log-prob arguments have other names, with a config object the audit passes as given."""
    class Config:
        kl_type = "k3"

    def loss_fn(student, teacher, config, weights):
        d = teacher - student
        value = torch.exp(d) - d - 1 if config.kl_type == "k3" else -d
        return (value * weights).sum()

    watched = watch(loss_fn, args={"student": "logprobs", "teacher": "ref_logprobs", "weights": "mask"})
    with pytest.warns(KLGradientWarning, match="loss_fn as loss: KL002 k3 differentiated as a loss"):
        watched(torch.randn(2, 4, requires_grad=True), torch.randn(2, 4), Config(), torch.ones(2, 4))


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="placement"):
        watch(k1_loss, placement="bonus")
    with pytest.raises(ValueError, match="every"):
        watch(k1_loss, every=0)
    with pytest.raises(ValueError, match="mode"):
        watch(k1_loss, mode="shout")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_audit_runs_on_cpu_copies_unless_the_function_needs_the_gpu():
    """The copies go to the CPU (a few sequences: cheaper there than a GPU's launches and synchronisations); a
    function that holds a GPU tensor of its own is audited on GPU copies instead, with the same verdict."""
    logprobs = torch.randn(16, 64, device="cuda", requires_grad=True)
    ref, mask = torch.randn(16, 64, device="cuda"), torch.ones(16, 64, device="cuda")
    seen: list[str] = []
    position_weights = torch.ones(64, device="cuda")  # not a 0-dim tensor, which torch lets meet CPU tensors

    def k3_on_cpu(logprobs, ref_logprobs, mask):
        seen.append(logprobs.device.type)
        return k3_loss(logprobs, ref_logprobs, mask)

    def k3_with_its_own_gpu_weights(logprobs, ref_logprobs, mask):
        seen.append(logprobs.device.type)
        return k3_loss(logprobs, ref_logprobs, mask * position_weights)

    for fn, audited_on in ((k3_on_cpu, "cpu"), (k3_with_its_own_gpu_weights, "cuda")):
        seen.clear()
        with pytest.raises(KLGradientError, match="KL002"):
            watch(fn, mode="raise")(logprobs, ref, mask)
        assert seen[:2] == ["cuda", "cpu"]  # the real call, then the audit's first call on CPU copies
        assert seen[-1] == audited_on and len(seen) > 3
