"""The lint queries check-grad relies on: which functions of a file compute a KL term, and which
placement (loss, reward) the code around a KL helper gives its result."""

from __future__ import annotations

import textwrap
from pathlib import Path

from klaudit.lint.query import kl_functions, package_root, placements_of

FIXTURES = Path(__file__).parents[2] / "fixtures"

HELPER = """
    def approx_kl(log_probs, ref_log_probs):
        return log_probs - ref_log_probs
"""


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_reward_use_logged_use_and_loss_use(tmp_path):
    source = _write(tmp_path, "trainer.py", HELPER + """
    def make_experience(log_probs, ref_log_probs, scores):
        kl = approx_kl(log_probs, ref_log_probs)
        rewards = scores - 0.1 * kl
        return rewards

    def only_logged(log_probs, ref_log_probs, stats):
        kl = approx_kl(log_probs, ref_log_probs)
        stats["kl"] = kl.mean().item()
    """)
    assert placements_of(str(source), "approx_kl") == {"reward"}
    source.write_text(source.read_text() + textwrap.dedent("""
    def policy_loss(log_probs, ref_log_probs):
        return approx_kl(log_probs, ref_log_probs).mean()
    """))
    assert placements_of(str(source), "approx_kl") == {"reward", "loss"}


def test_a_logged_statistic_is_no_placement(tmp_path):
    """The KL of a shape that looks like a reward's but never enters it (zeros_like(kl) is not kl)."""
    source = _write(tmp_path, "trainer.py", HELPER + """
    def score(log_probs, ref_log_probs, scores):
        kl = approx_kl(log_probs, ref_log_probs)
        token_rewards = torch.zeros_like(kl)
        token_rewards[:, -1] += scores
        return token_rewards, kl.mean()
    """)
    assert placements_of(str(source), "approx_kl") == set()


def test_use_in_another_module_of_the_package(tmp_path):
    """The helper lives in pkg/kl.py, the loss that uses it in pkg/actor.py: the query searches the
    helper's whole package, follows the import and the tuple the helper returns."""
    _write(tmp_path, "pkg/__init__.py", "")
    helper = _write(tmp_path, "pkg/kl.py", """
    def kl_with_stats(logprob, ref_logprob):
        kl = logprob - ref_logprob
        return kl, {"kl": kl.mean().item()}
    """)
    _write(tmp_path, "pkg/actor.py", """
    from pkg.kl import kl_with_stats

    class Actor:
        def update_policy(self, data):
            log_prob = self.compute_log_prob(data)
            kl, stats = kl_with_stats(log_prob, data["ref_log_prob"])
            kl_loss = kl.mean()
            policy_loss = self.pg_loss(data) + 0.1 * kl_loss
            policy_loss.backward()
    """)
    assert package_root(helper) == tmp_path
    assert placements_of(str(helper), "kl_with_stats") == {"loss"}


def test_an_estimator_formed_in_a_nested_helper(tmp_path):
    """verl's kl_penalty returns what kl_penalty_forward formed: the origin is in the inner helper."""
    source = _write(tmp_path, "core.py", """
    def kl_penalty_forward(logprob, ref_logprob):
        log_ratio = ref_logprob - logprob
        return log_ratio.exp() - 1 - log_ratio

    def kl_penalty(logprob, ref_logprob):
        return kl_penalty_forward(logprob, ref_logprob)

    def apply_kl_penalty(data, beta):
        kld = kl_penalty(data["old_log_probs"], data["ref_log_prob"])
        data["token_level_rewards"] = data["token_level_scores"] - beta * kld
        token_level_rewards = data["token_level_scores"] - beta * kld
        return token_level_rewards
    """)
    assert placements_of(str(source), "kl_penalty") == {"reward"}


