"""A loop over the sequences of a batch that indexes each one's row: `logprobs[i, start:end]` in `for i in range(B)`.

Each row is one sequence's tokens, so its `.mean()` divides that sequence's KL by its own length: the per-sequence
token mean, 1/L weights (kl-math.md section 8, row 21: KL007). A k3 differentiated as a loss is row 3 (KL002).
Hand-written GRPO trainers (RWKV-RLHF's real-label variant, 1-D slices of each trajectory's response) write it so.
The same index over a loop of positions (`for t in range(seq_len)`) picks a token, not a sequence.
"""

from __future__ import annotations

import pytest
from snippets import module_codes

ROWS = """\
import torch


def train_step(model, ref_model, optimizer, input_ids, lengths, advantages, beta, trajs):
    logprobs = model(input_ids).logits.log_softmax(-1).gather(-1, input_ids[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_logprobs = ref_model(input_ids).logits.log_softmax(-1).gather(-1, input_ids[..., None]).squeeze(-1)
    total = 0.0
    for {loop}:
        lp = logprobs[{row}]
        rp = ref_logprobs[{row}]
        kl = (torch.exp(rp - lp) - (rp - lp) - 1).{reduce}()
        pg = -(advantages[i] * lp).sum()
        total = total + pg + beta * kl
    loss = total / input_ids.size(0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("loop, row", [
    ("i in range(input_ids.size(0))", "i, :lengths[i]"),
    ("i in range(len(trajs))", "i, 1:lengths[i]"),
    ("i, traj in enumerate(trajs)", "i"),
    ("i in range(input_ids.shape[0])", "i:i + 1, :-1"),
])
def test_each_sequences_row_averaged_is_its_own_token_mean(tmp_path, loop, row):
    """Before, the row picked by the loop's index read as the whole batch: a mean over a constant count, silent."""
    source = ROWS.format(loop=loop, row=row, reduce="mean")
    assert module_codes(source, tmp_path) == [(15, "KL002"), (15, "KL007")]


def test_each_sequences_row_summed_has_no_length_weight(tmp_path):
    source = ROWS.format(loop="i in range(input_ids.size(0))", row="i, :lengths[i]", reduce="sum")
    assert module_codes(source, tmp_path) == [(15, "KL002")]


@pytest.mark.parametrize("loop", ["i in range(seq_len)", "i in range(input_ids.size(1))", "i in reversed(range(B))",
                                  "i, step_kl in enumerate(rewards)", "i in range(num_chunks)"])
def test_an_index_over_the_positions_picks_no_sequence(tmp_path, loop):
    """Time-major code: `logprobs[t]` holds every sequence's token at position t; its mean is over the batch. A loop
    over chunks (torchtune's chunked GRPO loss) or other parts picks no sequence either."""
    source = ROWS.format(loop=loop, row="i", reduce="mean")
    assert module_codes(source, tmp_path) == [(15, "KL002")]


def test_a_counted_index_alone_may_pick_a_micro_batch(tmp_path):
    """open-instruct's `for i in range(num_samples): ... ref_logprobs_BT[i]`: a list of packed micro-batches, each
    averaged over its tokens (row 20). `range(n)` counts list entries as readily as sequences, so its index alone
    picks no row; the index of the items enumerated, or one beside a slice of the tokens, does."""
    source = ROWS.format(loop="i in range(num_samples)", row="i", reduce="mean")
    assert module_codes(source, tmp_path) == [(15, "KL002")]


def test_rows_written_back_into_a_buffer_are_the_whole_batch_again(tmp_path):
    """nano-rl moves each response into a buffer (`out[i, :n] = x[i, s:e]` for every i) before GAE and a token
    mean over the batch: the buffer holds every sequence, whose mean is no per-sequence one."""
    source = """\
    import torch


    def step(model, ref_model, optimizer, ids, starts, lengths, mask, beta):
        logprobs = model(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
        with torch.no_grad():
            ref_logprobs = ref_model(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
        kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
        local = torch.zeros_like(kl)
        for i in range(ids.size(0)):
            local[i, : lengths[i]] = kl[i, starts[i] : starts[i] + lengths[i]]
        loss = beta * masked_mean(local, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """
    assert module_codes(source, tmp_path) == [(12, "KL002")]
