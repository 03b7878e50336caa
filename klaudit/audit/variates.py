"""Zero-mean control variates for per-sample gradients w.r.t. a policy's logits (docs/kl-math.md §3.1, §4.1).

At position t of a response, with p = pi(.|h_t), q = ref(.|h_t) and delta(v) = log p(v) - log q(v) known for
every token v, the score of the sampled token w.r.t. the logits is s_t = e_{y_t} - p, and E[s_t | h_t] = 0.
For any function phi of the log-ratio, E[phi(delta(y_t)) s_t | h_t] = p o (phi(delta) - E_p phi) (o: entrywise),
so each of these has mean zero under pi, whatever the rest of the response:

    local_k   phi_k(y_t) s_t - p o (phi_k - E_p phi_k)           (the token itself)
    future_k  s_t sum_{u>t} (phi_k(y_u) - E_{p_u} phi_k)           (later tokens: zero mean given h_u, u > t)
    past_k    s_t sum_{u<t} phi_k(y_u)                             (earlier tokens: a baseline of h_t)
    baselines s_t 1{t = tau},  s_t KL_t(h_t) 1{t = tau}            (a baseline per position, kl-math.md §4.1)

phi_k are hat functions of delta on K evenly spaced knots from the 1st to the 99th percentile of sampled
log-ratios, the outer two continued linearly, so that their combinations are the piecewise-linear functions
of delta (a k1 term's delta is matched on every token). Knots at rarer quantiles, or the ratio ref/pi as a
function, make variates that are large mostly on rare draws: their zero mean holds, but their fitted weights
carry noise onto those draws and spoil a test's Gaussian approximation (measured: z's sd up to 2.2). A KL term's
per-sample logits gradient minus sum_j beta_j variate_j has the same mean for any fixed beta, and, with beta
fitted by least squares, much less variance: k2 as a loss, delta_t s_t, is local_k's image of phi = delta, and a
reward-to-go's later k1 terms are future_k's.

Every variate at (n, t) lies in span{s_t, g_1, ..., g_K}, g_k = p o (phi_k - E_p phi_k); `VariateBasis` holds
them as coefficients C [n, T, 1 + K, J] over that basis with the basis' Gram matrix [n, T, 1 + K, 1 + K],
computed by scatter-adds (every token lies on two hats), so nothing of size V x J is formed.
"""

from __future__ import annotations

import torch

KNOT_RANGE = (0.01, 0.99)  # the knots span these quantiles of the sampled log-ratios
KNOTS = 9
RIDGE = 1e-3  # relative to the mean diagonal of the normal equations: near-collinear variates get no weight


def knots_from(log_ratios: torch.Tensor) -> torch.Tensor:
    """KNOTS evenly spaced hat-function knots over the KNOT_RANGE quantiles of sampled tokens' log-ratios."""
    values = log_ratios.detach().to(torch.float64).flatten()
    low, high = (-1.0, 1.0) if values.numel() == 0 else torch.quantile(
        values, torch.tensor(KNOT_RANGE, dtype=torch.float64, device=values.device)).tolist()
    if not high - low > 1e-6:
        low, high = low - 1.0, high + 1.0
    return torch.linspace(low, high, KNOTS, dtype=torch.float64, device=log_ratios.device)


def _reward_to_go(values: torch.Tensor) -> torch.Tensor:
    return values.flip(-1).cumsum(-1).flip(-1)


