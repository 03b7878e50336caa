"""Log-probs computed one response at a time: the generated ids of each made a batch of one with `unsqueeze(0)`.

A REINFORCE trainer that scores each response by its mean token log-prob loops over the responses, makes each
one's ids a row (`gen_ids.unsqueeze(0)`), and reduces `(token_lp * mask).sum() / mask.sum()` over that row: one
number per response, its own token mean. The detached difference of two such numbers put in the reward is a
whole-sequence k1 return weighted by 1/L twice (kl-math.md section 8, row 21: KL007), not a per-token reward that
reaches only its own token (row 2, KL003).
"""

from __future__ import annotations

from snippets import module_codes

TRAINER = """\
import torch
import torch.nn.functional as F


def response_logprobs(model, prompts, responses):
    out = []
    for prompt_ids, gen_ids in zip(prompts, responses):
        ids = torch.cat([prompt_ids, gen_ids.unsqueeze(0)], dim=1)
        labels = ids.clone()
        labels[:, :prompt_ids.shape[1]] = -100
        logits = model(ids).logits[:, :-1]
        target = labels[:, 1:]
        token_lp = F.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        mask = (target != -100).float()
        out.append((token_lp * mask).sum() / mask.sum())
    return torch.stack(out)


def update(model, reference, prompts, responses, rewards, baseline, beta, optimizer):
    logp = response_logprobs(model, prompts, responses)
    with torch.no_grad():
        ref_logp = response_logprobs(reference, prompts, responses)
    kl = logp.detach() - ref_logp
    shaped = rewards - beta * kl
    loss = -((shaped - baseline) * logp).mean()
    loss.backward()
    optimizer.step()
"""


def test_ids_unsqueezed_to_one_row_make_one_number_per_response(tmp_path):
    assert module_codes(TRAINER, tmp_path) == [(25, "KL007")]


def test_a_batch_of_responses_reduced_over_everything_is_not_one_response(tmp_path):
    # the same loop over batches whose ids are already rows: `.sum()` reduces a whole batch, not one response
    batches = TRAINER.replace("gen_ids.unsqueeze(0)", "gen_ids")
    assert (25, "KL007") not in module_codes(batches, tmp_path)