def test_the_same_values_as_a_loss_and_as_returns(tmp_path):
    """R-C differentiates k3 and feeds it detached to the reward-to-go: "loss+reward"; R-D feeds the
    exact per-step KL to the future-only returns: "loss+future"."""
    source = _write(tmp_path, "actor.py", """
    def k3(logprob, ref_logprob):
        log_ratio = ref_logprob - logprob
        return log_ratio.exp() - 1 - log_ratio

    def exact_kl(logits, ref_logits):
        logp = logits.log_softmax(-1)
        return (logp.exp() * (logp - ref_logits.log_softmax(-1))).sum(-1)

    def rtg(values):
        return values.flip(-1).cumsum(-1).flip(-1)

    def k3_loss(logprob, ref_logprob, mask):
        kld = k3(logprob, ref_logprob) * mask
        return (kld + logprob * rtg(kld.detach())).sum(-1).mean()

    def rb_loss(logits, ref_logits, logprob, mask):
        kl = exact_kl(logits, ref_logits) * mask
        return (kl + logprob * (rtg(kl.detach()) - kl.detach())).sum(-1).mean()
    """)
    assert placements_of(str(source), "k3") == {"loss+reward"}
    assert placements_of(str(source), "exact_kl") == {"loss+future"}


def test_a_method_and_a_missing_name(tmp_path):
    source = _write(tmp_path, "trainer.py", """
    class Trainer:
        def kl_term(self, logprobs, ref_logprobs):
            return logprobs - ref_logprobs

        def loss(self, logprobs, ref_logprobs):
            return self.kl_term(logprobs, ref_logprobs).mean()
    """)
    assert placements_of(str(source), "Trainer.kl_term") == {"loss"}
    assert placements_of(str(source), "Trainer.missing") == set()
    assert placements_of(str(source), "missing") == set()


def test_lint_fixtures():
    """The helpers of the lint fixtures, where each fixture's marker or docstring says how it is used."""
    cases = {
        ("bad/openrlhf_ppo.py", "compute_approx_kl"): {"loss", "reward"},
        ("bad/verl_ray_trainer.py", "kl_penalty"): {"reward"},
        ("bad/verl_dp_actor.py", "kl_penalty"): {"loss"},
        ("bad/ppo_gae_trainer.py", "PPOTrainer.compute_rewards"): {"reward"},
        ("bad/grpo_pkg/kl.py", "k3_estimate"): {"loss"},
        ("fixed/exact_kl_reward.py", "exact_token_kl"): set(),  # logged only: the fix moved KL to the loss
        ("fixed/openrlhf_ppo.py", "compute_approx_kl"): set(),  # kept for the logged statistic only
        ("fixed/k3_loss_and_reward_clamped.py", "k3"): {"loss+reward"},  # k3 loss + k3 reward-to-go (R-C)
    }
    for (file, qualname), expected in cases.items():
        assert placements_of(str(FIXTURES / file), qualname) == expected, (file, qualname)


def test_kl_functions():
    source = FIXTURES / "bad" / "verl_ray_trainer.py"
    assert kl_functions(str(source)) == ["kl_penalty", "apply_kl_penalty"]
    assert kl_functions(str(FIXTURES / "bad" / "grpo_pkg" / "loss.py")) == ["grpo_loss"]


def test_an_evaluation_loss_under_no_grad_has_no_record(tmp_path):
    """TRL's GRPOTrainer.prediction_step computes the training loss under torch.no_grad() and detaches it:
    nothing is trained, and the lint reports nothing there. The records check-grad is compared with judge the
    sink as the lint does, so that step has none either (it read as a detached estimate beside a term the
    analysis does not follow, row 1c, a site no finding carries)."""
    from klaudit.lint.query import site_verdicts

    source = _write(tmp_path, "trainer.py", """
    import torch
    from elsewhere import policy_objective


    class Trainer:
        def _compute_loss(self, model, inputs):
            logp = model(inputs["input_ids"]).log_softmax(-1)
            log_ratio = inputs["ref_per_token_logps"] - logp
            kl = torch.exp(log_ratio) - log_ratio - 1
            per_token_loss = policy_objective(logp, inputs) + self.beta * kl
            return per_token_loss.mean()

        def prediction_step(self, model, inputs):
            with torch.no_grad():
                loss = self._compute_loss(model, inputs)
                loss = loss.mean().detach()
            return loss
    """)
    assert {(site.function, site.rules) for site in site_verdicts(str(source))} == {
        ("Trainer._compute_loss", ("KL002",))}


