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
