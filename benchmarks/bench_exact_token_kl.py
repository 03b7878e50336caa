"""Time and peak memory of `exact_token_kl` against the naive full-vocabulary KL, forward + backward.

Naive: two full log_softmax, exp, subtract, multiply, sum, then autograd; every step holds a
[B*T, V] tensor. klaudit: `klaudit.estimators.exact_token_kl` (chunked torch code on CPU, the fused
Triton kernel on CUDA).

CPU (default): memory is measured as peak RSS, because the CPU allocator has no statistics of its own:
each variant runs in a fresh subprocess, which first allocates and touches the inputs plus a buffer
the size of the logits' gradient and records its peak RSS (getrusage ru_maxrss) as the baseline,
then frees that buffer and runs. PyTorch's CPU allocator returns freed large blocks to the OS, so
the gradient takes the buffer's place; "peak extra" = final peak RSS - baseline is the memory a
variant needs beyond the unavoidable inputs and output gradient. Time is the best of several
forward+backward repeats in the same process (the first, warm-up call is not timed); the two
variants' processes alternate for several rounds and each keeps its best time and its largest
peak, so load from other processes on a shared machine hits both alike.

CUDA (--device cuda): naive, torch.compile(naive), klaudit's chunked torch code and klaudit (the fused
kernel) side by side on [rows, V] logits, for each dtype: the median of CUDA-event timings after warm-up, the peak extra memory
(torch.cuda.max_memory_allocated above the inputs, less the logits' gradient), and "x floor", the
time over the bandwidth floor: reading logits and ref_logits and writing the gradient once, at the
device-to-device copy bandwidth measured in the same run. The GPU's name is printed with the table. `--launch FILE` first applies the
kernels' launch parameters that `tune_token_kl.py --json FILE` chose (for each dtype, its choice at the
largest vocabulary), to measure them before they become the defaults.

Run: .venv/bin/python benchmarks/bench_exact_token_kl.py [--vocab 32000 152000] [--rounds 2]
     .venv/bin/python benchmarks/bench_exact_token_kl.py --device cuda [--rows 8192] [--dtype float32 bfloat16]
         [--launch FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

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


def _cuda_milliseconds(step, repeats: int) -> float:
    """Median milliseconds of `step()` over `repeats` CUDA-event timings, after two warm-up calls."""
    import statistics

    import torch

    for _ in range(2):
        step()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _copy_bandwidth(tensor, repeats: int) -> float:
    """Bytes per second of a device-to-device copy of `tensor` (one read and one write)."""
    import torch

    target = torch.empty_like(tensor)
    milliseconds = _cuda_milliseconds(lambda: target.copy_(tensor), repeats)
    return 2 * tensor.numel() * tensor.element_size() / (milliseconds / 1e3)


def _cuda_case(variants: dict, dtype_name: str, vocab_size: int, rows: int, repeats: int) -> None:
    """One (dtype, V) block of the CUDA table: every variant, then the floor."""
    import torch

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (2 * torch.randn(rows, vocab_size, generator=generator, device="cuda")).to(dtype).requires_grad_()
    ref_logits = (2 * torch.randn(rows, vocab_size, generator=generator, device="cuda")).to(dtype)
    grad_of_kl = torch.rand(rows, generator=generator, device="cuda")
    one_pass = logits.numel() * logits.element_size()
    floor_ms = 3 * one_pass / _copy_bandwidth(logits.detach(), repeats) * 1e3
    for name, kl_of in variants.items():

        def step(kl_of=kl_of):
            logits.grad = None
            kl_of(logits, ref_logits).backward(grad_of_kl)

        milliseconds = _cuda_milliseconds(step, repeats)
        logits.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - before - one_pass) / 2**30
        print(f"| {dtype_name} | {vocab_size:,} | {name} | {milliseconds:.1f} | {max(extra, 0.0):.2f} | "
              f"{milliseconds / floor_ms:.1f} |")
    print(f"| {dtype_name} | {vocab_size:,} | floor (3 passes at the copy bandwidth) | {floor_ms:.1f} | | 1.0 |")


def _apply_launches(path: Path) -> None:
    """Make the kernels' launch parameters those `tune_token_kl.py --json` chose, per dtype element size."""
    import torch

    from klaudit.kernels import token_kl

    for case in sorted(json.loads(path.read_text())["cases"], key=lambda case: case["vocab"]):  # largest V last
        size = getattr(torch, case["dtype"]).itemsize
        for kernel, table in (("forward", token_kl.FORWARD), ("backward", token_kl.BACKWARD)):
            if case["chosen"][kernel] is not None:
                table[size] = token_kl.Launch(**case["chosen"][kernel]["launch"])
    print(f"launch parameters from {path}: forward {token_kl.FORWARD}, backward {token_kl.BACKWARD}")


def _cuda_table(vocab_sizes: list[int], dtype_names: list[str], rows: int, repeats: int) -> None:
    """Print naive, torch.compile(naive) and klaudit side by side on the GPU (see the module docstring)."""
    import torch

    from klaudit.estimators import exact_token_kl

    variants = {"naive": _naive_kl, "torch.compile": torch.compile(_naive_kl),
                "klaudit, chunked torch code": lambda x, r: exact_token_kl(x, r, backend="torch"),
                "klaudit": exact_token_kl}
    print(f"exact_token_kl on {torch.cuda.get_device_name()}, torch {torch.__version__}, {rows} rows, "
          f"forward+backward")
    print("| dtype | V | variant | ms | peak extra GiB | x floor |")
    print("|---|---|---|---|---|---|")
    for dtype_name in dtype_names:
        for vocab_size in vocab_sizes:
            _cuda_case(variants, dtype_name, vocab_size, rows, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vocab", type=int, nargs="+", default=None,
                        help="vocabulary sizes (default: 32000 152000 on CPU, 152064 32000 on CUDA)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per process (CPU 2, CUDA 10)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per variant (CPU)")
    parser.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (CPU)")
    parser.add_argument("--rows", type=int, default=8192, help="rows B*T (CUDA)")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], help="logit dtypes (CUDA)")
    parser.add_argument("--launch", type=Path, default=None, help="tune_token_kl.py's JSON to apply first (CUDA)")
    parser.add_argument("--worker", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("--device cuda: torch sees no CUDA GPU here")
        if args.launch:
            _apply_launches(args.launch)
        _cuda_table(args.vocab or [152064, 32000], args.dtype, args.rows, args.repeats or 10)
        return
    args.vocab = args.vocab or [32000, 152000]
    args.repeats = args.repeats or 2
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
