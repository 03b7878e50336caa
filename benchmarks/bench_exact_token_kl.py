"""Time and peak memory of `exact_token_kl` against the naive full-vocabulary KL, forward + backward.

Naive: two full log_softmax, exp, subtract, multiply, sum, then autograd; every step holds a
[B*T, V] tensor. Chunked: `klaudit.estimators.exact_token_kl` (custom autograd Function).

Memory is measured as peak RSS, because the CPU allocator has no statistics of its own: each
variant runs in a fresh subprocess, which first allocates and touches the inputs plus a buffer
the size of the logits' gradient and records its peak RSS (getrusage ru_maxrss) as the baseline,
then frees that buffer and runs. PyTorch's CPU allocator returns freed large blocks to the OS, so
the gradient takes the buffer's place; "peak extra" = final peak RSS - baseline is the memory a
variant needs beyond the unavoidable inputs and output gradient. Time is the best of several
forward+backward repeats in the same process (the first, warm-up call is not timed); the two
variants' processes alternate for several rounds and each keeps its best time and its largest
peak, so load from other processes on a shared machine hits both alike.

Run: .venv/bin/python benchmarks/bench_exact_token_kl.py [--vocab 32000 152000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

ROWS_SHAPE = (2, 1000)  # B, T: about 2,000 tokens


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _naive_kl(logits, ref_logits):
    import torch

    policy_logprobs = torch.log_softmax(logits, -1)
    ref_logprobs = torch.log_softmax(ref_logits, -1)
    return (policy_logprobs.exp() * (policy_logprobs - ref_logprobs)).sum(-1)


def _worker(variant: str, vocab_size: int, repeats: int, chunk_size) -> dict:
    """Measure one variant in this (fresh) process; returns seconds and peak extra bytes."""
    import torch

    from klaudit.estimators import exact_token_kl

    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(0)
    shape = (*ROWS_SHAPE, vocab_size)
    logits = torch.randn(shape, generator=generator).mul_(2.0).requires_grad_()
    ref_logits = torch.randn(shape, generator=generator).mul_(2.0)
    grad_of_kl = torch.rand(ROWS_SHAPE, generator=generator)
    gradient_slot = torch.ones(shape)  # touched, so it counts in the baseline RSS
    baseline = _peak_rss_bytes()
    del gradient_slot

    def run():
        logits.grad = None
        if variant == "naive":
            kl = _naive_kl(logits, ref_logits)
        else:
            kl = exact_token_kl(logits, ref_logits, chunk_size=chunk_size)
        kl.backward(grad_of_kl)
        return kl.detach()

    run()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)
    return {"seconds": min(seconds), "peak_extra": _peak_rss_bytes() - baseline}


def _measure(variant: str, vocab_size: int, repeats: int, chunk_size) -> dict:
    command = [sys.executable, __file__, "--worker", variant, "--vocab", str(vocab_size)]
    command += ["--repeats", str(repeats)]
    if chunk_size is not None:
        command += ["--chunk-size", str(chunk_size)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 152000])
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per process")
    parser.add_argument("--rounds", type=int, default=2, help="processes per variant")
    parser.add_argument("--chunk-size", type=int, default=None, help="rows per chunk")
    parser.add_argument("--worker", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.vocab[0], args.repeats, args.chunk_size)))
        return

    batch, length = ROWS_SHAPE
    print(f"exact_token_kl vs naive, float32, B={batch} T={length}, forward+backward, 2 threads")
    header = f"{'V':>7} {'naive s':>8} {'chunked s':>9} {'time x':>7} "
    header += f"{'naive MiB':>9} {'chunked MiB':>11} {'memory x':>8}"
    print(header)
    for vocab_size in args.vocab:
        runs = {"naive": [], "chunked": []}
        for _ in range(args.rounds):
            runs["naive"].append(_measure("naive", vocab_size, args.repeats, None))
            runs["chunked"].append(_measure("chunked", vocab_size, args.repeats, args.chunk_size))
        naive, chunked = (
            {key: pick(run[key] for run in runs[variant]) for key, pick in (("seconds", min), ("peak_extra", max))}
            for variant in ("naive", "chunked")
        )
        mib = 2**20
        print(
            f"{vocab_size:>7} {naive['seconds']:>8.3f} {chunked['seconds']:>9.3f} "
            f"{chunked['seconds'] / naive['seconds']:>7.3f} "
            f"{naive['peak_extra'] / mib:>9.0f} {chunked['peak_extra'] / mib:>11.0f} "
            f"{chunked['peak_extra'] / naive['peak_extra']:>8.3f}"
        )
    print("targets: time x <= 1.2, memory x <= 0.25 (peak RSS above inputs + gradient)")


if __name__ == "__main__":
    main()
