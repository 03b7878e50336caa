"""Small autoregressive policies whose every response can be enumerated (docs/kl-math.md App. A).

A *policy* is any object with `vocab_size` (generatable tokens, EOS included), `horizon` (the
maximal response length T), `eos_id` (int, or None when every response has length T),
`parameters()` and `logits(tokens)`:

    logits(tokens: LongTensor[N, T]) -> Tensor[N, T, V]

gives the next-token logits at each position t from the (implicit) prompt and tokens[:, :t].
Position 0 predicts the first response token. Positions after an EOS are padding: their logits
are the constant 0 (finite, and no gradient flows from them).

Public API:
    TabularPolicy.random(vocab_size, horizon, *, eos=True, seed=0, scale=1.0)
        free logits for every prefix, one float64 parameter [num_prefixes, V].
    TinyCausalLM(vocab_size, horizon, *, eos=True, seed=0, ...)
        a randomly initialised float64 causal transformer (torch.nn, GPT-2's shape) with a
        BOS/prompt token that is never generated.
    perturbed(reference, scale, *, seed)  -> copy with parameters reference + scale * direction
    place_at_kl(reference, target_kl, *, seed) -> perturbed copy with KL_seq(copy || reference)
        equal to target_kl; audits run at 0.5..2 nats because near the reference the biased
        configurations look correct (kl-math.md section 4.3, App. A E).
    An older behaviour policy for off-policy audits is `perturbed(policy, staleness, seed=...)`
    (kl-math.md section 7 uses staleness 0.1 and 0.3 on the tabular policy).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Protocol, TypeVar

import torch

from klaudit.audit.exact import ExactProblem


class Policy(Protocol):
    """What klaudit.audit.exact needs from a policy (see the module docstring)."""

    vocab_size: int
    horizon: int
    eos_id: int | None

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def logits(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def to(self, device: str | torch.device) -> Policy: ...  # torch.nn.Module.to: itself, on `device`


AnyPolicy = TypeVar("AnyPolicy", bound=Policy)  # a copy of a policy is a policy of the same class


def _check_shape(vocab_size: int, horizon: int, eos: bool) -> None:
    """Reject vocabularies and horizons that cannot form a policy."""
    smallest = 2 if eos else 1
    if not isinstance(vocab_size, int) or vocab_size < smallest:
        raise ValueError(f"vocab_size must be an integer >= {smallest} (eos={eos}), got {vocab_size!r}")
    if not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")


def real_positions(tokens: torch.Tensor, eos_id: int | None) -> torch.Tensor:
    """[N, T] bool: position t is a real response position iff no EOS occurs in tokens[:, :t]."""
    if eos_id is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    eos_before = torch.cumsum((tokens == eos_id).long(), dim=-1) - (tokens == eos_id).long()
    return eos_before == 0


class TabularPolicy(torch.nn.Module):
    """Free logits per prefix: pi(v | h) = softmax(prefix_logits[index(h)])_v.

    Prefixes are the sequences of non-EOS tokens of length 0..T-1 (prefixes containing EOS do not
    exist). With A non-EOS tokens, the prefix of length t with digits d_1..d_t has index
    (A^t - 1) / (A - 1) + sum_i d_i A^(t-i), so all shorter prefixes come first.
    EOS, when present, is the last token id (V - 1).
    """

    _offsets: torch.Tensor  # buffers, registered in __init__
    _place_values: torch.Tensor

    def __init__(self, prefix_logits: torch.Tensor, horizon: int, *, eos: bool = True):
        super().__init__()
        if prefix_logits.dim() != 2:
            raise ValueError(f"prefix_logits must be [num_prefixes, V], got shape {tuple(prefix_logits.shape)}")
        vocab_size = prefix_logits.shape[1]
        _check_shape(vocab_size, horizon, eos)
        self.vocab_size = vocab_size
        self.horizon = horizon
        self.eos_id: int | None = vocab_size - 1 if eos else None
        self.num_plain = vocab_size - 1 if eos else vocab_size  # A, the non-EOS tokens
        expected = sum(self.num_plain**length for length in range(horizon))
        if prefix_logits.shape[0] != expected:
            raise ValueError(
                f"a V={vocab_size}, T={horizon}, eos={eos} policy has {expected} prefixes, "
                f"got {prefix_logits.shape[0]} rows of logits"
            )
        self.prefix_logits = torch.nn.Parameter(prefix_logits.to(torch.float64))
        # offset of the prefixes of each length t = 0..T-1, and A^(t-1-i) for digit i of a length-t prefix
        powers = [self.num_plain**t for t in range(horizon)]
        offsets = [sum(powers[:t]) for t in range(horizon)]
        place_values = torch.zeros(horizon, horizon, dtype=torch.long)
        for t in range(horizon):
            for i in range(t):
                place_values[i, t] = self.num_plain ** (t - 1 - i)
        self.register_buffer("_offsets", torch.tensor(offsets, dtype=torch.long), persistent=False)
        self.register_buffer("_place_values", place_values, persistent=False)

    @classmethod
    def random(
        cls, vocab_size: int, horizon: int, *, eos: bool = True, seed: int = 0, scale: float = 1.0
    ) -> TabularPolicy:
        """A policy with i.i.d. N(0, scale^2) logits for every prefix, reproducible from `seed`."""
        _check_shape(vocab_size, horizon, eos)
        num_plain = vocab_size - 1 if eos else vocab_size
        num_prefixes = sum(num_plain**length for length in range(horizon))
        generator = torch.Generator().manual_seed(seed)
        logits = scale * torch.randn(num_prefixes, vocab_size, generator=generator, dtype=torch.float64)
        return cls(logits, horizon, eos=eos)

    @property
    def num_prefixes(self) -> int:
        return self.prefix_logits.shape[0]

    def prefix_index(self, tokens: torch.Tensor) -> torch.Tensor:
        """[N, T] row of prefix_logits used at each position (arbitrary at padding positions)."""
        digits = tokens.clamp(max=self.num_plain - 1)  # EOS only occurs where the position is padding
        # digits @ place_values as a sum of products: CUDA has no integer matrix product
        return self._offsets + (digits.unsqueeze(-1) * self._place_values).sum(-2)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """[N, T, V] logits of each prefix; constant 0 after EOS."""
        real = real_positions(tokens, self.eos_id)
        table = self.prefix_logits[self.prefix_index(tokens)]
        return torch.where(real.unsqueeze(-1), table, torch.zeros((), dtype=table.dtype, device=table.device))


class TinyCausalLM(torch.nn.Module):
    """A randomly initialised float64 causal transformer over a tiny vocabulary, built from torch.nn.

    GPT-2's shape: token and learned position embeddings, pre-norm blocks of causal self-attention
    and a GELU MLP, a final layer norm and a linear head; weights N(0, init_std), biases 0. Token ids
    0..vocab_size-1 are generatable (EOS is vocab_size - 1 when eos=True); id vocab_size is a
    BOS/prompt token that starts every input and is never generated.
    """

    def __init__(
        self,
        vocab_size: int = 4,
        horizon: int = 4,
        *,
        eos: bool = True,
        seed: int = 0,
        hidden_size: int = 16,
        num_layers: int = 2,
        num_heads: int = 2,
        init_std: float = 0.5,
    ):
        super().__init__()
        _check_shape(vocab_size, horizon, eos)
        self.vocab_size = vocab_size
        self.horizon = horizon
        self.eos_id: int | None = vocab_size - 1 if eos else None
        self.bos_id = vocab_size
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
            torch.manual_seed(seed)
            self.token_embedding = torch.nn.Embedding(vocab_size + 1, hidden_size)
            self.position_embedding = torch.nn.Embedding(horizon, hidden_size)
            block = torch.nn.TransformerEncoderLayer(hidden_size, num_heads, dim_feedforward=4 * hidden_size,
                                                     dropout=0.0, activation="gelu", batch_first=True,
                                                     norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(block, num_layers, enable_nested_tensor=False)
            self.final_norm = torch.nn.LayerNorm(hidden_size)
            self.head = torch.nn.Linear(hidden_size, vocab_size)
            for name, parameter in self.named_parameters():
                with torch.no_grad():
                    if "norm" in name:
                        parameter.fill_(1.0 if name.endswith("weight") else 0.0)
                    elif parameter.dim() > 1:
                        parameter.normal_(0.0, init_std)
                    else:
                        parameter.zero_()
        self.to(torch.float64)

    def train(self, mode: bool = True) -> TinyCausalLM:
        """Always in training mode, which changes nothing else here (no dropout, no batch statistics) but keeps
        TransformerEncoderLayer off PyTorch's inference fast path (eval mode without autograd): on CUDA that path
        computes other float64 logits (1e-3 apart on an H200), so the reference's log-probs, computed without
        autograd, differed between devices and the verdicts with them."""
        return super().train(True)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """[N, T, V] logits for each response token given BOS and the earlier tokens; 0 after EOS."""
        horizon = tokens.shape[1]
        bos = torch.full_like(tokens[:, :1], self.bos_id)
        inputs = torch.cat([bos, tokens[:, :-1]], dim=1)
        positions = torch.arange(horizon, device=tokens.device)
        hidden = self.token_embedding(inputs) + self.position_embedding(positions)
        causal = torch.nn.Transformer.generate_square_subsequent_mask(horizon, device=tokens.device,
                                                                      dtype=hidden.dtype)
        full = self.head(self.final_norm(self.blocks(hidden, mask=causal, is_causal=True)))
        real = real_positions(tokens, self.eos_id)
        return torch.where(real.unsqueeze(-1), full, torch.zeros((), dtype=full.dtype, device=full.device))


def _direction(reference: Policy, seed: int) -> list[torch.Tensor]:
    """A fixed N(0, 1) tensor per parameter of `reference`, reproducible from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(p.shape, generator=generator, dtype=torch.float64).to(device=p.device, dtype=p.dtype)
        for p in reference.parameters()
    ]


