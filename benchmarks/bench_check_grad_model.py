"""Cost of `klaudit check-grad TARGET --model DIR` on a real vocabulary, and what dominates it.

A random-init Qwen2-shaped causal LM with Qwen2's vocabulary (V = 151,936) is saved to a temporary
directory: by default with a small body (hidden 64, 2 layers: what the vocabulary costs), with `--shape
qwen2-0.5b` with Qwen2-0.5B's (2 GB; the model's forward passes then count). Then:

1. the whole command, --repeats times, against the same command without --model (the fingerprint
   batch from a tabular policy) as the baseline of the same run: wall time, CPU time (user + sys of
   every process it starts) and the ratio model / baseline; the two alternate, so that a change of
   the machine's load hits both;
2. one audit in a fresh process, as the check-grad child runs it (klaudit.audit.runner.audit_target),
   cut into phases by timers put around the functions that do each part: importing torch, importing
   transformers' model code, loading the weights, the fingerprint batch (the model's forward passes),
   the tabular policies, the fingerprint's catalog basis, the fingerprint comparisons of the switch
   values' rows, the exact audit of those rows on the tabular policies. What the phases leave of the
   command's wall time is the parent process and the child's start.

Every process runs as after `pip install`, with bytecode (benchmarks/bytecode.py), filled by an untimed first
run of each command. Run on an idle machine if you can; the load (`os.getloadavg`) is printed with the figures.

    python benchmarks/bench_check_grad_model.py [--vocab 151936] [--shape small|qwen2-0.5b] [--repeats 3]
        [--target tests/audit/data/verl_style.py::kl_penalty] [--tree DIR] [--device cuda] [--imports]

--imports also prints what the child's imports cost, module by module (`python -X importtime` of torch,
transformers and the model's code in a fresh process: the slowest modules by inclusive and by own time).

--tree DIR runs the klaudit found in DIR (a checkout of another commit, e.g. `git archive main | tar -x
-C DIR`) instead of this one, with this interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bytecode import user_environment  # noqa: E402

DEFAULT_TARGET = "tests/audit/data/verl_style.py::kl_penalty"


SHAPES = {  # hidden size, MLP size, layers, attention heads, key-value heads
    "small": (64, 128, 2, 4, 2),  # about 40 MB at V = 151,936: the vocabulary's cost alone
    "qwen2-0.5b": (896, 4864, 24, 14, 2),  # Qwen2-0.5B's body: about 2 GB in float32
}


def build_model(directory: str, vocab: int, shape: str = "small") -> None:
    """A seeded random-init Qwen2-shaped causal LM saved to `directory`."""
    import torch
    import transformers

    hidden, mlp, layers, heads, kv_heads = SHAPES[shape]
    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(directory)


def _cli(tree: Path, arguments: list[str]) -> list[str]:
    boot = "import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'klaudit'; from klaudit.cli import main; main()"
    return [sys.executable, "-c", boot, str(tree), *arguments]


def run_command(tree: Path, arguments: list[str], environment: dict[str, str]) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + sys of the command and every process it waited for), and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(_cli(tree, arguments), cwd=ROOT, capture_output=True, text=True, check=False,
                            env=environment)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        raise SystemExit(f"check-grad failed ({result.returncode}): {result.stdout}{result.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, result.stdout


# ----- the phases, in a fresh process -----

PHASES = {  # name: (module, attribute) whose calls are timed, inclusive
    "model weights load": ("transformers", "AutoModelForCausalLM.from_pretrained"),
    "fingerprint batch (incl. load)": ("klaudit.audit.fingerprint", "batch_from_model"),
    "tabular policies": ("klaudit.audit.measure", "standard_problems"),
    "fingerprint basis (catalog)": ("klaudit.audit.fingerprint", "Fingerprinter.__init__"),
    "fingerprint comparisons": ("klaudit.audit.fingerprint", "Fingerprinter._fits"),
    "rows (exact audit + comparisons)": ("klaudit.audit.measure", "_audit_row"),
}


def _timed(table: dict, name: str, function):
    def wrapper(*args, **kwargs):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            table[name][0] += time.perf_counter() - start
            table[name][1] += time.process_time() - cpu
            table[name][2] += 1

    return wrapper


def phases_worker(model_dir: str, target_text: str, device: str = "cpu") -> None:
    """In a fresh process: the child's work, phase by phase; prints one JSON object."""
    table: dict[str, list[float]] = {}

    def clock(name: str, start: float, cpu: float) -> None:
        table[name] = [time.perf_counter() - start, time.process_time() - cpu, 1]

    start, cpu = time.perf_counter(), time.process_time()
    import torch  # noqa: F401

    clock("import torch", start, cpu)
    start, cpu = time.perf_counter(), time.process_time()
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(transformers.AutoConfig.from_pretrained(model_dir))]  # imports the model code
    clock("import transformers + model code", start, cpu)
    start, cpu = time.perf_counter(), time.process_time()
    from klaudit.audit import runner

    clock("import klaudit.audit", start, cpu)
    for name, (module_name, attribute) in PHASES.items():
        owner = importlib.import_module(module_name)
        *path, last = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        table[name] = [0.0, 0.0, 0]
        function = inspect.getattr_static(owner, last)
        if isinstance(function, classmethod):
            setattr(owner, last, classmethod(_timed(table, name, function.__func__)))
        else:
            setattr(owner, last, _timed(table, name, function))
    start, cpu = time.perf_counter(), time.process_time()
    report = runner.audit_target(runner.parse_target(target_text), model_dir=model_dir, device=device)
    clock("audit_target (all of the audit)", start, cpu)
    if report.errors:
        raise SystemExit(f"the audit failed: {report.errors}")
    print(json.dumps({"phases": table, "rows": len(report.results)}))


