"""klaudit's model of the KL reward of an installed verl (`verl.trainer.ppo.ray_trainer`), as of verl 0.9.

Read by the lint, never imported or run (see verl.trainer.ppo.core_algos beside it): `apply_kl_penalty`
subtracts beta times the detached estimate `kl_penalty` names, taken at the rollout's log-probs, from the
token-level scores; the advantage estimator then turns the token-level rewards into returns.
"""

from verl.trainer.ppo.core_algos import kl_penalty as estimate


def apply_kl_penalty(data, kl_ctrl, kl_penalty="kl", **options):
    """token_level_rewards = token_level_scores - beta * estimate(old_log_probs, ref_log_prob, kl_penalty)."""
    response_mask = data.batch["response_mask"]
    kld = estimate(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * response_mask
    token_level_rewards = data.batch["token_level_scores"] - kl_ctrl.value * kld
    data.batch["token_level_rewards"] = token_level_rewards
    return data, {}
