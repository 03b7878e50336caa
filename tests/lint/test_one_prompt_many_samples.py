"""One prompt encoded once, copied into a batch of rows that are sampled token by token.

pHaeusler/tinycatstories (hundred-and-seventh set) encodes one prompt (`tokenizer.encode(prompt,
return_tensors="pt")`) and copies it into `torch.full((BATCH_SIZE, NUM_TOKENS), eos_id)`, a thousand rows it
samples together; its `kl_div(...).mean(dim=-1)` of each step is over the vocabulary, and the accumulated KL is
divided by the constant NUM_TOKENS. Taken for a batch of one (one text encoded), each reduction was read as one
sequence's own token mean: a KL007 the constant divisor does not have (reviewed fp). The exact forward KL as a
loss (row 3b, KL002) stays.
"""

from __future__ import annotations

from snippets import module_codes

SAMPLER = """\
import torch
import torch.nn.functional as F
from torch.distributions import Categorical

BATCH_SIZE = 1000
NUM_TOKENS = 10

prompt = "Once upon a time"
input_ids = tokenizer.encode(prompt, return_tensors="pt")
for epoch in range(100):
    output_ids = torch.full(({rows}, NUM_TOKENS), tokenizer.eos_token_id)
    output_ids[:, : input_ids.shape[1]] = input_ids
    kl_acc = torch.zeros(({rows}, 1))
    active_mask = torch.ones({rows}, dtype=torch.bool)
    for i in range(input_ids.shape[1], NUM_TOKENS):
        prefix = output_ids[:, :i].clone()
        logits_active = model(prefix).logits[:, -1, :][active_mask]
        next_tokens = Categorical(torch.softmax(logits_active, dim=-1)).sample()
        output_ids[active_mask, i] = next_tokens
        ref_active = ref_model(prefix).logits[:, -1, :][active_mask]
        kl = F.kl_div(F.log_softmax(logits_active, -1), F.log_softmax(ref_active, -1), reduction="none",
                      log_target=True)
        kl_acc[active_mask] += kl.mean(dim=-1).unsqueeze(-1)
        finished = next_tokens == tokenizer.eos_token_id
        new_mask = active_mask.clone()
        new_mask[torch.nonzero(active_mask).squeeze(-1)] = ~finished
        active_mask = new_mask
    loss = 0.1 * (kl_acc / NUM_TOKENS).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""

def test_one_prompt_copied_into_a_batch_is_no_batch_of_one(tmp_path):
    assert sorted({code for _, code in module_codes(SAMPLER.format(rows="BATCH_SIZE"), tmp_path)}) == ["KL002"]