def measure_phases(tree: Path, model_dir: str, target: str, device: str, environment: dict[str, str]) -> dict:
    boot = (f"import sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            f"import bench_check_grad_model as bench; bench.phases_worker({model_dir!r}, {target!r}, {device!r})")
    result = subprocess.run([sys.executable, "-c", boot], cwd=ROOT, capture_output=True, text=True, check=True,
                            env=environment)
    return json.loads(result.stdout.strip().splitlines()[-1])


IMPORT_MODEL_CODE = ("import sys, torch, transformers\n"
                     "from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING\n"
                     "MODEL_FOR_CAUSAL_LM_MAPPING[type(transformers.AutoConfig.from_pretrained(sys.argv[1]))]")


def print_import_profile(model_dir: str, environment: dict[str, str], shown: int = 25) -> None:
    """The slowest imports of torch, transformers and the model's code in a fresh process (-X importtime)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", IMPORT_MODEL_CODE, model_dir],
                            capture_output=True, text=True, check=True, env=environment)
    rows = []  # (own us, inclusive us, module with its nesting)
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, inclusive, name = line.removeprefix("import time:").split("|", 2)
            rows.append((int(own), int(inclusive), name.rstrip()))
    total = sum(own for own, _, _ in rows)
    print(f"\nimports of torch, transformers and the model's code: {total / 1e6:.2f} s in {len(rows)} modules")
    for title, key in (("inclusive", 1), ("own", 0)):
        print(f"  slowest by {title} time:")
        for row in sorted(rows, key=lambda row: -row[key])[:shown]:
            print(f"    {row[key] / 1e6:6.2f} s  {row[2]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the klaudit checkout to run (default: this one)")
    parser.add_argument("--device", default="cpu", help="where the audit runs (check-grad --device)")
    parser.add_argument("--imports", action="store_true", help="also profile the child's imports, module by module")
    args = parser.parse_args()
    on_device = ["--device", args.device]
    with (tempfile.TemporaryDirectory(prefix="klaudit-bench-model-") as model_dir,
          tempfile.TemporaryDirectory(prefix="klaudit-bench-bytecode-") as bytecode_cache):
        build_model(model_dir, args.vocab, args.shape)
        environment = user_environment(bytecode_cache)
        commands = {"--model": ["check-grad", args.target, "--model", model_dir, *on_device],
                    "baseline": ["check-grad", args.target, *on_device]}
        for arguments in commands.values():  # untimed: fills the bytecode cache
            run_command(args.tree, arguments, environment)
        print(f"target {args.target}, random-init Qwen2 shape ({args.shape}), V = {args.vocab}, tree {args.tree}, "
              f"device {args.device}, {os.cpu_count()} CPUs, load at start {os.getloadavg()[0]:.2f}")
        timings: dict[str, list[tuple[float, float]]] = {label: [] for label in commands}
        outputs = {}
        for _ in range(args.repeats):
            for label, arguments in commands.items():
                wall, cpu, outputs[label] = run_command(args.tree, arguments, environment)
                timings[label].append((wall, cpu))
        print(f"load after the commands {os.getloadavg()[0]:.2f}; "
              f"{sum(' biased' in line or 'unbiased' in line for line in outputs['--model'].splitlines())} rows")
        print(f"{'command':<22} {'wall s (median, each)':<34} {'CPU s (median, each)':<34}")
        for label, pairs in timings.items():
            walls, cpus = [w for w, _ in pairs], [c for _, c in pairs]
            print(f"{label:<22} {statistics.median(walls):6.2f} {' '.join(f'{w:.2f}' for w in walls):<27} "
                  f"{statistics.median(cpus):6.2f} {' '.join(f'{c:.2f}' for c in cpus)}")
        model_wall = statistics.median(w for w, _ in timings["--model"])
        model_cpu = statistics.median(c for _, c in timings["--model"])
        print(f"ratio --model / baseline: wall {model_wall / statistics.median(w for w, _ in timings['baseline']):.2f}, "
              f"CPU {model_cpu / statistics.median(c for _, c in timings['baseline']):.2f}")
        measured = measure_phases(args.tree, model_dir, args.target, args.device, environment)
        print(f"\nphases of one audit in a fresh process ({measured['rows']} rows; inclusive, so nested phases "
              f"overlap; shares of the command's median CPU {model_cpu:.2f} s), load {os.getloadavg()[0]:.2f}")
        for name, (wall, cpu, calls) in measured["phases"].items():
            print(f"  {name:<36} {wall:6.2f} s wall {cpu:6.2f} s CPU {int(calls):4d} calls  {cpu / model_cpu:5.1%}")
        child = sum(measured["phases"][name][1] for name in
                    ("import torch", "import transformers + model code", "import klaudit.audit",
                     "audit_target (all of the audit)"))
        print(f"  {'rest: parent (lint), child start':<36} {'':13} {model_cpu - child:6.2f} s CPU{'':11}"
              f"{(model_cpu - child) / model_cpu:5.1%}")
        if args.imports:
            print_import_profile(model_dir, environment)

if __name__ == "__main__":
    main()