class VariateBasis:
    """The policy's local quantities on a batch of responses and the control variates' coefficients.

    logits, ref_logits [n, T, V], tokens, mask [n, T]; knots [K] (K >= 2). Float64 throughout.
    """

    def __init__(self, logits: torch.Tensor, ref_logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor,
                 knots: torch.Tensor):
        log_p = torch.log_softmax(logits.to(torch.float64), -1)
        delta = log_p - torch.log_softmax(ref_logits.to(torch.float64), -1)
        self.mask = mask.to(torch.float64)
        self.tokens = tokens.unsqueeze(-1)
        self.p = log_p.exp()
        self.log_p = log_p
        self.kl = (self.p * delta).sum(-1)  # KL_t(h_t)
        self.kl_direction = self.p * (delta - self.kl.unsqueeze(-1))  # d KL_t / d logits
        self.log_ratio = delta.gather(-1, self.tokens).squeeze(-1)  # delta(y_t)
        self.knots = knots
        count = knots.numel()
        step = (knots[-1] - knots[0]).item() / (count - 1)
        position = (delta - knots[0].item()).div_(step)
        del delta
        self.bins = position.floor().clamp_(0, count - 2).long()
        self.fraction = position.sub_(self.bins)  # the weight of the upper hat: in [0, 1] between the knots
        self.p_token = self.p.gather(-1, self.tokens).squeeze(-1)
        upper = self.p * self.fraction  # p phi_{j+1}
        lower = self.p - upper  # p phi_j
        self.hat_means = self._binned(lower, upper)  # E_p phi_k [n, T, K]
        self.squared_sum = self.p.square().sum(-1)
        self.hat_squared = self._binned(lower * self.p, upper * self.p)  # sum_v p_v^2 phi_k(v)
        self.hats_at_token = self._at_token()  # phi_k(y_t) [n, T, K]
        self.gram = self._gram(lower, upper)
        self.coefficients = self._coefficients()
        self.kl_projections = self.projections_of(self.kl_direction)

    # ----- the hats -----

    def _binned(self, on_lower: torch.Tensor, on_upper: torch.Tensor, *, beside: bool = False) -> torch.Tensor:
        """Scatter-add per token: on_lower into its hat j, on_upper into hat j + 1 (or both into j with beside)."""
        out = on_lower.new_zeros(*on_lower.shape[:-1], self.knots.numel())
        out.scatter_add_(-1, self.bins, on_lower)
        out.scatter_add_(-1, self.bins if beside else self.bins + 1, on_upper)
        return out

    def hat_sums(self, values: torch.Tensor) -> torch.Tensor:
        """sum_v values_v phi_k(delta_v) [n, T, K] for values [n, T, V]."""
        upper = values * self.fraction
        return self._binned(values - upper, upper)

    def hat_function(self, weights: torch.Tensor) -> torch.Tensor:
        """psi(delta_v) = sum_k weights_k phi_k(delta_v) [n, T, V] for weights [n, T, K]."""
        rises = weights[..., 1:] - weights[..., :-1]
        return weights.gather(-1, self.bins).addcmul_(rises.gather(-1, self.bins), self.fraction)

    def _at_token(self) -> torch.Tensor:
        bins = self.bins.gather(-1, self.tokens)
        fraction = self.fraction.gather(-1, self.tokens)
        out = self.hat_means.new_zeros(self.hat_means.shape)
        out.scatter_add_(-1, bins, 1 - fraction)
        out.scatter_add_(-1, bins + 1, fraction)
        return out

    def _gram(self, lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
        """<b_i, b_j> [n, T, 1 + K, 1 + K] of the basis b_0 = s, b_k = g_k (lower, upper: p phi_j, p phi_{j+1})."""
        diagonal = self._binned(lower.square(), upper.square())
        product = lower * upper
        beside = self._binned(product, torch.zeros_like(product), beside=True)
        hats = torch.diag_embed(diagonal) + torch.diag_embed(beside[..., :-1], 1) + torch.diag_embed(beside[..., :-1], -1)
        means, weighted = self.hat_means, self.hat_squared
        hats = (hats - means.unsqueeze(-1) * weighted.unsqueeze(-2) - weighted.unsqueeze(-1) * means.unsqueeze(-2)
                + means.unsqueeze(-1) * means.unsqueeze(-2) * self.squared_sum[..., None, None])
        with_score = (self.p_token.unsqueeze(-1) * (self.hats_at_token - means)
                      - (weighted - means * self.squared_sum.unsqueeze(-1)))
        score = 1 - 2 * self.p_token + self.squared_sum
        top = torch.cat([score.unsqueeze(-1), with_score], -1)
        return torch.cat([top.unsqueeze(-2), torch.cat([with_score.unsqueeze(-1), hats], -1)], -2)

    def _coefficients(self) -> torch.Tensor:
        """C [n, T, 1 + K, J]: every variate over the basis (local, future, past, baselines; module docstring)."""
        rows, horizon, count = *self.mask.shape, self.knots.numel()
        mask = self.mask.unsqueeze(-1)
        centred = (self.hats_at_token - self.hat_means) * mask
        future = _reward_to_go(centred.transpose(1, 2)).transpose(1, 2) - centred
        at_token = self.hats_at_token * mask
        past = at_token.cumsum(1) - at_token
        positions = torch.eye(horizon, dtype=torch.float64, device=mask.device).expand(rows, horizon, horizon)
        score_row = torch.cat([self.hats_at_token, future, past, positions, positions * self.kl.unsqueeze(-1)], -1)
        variates = score_row.shape[-1]
        hat_rows = score_row.new_zeros(rows, horizon, count, variates)
        hat_rows[..., :count] = -torch.eye(count, dtype=torch.float64, device=mask.device)
        return torch.cat([score_row.unsqueeze(-2), hat_rows], -2) * mask.unsqueeze(-1)

    # ----- projections and the fit -----

    def projections_of(self, vectors: torch.Tensor) -> torch.Tensor:
        """<b_i, x_t> [n, T, 1 + K] of vectors x [n, T, V]."""
        along_p = (vectors * self.p).sum(-1)
        score = vectors.gather(-1, self.tokens).squeeze(-1) - along_p
        hats = self.hat_sums(vectors * self.p) - self.hat_means * along_p.unsqueeze(-1)
        return torch.cat([score.unsqueeze(-1), hats], -1)

    def score_projections(self, coefficient: torch.Tensor) -> torch.Tensor:
        """<b_i, c_t s_t> for a coefficient c [n, T] of the score: c times the Gram's first column."""
        return coefficient.unsqueeze(-1) * self.gram[..., 0]

    def normal_matrix(self, weights: torch.Tensor) -> torch.Tensor:
        """sum over (n, t) of weights[n, t] C^T Gram C: [J, J]."""
        gram_c = self.gram @ self.coefficients
        return torch.einsum("ntaj,ntak,nt->jk", self.coefficients, gram_c, weights)

    def normal_vector(self, projections: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum over (n, t) of weights[n, t] C^T <b, x>: [J] for projections <b, x> [n, T, 1 + K]."""
        return torch.einsum("ntaj,nta,nt->j", self.coefficients, projections, weights)

    def score_minus(self, score: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
        """c_t s_t - sum_j beta_j variate_j as vectors [n, T, V], for a score coefficient c [n, T]; one pass of
        each kind over the vocabulary: with w = C beta, it is (c - w_0) e_y - p o ((c - w_0) + psi - <w, E_p phi>),
        psi = sum_k w_k phi_k."""
        if beta is None:
            on_score, out = score, self.p * score.unsqueeze(-1)
        else:
            weights = self.coefficients @ beta  # [n, T, 1 + K]
            on_score, on_hats = score - weights[..., 0], weights[..., 1:]
            out = self.hat_function(on_hats)
            out.add_((on_score - (on_hats * self.hat_means).sum(-1)).unsqueeze(-1)).mul_(self.p)
        out.neg_().scatter_add_(-1, self.tokens, on_score.unsqueeze(-1))
        return out

    def combination(self, beta: torch.Tensor) -> torch.Tensor:
        """sum_j beta_j variate_j as vectors [n, T, V]."""
        return self.score_minus(torch.zeros_like(self.mask), beta).neg_()


def solve_ridge(matrix: torch.Tensor, vector: torch.Tensor, ridge: float = RIDGE) -> torch.Tensor:
    """(M + ridge * mean(diag M) I)^-1 v; zeros when M is zero."""
    scale = matrix.diagonal().mean()
    if not bool(scale > 0):
        return torch.zeros_like(vector)
    eye = torch.eye(matrix.shape[0], dtype=matrix.dtype, device=matrix.device)
    return torch.linalg.solve(matrix + ridge * scale * eye, vector)
