"""The path where `kind == "x"` is false holds `kind != "x"` (an excluded literal): a value a branch replaces
keeps its old meaning only there, so a KL term the branch moves into the advantages and zeroes is not paired
with the same term left in the loss on the other path (ColossalChat's REINFORCE_PPB switch)."""

from tests.lint.snippets import module_codes

MOVED_INTO_ADVANTAGES = '''
import torch


class Consumer:
    def step(self, log_probs, ref_log_probs, old_log_probs, advantages, mask):
        per_token_kl = torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1
        if self.adv == "REINFORCE_PPB":
            advantages = advantages - self.beta * per_token_kl
            per_token_kl = 0.0
        ratio = torch.exp(log_probs - old_log_probs)
        per_token_loss = -ratio * advantages + self.beta * per_token_kl
        loss = (per_token_loss * mask).sum() / mask.sum()
        loss.backward()
'''


def test_a_term_moved_out_of_the_loss_in_one_branch_is_not_paired_with_itself(tmp_path):
    # only the k3 loss of the other path is judged (forward-KL gradient, older samples), at the loss
    assert module_codes(MOVED_INTO_ADVANTAGES, tmp_path) == [(12, "KL002"), (12, "KL008")]


def test_the_finding_names_the_excluded_value(tmp_path):
    from klaudit.lint.engine import lint_paths

    path = tmp_path / "consumer.py"
    path.write_text(MOVED_INTO_ADVANTAGES)
    messages = [f.message for f in lint_paths([str(path)]).findings if f.code == "KL002"]
    assert len(messages) == 1 and '[adv!="REINFORCE_PPB"]' in messages[0]


NOT_EQUAL_TEST = '''
import torch


def kl_loss(log_probs, ref_log_probs, mask, kind):
    log_ratio = ref_log_probs - log_probs
    if kind != "k3":
        kl = -log_ratio
    else:
        kl = torch.exp(log_ratio) - log_ratio - 1
    return (kl * mask).sum()
'''


def test_a_not_equal_test_labels_both_branches(tmp_path):
    from klaudit.lint.query import site_verdicts

    path = tmp_path / "kl.py"
    path.write_text(NOT_EQUAL_TEST)
    assert {site.labels: site.rules for site in site_verdicts(str(path))} == {
        (("kind", ("!=k3",)),): ("KL001",), (("kind", ("k3",)),): ("KL002",)}
