"""Small trainer sources shared by the lint tests that need a real finding."""

# A k3 estimate differentiated as a loss: one KL002, on the return of `kl_loss` (line 7).
K3_LOSS_TRAINER = '''import torch


def kl_loss(log_probs, ref_log_probs, mask):
    log_ratio = ref_log_probs - log_probs
    kl = torch.exp(log_ratio) - log_ratio - 1
    return (kl * mask).sum() / mask.sum()


def compute_loss(policy_log_probs, ref_log_probs, mask, pg_loss, beta):
    loss = pg_loss + beta * kl_loss(policy_log_probs, ref_log_probs, mask)
    loss.backward()
'''

# A training step with a k3 estimate in its loss (KL002), for a module's imports to go before: `import torch` and
# the imports are the caller's to write.
K3_STEP = """

def step(policy, ref, batch, beta, optimizer):
    logp = policy(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
    with torch.no_grad():
        ref_logp = ref(batch.input_ids).logits.log_softmax(-1).gather(-1, batch.actions).squeeze(-1)
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    loss = -(logp * batch.advantages).mean() + beta * kl.mean()
    loss.backward()
    optimizer.step()
"""


def module_codes(source: str, tmp_path, name: str = "snippet.py", **modules: str) -> list:
    """(line, code) of every finding `check_module` gives on `source` (dedented), written to tmp_path as `name`
    beside `modules` (module name: its source, dedented), which it may import."""
    import textwrap

    import libcst as cst

    from klaudit.lint.checks import check_module
    from klaudit.lint.project import Project

    for module, text in modules.items():
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(text))
    path = tmp_path / name
    text = textwrap.dedent(source)
    path.write_text(text)
    return sorted((f.line, f.code) for f in check_module(str(path), cst.parse_module(text), Project([tmp_path]), text))
