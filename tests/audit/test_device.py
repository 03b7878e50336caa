"""check-grad and klaudit.estimators on a GPU: the same verdicts as on the CPU, and no host-device
synchronisation in the estimators. The CUDA tests skip, saying so, where torch sees no GPU; the error
for a device that does not exist here runs everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from klaudit.audit.runner import Target, audit_target  # noqa: E402
from klaudit.estimators import kl_penalty, kl_reward, token_kl  # noqa: E402

DATA = Path(__file__).parent / "data"
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def _verdicts(report) -> dict:
    return {(tuple(row.mode.items()), row.placement): (row.configuration, row.objective, row.unbiased, row.rule)
            for row in report.results}


def _audit(qualname: str = "kl_penalty", file: str = "verl_style.py", **options):
    return audit_target(Target(path=str(DATA / file), qualname=qualname), **options)


def test_a_device_torch_cannot_use_is_one_error_line():
    device = "cuda:7" if CUDA else "cuda"
    if CUDA and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    report = _audit(device=device)
    assert not report.results and len(report.errors) == 1
    assert report.errors[0].startswith(f"--device {device}: ")


@needs_cuda
@pytest.mark.parametrize("qualname, file", [("kl_penalty", "verl_style.py"),
                                            ("compute_approx_kl", "openrlhf_style.py")])
def test_the_tabular_audit_on_cuda_gives_the_cpu_verdicts(qualname, file):
    on_cpu, on_cuda = _audit(qualname, file), _audit(qualname, file, device="cuda")
    assert not on_cuda.errors
    assert _verdicts(on_cuda) == _verdicts(on_cpu)


@needs_cuda
def test_a_model_fingerprint_on_cuda_gives_the_cpu_verdicts(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(tmp_path)
    for placements in (None, ["loss+reward"]):
        on_cpu = _audit(model_dir=str(tmp_path), placements=placements)
        on_cuda = _audit(model_dir=str(tmp_path), device="cuda", placements=placements)
        assert not on_cuda.errors
        assert _verdicts(on_cuda) == _verdicts(on_cpu)


@needs_cuda
@pytest.mark.parametrize("estimator", ["k1", "k3", "rb"])
def test_the_estimators_never_synchronise_with_the_gpu(estimator):
    """torch.cuda.set_sync_debug_mode("error") turns every host-device synchronisation into an error."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(4, 16, 1000, generator=generator, device="cuda").to(torch.bfloat16).requires_grad_()
    ref_logits = torch.randn(4, 16, 1000, generator=generator, device="cuda").to(torch.bfloat16)
    tokens = torch.randint(0, 1000, (4, 16), generator=generator, device="cuda")
    mask = torch.rand(4, 16, generator=generator, device="cuda") < 0.8
    logprobs = torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).to(torch.bfloat16)
    ref_logprobs = torch.log_softmax(ref_logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old_logprobs = ref_logprobs + 0.1
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        term = kl_penalty(logprobs, ref_logprobs.to(torch.bfloat16), mask, estimator=estimator, logits=logits,
                          ref_logits=ref_logits, old_logprobs=old_logprobs.to(torch.bfloat16))
        term.loss.mean().backward()
        kl_reward(logprobs, ref_logprobs, mask)
        token_kl(logprobs, ref_logprobs, "k3")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert term.value.dtype == torch.float32 and logits.grad is not None
