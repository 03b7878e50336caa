"""A small grammar of trainer code around one KL term, whose configuration is known by construction.

A program computes one estimator (k1, k2, k3, each in a few spellings) from the policy's and the
reference's log-probs, optionally detached (`.detach()` or under `torch.no_grad()`), aggregates it
with the mask, and places it in the loss (differentiated) or in the reward (a per-token penalty),
among statements unrelated to the KL (noise). The rule it must get follows kl-math.md §8:
a differentiated k1 is KL001, k3 KL002, k2 (per-token, local gradient only) KL003; a detached
estimator added to the trained loss has no gradient at all (row 1c: KL001); in the reward k1 is correct and
k2, k3 are KL004.
"""

from __future__ import annotations

from hypothesis import strategies as st

ESTIMATORS = {
    "k1": [
        "{kl} = {logp} - {ref}",
        "{kl} = -({ref} - {logp})",
        "log_ratio = {logp} - {ref}\n{kl} = log_ratio",
    ],
    "k2": [
        "{kl} = 0.5 * ({logp} - {ref}) ** 2",
        "log_ratio = {logp} - {ref}\n{kl} = log_ratio * log_ratio / 2",
        "{kl} = ({logp} - {ref}).pow(0x2) * 0.5",
    ],
    "k3": [
        "log_ratio = {ref} - {logp}\n{kl} = torch.exp(log_ratio) - log_ratio - 1",
        "ratio = torch.exp({ref} - {logp})\n{kl} = ratio - torch.log(ratio) - 1",
        "{kl} = ({ref} - {logp}).exp() - ({ref} - {logp}) - 1_0e-1",
    ],
}

LOSS_RULES = {"k1": "KL001", "k2": "KL003", "k3": "KL002"}
REWARD_RULES = {"k1": None, "k2": "KL004", "k3": "KL004"}

AGGREGATIONS = [
    "({kl} * {mask}).sum() / {mask}.sum()",
    "({kl} * {mask}).sum()",
    "torch.sum({kl} * {mask}) / torch.sum({mask})",
]

NOISE = [
    "step = 0x10 + 0o7 + 0b1 + 1_000",
    "if verbose:\n    print('step', step)",
    "for _ in range(2):\n    step = step + 1",
    "stats = {'lr': 1e-3, 'clip': .2}",
    "while False:\n    pass",
    "match mode:\n    case 'train':\n        step = 1\n    case _:\n        step = 2",
    "if (n := len(stats)) > 1:\n    step = n",
]

LOGP_NAMES = ["log_probs", "logprobs", "policy_logprobs", "logp", "per_token_logps"]
REF_NAMES = ["ref_log_probs", "ref_logprobs", "ref_logp", "ref_per_token_logps"]
KL_NAMES = ["kl", "kl_term", "per_token_kl", "kld"]


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


@st.composite
def programs(draw):
    """(source, estimator, placement, detached, expected rule code or None)."""
    estimator = draw(st.sampled_from(sorted(ESTIMATORS)))
    names = {"logp": draw(st.sampled_from(LOGP_NAMES)), "ref": draw(st.sampled_from(REF_NAMES)),
             "kl": draw(st.sampled_from(KL_NAMES)), "mask": "mask"}
    compute = draw(st.sampled_from(ESTIMATORS[estimator])).format(**names)
    detach = draw(st.sampled_from(["none", "method", "no_grad"]))
    if detach == "method":
        compute += "\n{kl} = {kl}.detach()".format(**names)
    elif detach == "no_grad":
        compute = "with torch.no_grad():\n" + _indent(compute)
    placement = draw(st.sampled_from(["loss", "reward"]))
    noise = draw(st.lists(st.sampled_from(NOISE), max_size=3))
    coef = draw(st.sampled_from(["beta", "0.05", "1e-3", "0x1", "kl_coef"]))
    body = [*noise[:1], compute, *noise[1:]]
    if placement == "loss":
        aggregate = draw(st.sampled_from(AGGREGATIONS)).format(**names)
        body += [f"loss = pg_loss + {coef} * {aggregate}", "loss.backward()", "return loss"]
        expected = "KL001" if detach != "none" else LOSS_RULES[estimator]
        name = "compute_loss"
    else:
        body += [f"rewards = scores - {coef} * {names['kl']}", "return rewards"]
        expected = REWARD_RULES[estimator]
        name = "compute_rewards"
    params = f"{names['logp']}, {names['ref']}, mask, pg_loss, scores, beta, kl_coef, verbose, mode"
    source = "import torch\n\n\ndef " + name + f"({params}):\n" + _indent("\n".join(body)) + "\n"
    return source, estimator, placement, detach != "none", expected