def _shift_into(
    moved: Policy, reference: Policy, direction: list[torch.Tensor], scale: float
) -> None:
    """Set the parameters of `moved` (a copy of `reference`) to reference + scale * direction."""
    with torch.no_grad():
        for target, start, step in zip(moved.parameters(), reference.parameters(), direction):
            target.copy_(start + scale * step)


def perturbed(reference: AnyPolicy, scale: float, *, seed: int) -> AnyPolicy:
    """A copy of `reference` with every parameter moved by scale * N(0, 1) (direction fixed by seed)."""
    moved = copy.deepcopy(reference)
    _shift_into(moved, reference, _direction(reference, seed), float(scale))
    return moved


# place_at_kl retries along the directions of seed + k * stride (torch seeds only use 32 bits).
_RETRY_SEED_STRIDE = 1_000_003


def place_at_kl(
    reference: AnyPolicy,
    target_kl: float,
    *,
    seed: int,
    rtol: float = 1e-4,
    max_scale: float = 1e3,
    attempts: int = 8,
) -> AnyPolicy:
    """A perturbed copy of `reference` with KL_seq(copy || reference) = target_kl (relative tolerance rtol).

    Along the direction of `perturbed(reference, scale, seed=seed)` the scale is bracketed by
    doubling from 1e-3 and bisected to the first crossing of target_kl (KL by exact enumeration).
    A direction can saturate below the target (the copy turns deterministic on a response the
    reference finds likely); then the directions of seeds seed + k * 1_000_003, k = 1..attempts-1, are
    tried in turn, so the result is still a deterministic function of `seed`. ValueError if none
    reaches target_kl.
    """
    if not (isinstance(target_kl, (int, float)) and math.isfinite(target_kl) and target_kl > 0):
        raise ValueError(f"target_kl must be a positive finite number, got {target_kl!r}")
    candidate = copy.deepcopy(reference)
    problem = ExactProblem(candidate, reference)  # reads the candidate's parameters on every call
    best = 0.0
    for attempt in range(attempts):
        direction = _direction(reference, seed + attempt * _RETRY_SEED_STRIDE)

        def kl_at(scale: float, direction=direction) -> float:
            _shift_into(candidate, reference, direction, scale)
            return problem.kl_seq()

        low, high = 0.0, 1e-3
        kl_high = kl_at(high)
        while kl_high < target_kl and 2 * high <= max_scale:
            low, high = high, 2 * high
            kl_high = kl_at(high)
        best = max(best, kl_high)
        if kl_high < target_kl:
            continue
        scale, kl = high, kl_high  # invariant: KL(low) < target <= KL(high)
        while abs(kl - target_kl) > rtol * target_kl and high - low > 1e-12 * high:
            scale = 0.5 * (low + high)
            kl = kl_at(scale)
            if kl < target_kl:
                low = scale
            else:
                high = scale
        if abs(kl - target_kl) <= rtol * target_kl:
            return candidate  # its parameters are those of the last scale evaluated
    raise ValueError(
        f"KL(pi || ref) = {target_kl} is out of reach from this reference with seed={seed}: "
        f"the largest KL found along {attempts} directions up to scale {max_scale:g} was {best:.4g} nats"
    )
