"""The words for KL configurations and objectives, shared by `klaudit lint` and `klaudit check-grad`.

Both describe what a piece of code computes with `describe(config)`, so that the same code gets the
same words from the static lint and from the runtime audit, and both explain the objective names
(REV, FWD, PART, PFWD, FUT, ZERO, LEN, OTHER) and check-grad's "cos REV" column from `LEGEND`.
Plain Python: no torch (the lint imports it).
"""

from __future__ import annotations

from klaudit.catalog import Config, Position, without_gradient

# What each name means (kl-math.md section 1). pi: the policy, ref: the reference, KL_t(h): the
# per-step KL over the vocabulary at prefix h, s_t: the score of token t.
LEGEND: dict[str, str] = {
    "REV": "grad KL(pi || ref) of whole sequences, the reverse KL: the target of a KL penalty",
    "FWD": "grad KL(ref || pi) of whole sequences, the forward KL",
    "PART": "sum_t E[grad KL_t(h_t)] with the prefix distribution frozen: the local half of REV, "
            "without the term that carries later tokens' KL back to earlier tokens",
    "PFWD": "sum_t E[grad KL(ref_t || pi_t)(h_t)]: the per-token forward KL at the policy's own prefixes",
    "FUT": "REV - PART = E[sum_t s_t sum_{u>t} KL_u]: the future half of REV alone",
    "ZERO": "zero in expectation (or exactly, for a term without gradient): no regularisation, at most noise",
    "LEN": "grad E[1/L]: a pull on the response length L instead of towards the reference",
    "OTHER": "none of the above: a mixture (e.g. REV - PFWD), a reversed sign, or clamped values",
    "cos REV": "cosine between the exact expected gradient of the audited term and grad KL(pi || ref), "
               "on the first enumerated policy: +1.000 when unbiased, '-' when the expected gradient is zero",
}

OBJECTIVES = ("REV", "FWD", "PART", "PFWD", "FUT", "ZERO", "LEN", "OTHER")


def describe(config: Config, sequences: str | None = None) -> str:
    """The configuration in words: 'k3 differentiated as a loss, batch-token-mean, on-policy'; `sequences` words
    what the term is taken on where that is no sampling of the policy ("on a preference dataset's sequences")."""
    if config.reward is not None and without_gradient(config):
        return f"{config.reward.value} added to the loss without its gradient"  # no gradient: nothing else matters
    parts = []
    if config.loss is not None:
        parts.append(f"{config.loss.value} differentiated as a loss")
    if config.reward is not None:
        parts.append(f"{config.reward.value} in the reward ({config.returns.value})")
    text = " + ".join(parts)
    if config.position is not Position.ALL:
        text += f", {config.position.value}"
    text += f", {config.aggregation.value}, {sequences or config.sampling.value}"
    if config.sign < 0:
        text += ", added as a bonus"
    return text


def explain(name: str) -> str | None:
    """`NAME: meaning` for an objective or "cos REV" (any case), or None for an unknown name."""
    wanted = {key.lower().replace(" ", "").replace("_", ""): key for key in LEGEND}
    key = wanted.get(name.lower().replace(" ", "").replace("_", ""))
    return None if key is None else f"{key}: {LEGEND[key]}"


def legend_footer(names) -> list[str]:
    """The legend lines for the objectives that occur in a report, then cos REV."""
    present = set(names)
    shown = [name for name in OBJECTIVES if name in present] + ["cos REV"]
    return [f"  {name:<7} {LEGEND[name]}" for name in shown]
