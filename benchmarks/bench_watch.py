"""The cost of `klaudit.watch` in a training step, as ratios against the bare step of the same run.

A small random-init Llama (V = 32000) trains on CPU (or --device cuda) with a k3 KL loss; three timings:
the bare step, the wrapper on a call it does not audit (the watched KL call minus the bare KL call, over
many calls), and one audited call (the audit of the KL function on copies of its tensors, minus the bare
call). The overhead at `every=N` is (audit + (N - 1) * wrapper) / (N * bare step). Medians of --repeats,
interleaved so that a change of the machine's load hits all three; run on an idle machine.

    python benchmarks/bench_watch.py [--device cuda] [--batch 8] [--response 256] [--every 100]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings

import torch
import transformers

from klaudit.watch import KLGradientWarning, Reporter, watch

PROMPT = 16


def k3_loss(logprobs, ref_logprobs, mask):
    log_ratio = ref_logprobs - logprobs
    return ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum() / mask.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    device = torch.device(args.device)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                                      max_position_embeddings=PROMPT + args.response)
    torch.manual_seed(0)
    policy = transformers.LlamaForCausalLM(config).to(device)
    reference = transformers.LlamaForCausalLM(config).to(device).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5)
    ids = torch.randint(0, 32000, (args.batch, PROMPT + args.response), device=device)
    mask = torch.ones(args.batch, args.response, device=device)

    def step(kl_fn) -> float:
        synchronize(device)
        start = time.perf_counter()
        response = ids[:, PROMPT:].unsqueeze(-1)
        logits = policy(input_ids=ids).logits[:, PROMPT - 1:-1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, response).squeeze(-1)
        with torch.no_grad():
            ref_logits = reference(input_ids=ids).logits[:, PROMPT - 1:-1]
            ref_logprobs = torch.log_softmax(ref_logits.float(), -1).gather(-1, response).squeeze(-1)
        loss = -(logprobs * mask).mean() + 0.1 * kl_fn(logprobs, ref_logprobs, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        synchronize(device)
        return time.perf_counter() - start

    def wrapper_cost(calls: int = 200) -> float:
        """The watched KL call minus the bare one, per call, on a call that is not audited."""
        logprobs = torch.randn(args.batch, args.response, device=device, requires_grad=True)
        ref = torch.randn(args.batch, args.response, device=device)
        timings = []
        for fn in (passing, k3_loss):
            synchronize(device)
            start = time.perf_counter()
            for _ in range(calls):
                fn(logprobs, ref, mask)
            synchronize(device)
            timings.append((time.perf_counter() - start) / calls)
        return timings[0] - timings[1]

    def audit_cost() -> float:
        """One audited call minus the bare call, on the tensors of a step."""
        logprobs = torch.randn(args.batch, args.response, device=device, requires_grad=True)
        ref = torch.randn(args.batch, args.response, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KLGradientWarning)
            watched = watch(k3_loss, reporter=Reporter("warn"))
            synchronize(device)
            start = time.perf_counter()
            watched(logprobs, ref, mask)
            synchronize(device)
            audited = time.perf_counter() - start
        start = time.perf_counter()
        k3_loss(logprobs, ref, mask)
        synchronize(device)
        return audited - (time.perf_counter() - start)

    logging.getLogger("klaudit.watch").setLevel(logging.ERROR)
    step(k3_loss)  # warm-up
    passing = watch(k3_loss, reporter=Reporter("log", "/dev/null"))
    passing(torch.randn(2, 3, requires_grad=True, device=device), torch.randn(2, 3, device=device),
            torch.ones(2, 3, device=device))  # its one audited call, out of the timings
    bare, wrapped, audits = [], [], []
    for _ in range(args.repeats):
        bare.append(step(k3_loss))
        wrapped.append(wrapper_cost())
        audits.append(audit_cost())
    bare_step, wrapper, audit = (statistics.median(x) for x in (bare, wrapped, audits))
    overhead = (audit + (args.every - 1) * wrapper) / (args.every * bare_step)
    print(f"device {device}, threads {torch.get_num_threads()}, batch {args.batch} x {args.response} tokens, "
          f"Llama V=32000 hidden {args.hidden} x {args.layers} layers, medians of {args.repeats}")
    print(f"bare step                      {bare_step * 1e3:9.1f} ms   1.000")
    print(f"wrapper, call not audited      {wrapper * 1e6:9.1f} us   {wrapper / bare_step:.5f} of a step")
    print(f"one audited call (extra)       {audit * 1e3:9.1f} ms   {audit / bare_step:.3f} of a step")
    print(f"overhead with every={args.every:<4}                    {overhead:.4f} of a step ({overhead:.2%})")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