def test_a_term_past_every_named_value_gets_a_value_of_its_own(tmp_path):
    """`if mode == "k3": ... else: k1`: the k1 term is selected by any value but "k3", so check-grad audits one
    ("other"), unless the parameter's default already selects it."""
    from klaudit.lint.query import switch_values

    source = _write(tmp_path, "kl.py", """
    def kl(log_probs, ref_log_probs, mode):
        if mode == "k3":
            log_ratio = ref_log_probs - log_probs
            return log_ratio.exp() - 1 - log_ratio
        return log_probs - ref_log_probs

    def kl_with_default(log_probs, ref_log_probs, mode="k1"):
        if mode == "k3":
            log_ratio = ref_log_probs - log_probs
            return log_ratio.exp() - 1 - log_ratio
        return log_probs - ref_log_probs
    """)
    assert switch_values(str(source), "kl") == {"mode": ["k3", "other"]}
    assert switch_values(str(source), "kl_with_default") == {"mode": ["k3"]}


def test_a_folder_without_init_inside_a_package_is_a_namespace_subpackage_of_it(tmp_path):
    """SkyRL's workers/megatron/ has no __init__.py while workers/ has one: its modules import the package by its
    full name (`from skyrl.utils.ppo import compute_approx_kl`), so the KL sites of its loss function are found only
    with the package's root on the path, as Python imports them. A script folder outside any package is its own."""
    from klaudit.lint.query import package_of, site_verdicts

    _write(tmp_path, "skyrl/__init__.py", "")
    _write(tmp_path, "skyrl/workers/__init__.py", "")
    _write(tmp_path, "skyrl/ppo.py", """
    def compute_approx_kl(log_probs, base_log_probs):
        log_ratio = base_log_probs - log_probs
        return log_ratio.exp() - 1 - log_ratio
    """)
    wrapper = _write(tmp_path, "skyrl/workers/megatron/wrapper.py", """
    from skyrl.ppo import compute_approx_kl


    def loss_func(log_probs, base_log_probs, mask):
        kl_loss = (compute_approx_kl(log_probs, base_log_probs) * mask).sum() / mask.sum()
        return kl_loss
    """)
    script = _write(tmp_path, "scripts/train.py", "")
    assert package_of(wrapper) == (tmp_path, ["skyrl", "workers", "megatron", "wrapper"])
    assert package_of(script) == (tmp_path / "scripts", ["train"])
    assert [site.rules for site in site_verdicts(str(wrapper))] == [("KL002",)]


def test_the_helper_of_a_step_is_the_one_it_calls_even_when_a_caller_was_read_first(tmp_path):
    """SkyRL's worker: `forward_backward` (read first) calls `_micro`, which adds the k1 of `ppo_utils.approx_kl`
    to its loss and returns the loss's value in a dict. The calls recorded while reading `forward_backward` named
    `_micro` as the call that returned the term, and that record stood for `_micro`'s own site: check-grad was
    pointed at `_micro` itself, which it cannot call alone. Each function is read with its own calls."""
    from klaudit.lint.query import site_verdicts

    _write(tmp_path, "pkg/__init__.py", "")
    _write(tmp_path, "pkg/ppo_utils.py", HELPER)
    worker = _write(tmp_path, "pkg/worker.py", """
    from pkg.ppo_utils import approx_kl


    class Worker:
        def forward_backward(self, batches):
            return [self._micro(batch) for batch in batches]

        def _micro(self, experience):
            log_probs = self.model(experience.sequences)
            kl_loss = approx_kl(log_probs, experience.base_log_probs).mean()
            loss = self.policy_loss(log_probs, experience) + self.cfg.kl_coef * kl_loss
            loss.backward()
            return {"loss": loss.item()}
    """)
    (site,) = site_verdicts(str(worker))
    assert (site.function, site.rules) == ("Worker._micro", ("KL001",))
    assert (Path(site.helper_path).name, site.helper) == ("ppo_utils.py", "approx_kl")
