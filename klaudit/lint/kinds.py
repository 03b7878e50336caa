"""The closed sets of words the flow analysis labels its values with, as Literal types.

They stay strings at run time (a fact is made and compared millions of times per tree, and the
words appear in no output); the Literal types let the type checker reject a misspelt role or sink.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

# What a value is (klaudit.lint.facts.Fact.role):
#   tensor: a symbolic tensor (its polynomial says which); mask, length (per-row token counts),
#   ntokens (the batch's token count): what a KL term is masked or divided by; str, bool, none:
#   switch values and literals; neg: a negated value the analysis cannot explain otherwise (a sign
#   it keeps); kl-weight: a weight that varies with the log-ratio (`sigmoid(beta * delta)`); tuple,
#   dict: containers of values; function: a callable of the linted tree; loss-module: a library's
#   loss object (`torch.nn.KLDivLoss(...)`), whose construction call is the fact's origin; unknown:
#   a value the analysis cannot explain; lse, lse-vocab: the log-sum-exp of the logits its poly holds, one
#   per position (subtracted from the sampled tokens' logits) or kept over the vocabulary axis.
Role: TypeAlias = Literal["tensor", "mask", "length", "ntokens", "str", "bool", "none", "neg", "kl-weight",
                          "tuple", "dict", "function", "loss-module", "unknown", "lse", "lse-vocab",
                          "critic"]

# Where a value ends up that the analysis follows (klaudit.lint.facts.Sink.kind).
SinkKind: TypeAlias = Literal["loss", "reward", "advantage"]

# How a KL term's gradient reaches the policy (klaudit.lint.algebra.Term.place): through the
# estimator itself (loss) or as a detached value times the score of the sampled token (reward).
Place: TypeAlias = Literal["loss", "reward"]

# A differentiable multiplier of a KL term (klaudit.lint.algebra.Term.weighted): none, exp(P - sg P)
# ("score") or an importance ratio ("is"), of the token, the whole sequence ("-seq") or its mean
# log-ratio ("-seqmean"); "is-detached": a detached importance weight.
Weighting: TypeAlias = Literal["", "score", "score-seq", "score-seqmean", "is", "is-seq", "is-seqmean",
                               "is-detached"]

# check-grad's name for how the code uses a KL helper's result (klaudit.lint.query.placement_of):
# differentiated, propagated detached, or both (the same values as reward-to-go or whole-sequence
# return, or as future-only returns).
Placement: TypeAlias = Literal["loss", "reward", "loss+reward", "loss+future", "advantage"]
