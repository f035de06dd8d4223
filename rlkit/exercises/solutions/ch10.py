r"""Checkers for the exercises of chapter 10, ``lessons/10_static_mixtures.ipynb``.

* ``gated_augmented_transition(P, kernel, gate)``: the kernel of the augmented MDP on :math:`S \times I` when
  the version may switch only on entering some states,
  :math:`\tilde P((s',i') | (s,i), a) = P(s'|s,a)\,(g(s')\,q(i'|i) + (1-g(s'))\mathbf 1\{i'=i\})`, flat index
  ``s * M + i`` (the chapter displays ``augment``, the case :math:`g = 1`, which solved the exercise this
  replaces, ``augmented_transition``).
* ``mixture_visitation(P, rho0, policies, alpha, gamma)``: the visitation of a trajectory-level
  mixture on the augmented space, :math:`d_\beta(s, i) = \alpha_i d_{\pi^{(i)}}(s)`, shape ``[S, M]``.
* ``corollary31_bound(alpha, surrogates, eps, expected_tv, gamma)``: the right-hand side of the
  static-mixture bound (cor-ch10-static; the name recalls the article's Corollary 3.1) from
  per-version terms (all ``[..., M]``).
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit import tabular as T
from rlkit.exercises import Case, exercise, mistake
from rlkit.exercises.solutions.ch09 import discounted_visitation_reference as discounted_visitation

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------- 1. gated_augmented_transition

def _aug_cases():
    g = torch.Generator().manual_seed(1010)
    P1 = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]], dtype=F64)
    q1 = torch.tensor([[0.5, 0.5], [0.0, 1.0]], dtype=F64)
    mdp = T.random_mdp(1, 3, 2, 0.9, generator=g)
    q2 = T.step_kernel(torch.tensor([0.3, 0.6, 0.1], dtype=F64),
                       torch.softmax(torch.randn(3, 3, generator=g, dtype=F64), -1))
    mdp4 = T.random_mdp(1, 4, 3, 0.9, generator=g)
    return [
        Case(args=(P1, q1, torch.tensor([1.0, 0.0], dtype=F64)),
             label="2 states x 2 versions; a switch is possible only on entering state 0"),
        Case(args=(mdp.P[0], q2, torch.tensor([0.0, 1.0, 0.5], dtype=F64)),
             label="3 states x 3 versions, a random step-level kernel, gates (0, 1, 1/2)"),
        Case(args=(mdp.P[0], q2, torch.ones(3, dtype=F64)),
             label="gates all 1: the augmented kernel of eq-ch10-augmented"),
        Case(args=(mdp4.P[0], q2, torch.zeros(4, dtype=F64)), label="gates all 0: the index never changes"),
        Case(args=(mdp4.P[0], q2, torch.rand(4, generator=g, dtype=F64)), label="4 states x 3 versions, random gates"),
    ]


def _gated(P, kernel, gate, *, on_current=False, flip=False, transpose=False):
    S, A, _ = P.shape
    M = kernel.shape[0]
    q = kernel.T if transpose else kernel
    eye = torch.eye(M, dtype=kernel.dtype)
    g = 1 - gate if flip else gate
    mix = g[:, None, None] * q + (1 - g)[:, None, None] * eye          # [s, i, i'], the gate of state s
    if on_current:
        out = P[:, None, :, :, None] * mix[:, :, None, None, :]           # gate of the current state s
    else:
        out = P[:, None, :, :, None] * mix.permute(1, 0, 2)[None, :, None, :, :]   # gate of the next state s'
    return out.reshape(S * M, A, S * M)


@exercise(chapter=10, cases=_aug_cases, atol=1e-12,
          description="The augmented kernel when versions may switch only on entering some states.")
def gated_augmented_transition(P, kernel, gate):
    r""":math:`\tilde P[sM+i, a, s'M+i'] = P[s,a,s']\,\big(g(s')\,q[i,i'] + (1-g(s'))\,\mathbf 1\{i'=i\}\big)`;
    ``P[S, A, S]``, ``kernel[M, M]``, ``gate[S]`` -> ``[S*M, A, S*M]``."""
    sizes = V.layout("S A S", floating=True, P=P)
    V.layout("M M", floating=True, kernel=kernel)
    V.layout("S", {"S": sizes["S"]}, floating=True, gate=gate)
    return _gated(P, kernel, gate)


@mistake(gated_augmented_transition, "the gate is ignored: that is the augmented kernel of eq-ch10-augmented "
         "(what rlkit.tabular.augment builds); the index may switch only on entering a state s' with g(s') > 0")
def _aug_no_gate(P, kernel, gate):
    return _gated(P, kernel, torch.ones_like(gate))


@mistake(gated_augmented_transition, "the gate belongs to the NEXT state s' (the switch happens on entering it), "
         "not to the current state s")
def _aug_gate_current(P, kernel, gate):
    return _gated(P, kernel, gate, on_current=True)


@mistake(gated_augmented_transition, "g(s') is the probability that the kernel applies: the index follows "
         "q(.|i) with weight g(s') and stays with weight 1 - g(s'), not the other way round")
def _aug_gate_flipped(P, kernel, gate):
    return _gated(P, kernel, gate, flip=True)


@mistake(gated_augmented_transition, "the kernel is transposed: row i of q is the distribution q(.|i) of "
         "the NEXT index given the current one, so the factor is kernel[i, i']")
def _aug_kernel_transposed(P, kernel, gate):
    return _gated(P, kernel, gate, transpose=True)


# --------------------------------------------------------------------- 2. mixture_visitation

def _visitation_of(P, rho0, pi, gamma):
    r""":math:`d_\pi` of chapter 9 for the policies ``pi[..., S, A]`` of one MDP ``P[S, A, S]``."""
    P_pi = torch.einsum("...sa,sat->...st", pi, P)
    return discounted_visitation(P_pi, rho0.expand(P_pi.shape[:-1]), gamma)


def _mv_cases():
    g = torch.Generator().manual_seed(1020)
    out = []
    for S, A, M, gam in [(2, 2, 2, 0.9), (4, 3, 3, 0.8), (5, 2, 4, 0.95)]:
        mdp = T.random_mdp(1, S, A, gam, peakiness=3.0, generator=g)
        pols = T.random_policy(M, S, A, temperature=0.5, generator=g)
        alpha = torch.softmax(torch.randn(M, generator=g, dtype=F64), -1)
        out.append(Case(args=(mdp.P[0], mdp.rho0[0], pols, alpha, gam), label=f"S={S}, A={A}, M={M}, gamma={gam}"))
    return out


@exercise(chapter=10, cases=_mv_cases, atol=1e-9,
          description="Visitation of a trajectory-level mixture on the augmented space.")
def mixture_visitation(P, rho0, policies, alpha, gamma):
    r""":math:`d_\beta(s,i) = \alpha_i\, d_{\pi^{(i)}}(s)`; ``P[S,A,S]``, ``rho0[S]``, ``policies[M,S,A]``,
    ``alpha[M]`` -> ``[S, M]``."""
    sizes = V.layout("S A S", floating=True, P=P)
    V.layout("S", sizes, floating=True, rho0=rho0)
    sizes = V.layout("M S A", sizes, floating=True, policies=policies)
    V.layout("M", sizes, floating=True, alpha=alpha)
    d = _visitation_of(P, rho0, policies, gamma)                       # [M, S]
    return (alpha[:, None] * d).T


@mistake(mixture_visitation, "each version's visitation must be weighted by its share alpha_i: "
         "d_beta(s, i) = alpha_i d_i(s) sums to 1 over (s, i); yours sums to M")
def _mv_no_alpha(P, rho0, policies, alpha, gamma):
    return _visitation_of(P, rho0, policies, gamma).T


@mistake(mixture_visitation, "you computed the visitation of the AVERAGE policy sum_i alpha_i pi^(i). "
         "A trajectory-level mixture runs one version per trajectory; the mixture of visitations is "
         "not the visitation of the mixed policy")
def _mv_average_policy(P, rho0, policies, alpha, gamma):
    pbar = (alpha[:, None, None] * policies).sum(0)
    return _visitation_of(P, rho0, pbar, gamma)[:, None] * alpha[None, :]


@mistake(mixture_visitation, "the visitation is not normalised: the factor (1 - gamma) is missing")
def _mv_unnormalised(P, rho0, policies, alpha, gamma):
    return mixture_visitation(P, rho0, policies, alpha, gamma) / (1 - gamma)


@mistake(mixture_visitation, "the versions are weighted uniformly (1/M); use the mixture weights alpha")
def _mv_uniform(P, rho0, policies, alpha, gamma):
    return mixture_visitation(P, rho0, policies, torch.full_like(alpha, 1.0 / alpha.numel()), gamma)


# ---------------------------------------------------------------------- 3. corollary31_bound

def _bound(surrogate, eps, expected_tv, gamma, horizon_power=2):
    r""":math:`L - \frac{2\gamma\omega}{(1-\gamma)^2}\,\overline{D_{TV}}` (``horizon_power`` is the 2)."""
    return surrogate - 2 * gamma * eps / (1 - gamma) ** horizon_power * expected_tv


def _c31_cases():
    g = torch.Generator().manual_seed(1030)
    out = []
    for shape, gam in [((3,), 0.9), ((5, 4), 0.7)]:
        alpha = torch.softmax(torch.randn(*shape, generator=g, dtype=F64), -1)
        L = torch.randn(*shape, generator=g, dtype=F64)
        eps = torch.rand(*shape, generator=g, dtype=F64)
        tv = 0.3 * torch.rand(*shape, generator=g, dtype=F64)
        out.append(Case(args=(alpha, L, eps, tv, gam), label=f"shape {shape}, gamma={gam}"))
    return out


@exercise(chapter=10, cases=_c31_cases, atol=1e-9,
          description="The right-hand side of the static-mixture bound from per-version terms.")
def corollary31_bound(alpha, surrogates, eps, expected_tv, gamma):
    r"""The static-mixture bound (cor-ch10-static),
    :math:`\sum_i\alpha_i L_i - \frac{2\gamma\max_i\omega_i}{(1-\gamma)^2}\sum_i\alpha_i\,\mathbb E_{d_i}[D_{TV}]`;
    inputs ``[..., M]`` -> ``[...]``."""
    V.matching_floats(alpha=alpha, surrogates=surrogates, eps=eps, expected_tv=expected_tv)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0, hi_open=True)
    return _bound((alpha * surrogates).sum(-1), eps.amax(-1), (alpha * expected_tv).sum(-1), gamma)


@mistake(corollary31_bound, "the static-mixture bound uses the LARGEST omega over versions, max_i omega_i, "
         "because omega of the augmented MDP is a max over all augmented states (s, i)")
def _c31_weighted_eps(alpha, surrogates, eps, expected_tv, gamma):
    return _bound((alpha * surrogates).sum(-1), (alpha * eps).sum(-1), (alpha * expected_tv).sum(-1), gamma)


@mistake(corollary31_bound, "the constant is 2 gamma / (1 - gamma)^2, squared")
def _c31_not_squared(alpha, surrogates, eps, expected_tv, gamma):
    return _bound((alpha * surrogates).sum(-1), eps.amax(-1), (alpha * expected_tv).sum(-1), gamma, 1)


@mistake(corollary31_bound, "the versions must be weighted by their mixture shares alpha_i, "
         "not averaged uniformly")
def _c31_unweighted(alpha, surrogates, eps, expected_tv, gamma):
    return corollary31_bound(torch.full_like(alpha, 1.0 / alpha.shape[-1]), surrogates, eps, expected_tv, gamma)


@mistake(corollary31_bound, "the penalty uses the alpha-weighted average of the versions' expected TV, "
         "sum_i alpha_i E_{d_i}[D_TV], not the worst version's")
def _c31_max_tv(alpha, surrogates, eps, expected_tv, gamma):
    return _bound((alpha * surrogates).sum(-1), eps.amax(-1), expected_tv.amax(-1), gamma)
