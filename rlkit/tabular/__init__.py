r"""Finite MDPs solved exactly, in batches, and the bounds of Part II checked on them.

Everything here is a dense linear-algebra computation in torch (float64 by default), batched over
any number of leading dimensions, so that thousands of MDP/policy pairs are solved in one call of
``torch.linalg.solve`` on a ``[B, S, S]`` tensor.

Shapes and conventions (``*B`` is any batch shape, the same for every argument of one call; the
symbols are the book's, chapter 9):

* transition kernel ``P[*B, s, a, s']`` :math:`= P(s'\mid s, a)`, rewards ``R[*B, s, a]``
  :math:`= R(s, a)`, initial distribution ``rho0[*B, s]`` :math:`= d_0(s)`, discount
  ``gamma`` :math:`= \gamma \in [0, 1)` (a float or a tensor ``[*B]``);
* a policy is a tensor ``pi[*B, s, a]`` :math:`= \pi(a\mid s)`;
* the return has no :math:`1-\gamma` factor in front:
  :math:`J(\pi) = \mathbb E\big[\sum_{t\ge0}\gamma^t r_t\big]`, :math:`s_0\simd_0`;
* the discounted state visitation is NORMALISED (chapter 9, eq-ch09-visitation and eq-ch09-J-d):

  .. math::

      d_\pi(s) = (1-\gamma)\sum_{t\ge0}\gamma^t \Pr(s_t = s),\qquad \sum_s d_\pi(s) = 1,\qquad
      J(\pi) = \frac{1}{1-\gamma}\,\mathbb E_{s\sim d_\pi,\ a\sim\pi(\cdot\mid s)}\big[R(s, a)\big];

* the total-variation distance is taken per state, with its factor one half:
  :math:`D_{\mathrm{TV}}(p, q; s) = \tfrac12\sum_a |p(a\mid s) - q(a\mid s)|`.

Mixtures of :math:`M` policies live on the augmented state space
:math:`\tilde{\mathcal S} = \mathcal S\times\mathcal I` (chapters 10 and 11); an augmented state
:math:`(s, i)` has the flat index :math:`sM + i`, so ``x.reshape(*B, S, M)`` recovers the two
coordinates of any per-augmented-state tensor ``x[*B, S * M]``.

Everything is imported from here (``import rlkit.tabular as T``); the code lives in one submodule
per concern:

* :mod:`rlkit.tabular.mdp`: the :class:`FiniteMDP` container, random MDPs and policies, the
  contextual bandit and the exact natural-gradient step :func:`softmax_step`;
* :mod:`rlkit.tabular.solve`: exact policy evaluation, from :func:`policy_transition` and
  :func:`value` to :func:`surrogate` and :func:`performance_difference`;
* :mod:`rlkit.tabular.bounds`: every term of the single-policy bound (:func:`single_policy_terms`)
  and the instance on which it is attained (:func:`tight_example`);
* :mod:`rlkit.tabular.finite_horizon`: finite-horizon undiscounted MDPs (:class:`FiniteHorizonMDP`),
  the token MDP (:func:`token_mdp`) and their bound (:func:`finite_horizon_terms`);
* :mod:`rlkit.tabular.mixtures`: mixtures on the augmented state space (:func:`augment`), the
  static-mixture, dynamic-mixing and current-advantage bounds, and sampled :math:`U_k`, :math:`S_k`;
* :mod:`rlkit.tabular.operators`: exact fixed points of the off-policy multi-step operators
  (:func:`vtrace_fixed_point`, :func:`q_trace_fixed_point`).

Chapters: 09_single_policy_bound (performance difference lemma, single-policy bound, finite
horizon), 10_static_mixtures (static mixtures), 11_dynamic_mixing (dynamic mixing, :math:`U_k` and
:math:`S_k`), 16_offpolicy_multistep (the fixed points of V-trace and Retrace).
"""
from __future__ import annotations

from .bounds import (
    SinglePolicyTerms,
    single_policy_terms,
    tight_example,
)
from .finite_horizon import (
    FiniteHorizonMDP,
    FiniteHorizonTerms,
    finite_horizon_performance,
    finite_horizon_state_distributions,
    finite_horizon_terms,
    finite_horizon_tight_example,
    finite_horizon_values,
    random_finite_horizon_mdp,
    token_mdp,
)
from .mdp import (
    FiniteMDP,
    contextual_bandit,
    perturb_policy,
    random_mdp,
    random_policy,
    softmax_step,
    uniform_policy,
)
from .mixtures import (
    CurrentAdvantageTerms,
    DynamicMixtureTerms,
    StaticMixtureTerms,
    augment,
    current_advantage_terms,
    dynamic_mixture_terms,
    estimate_update_and_staleness,
    lift_policy,
    sample_state_actions,
    static_mixture_terms,
    step_kernel,
    tight_mixture_example,
    trajectory_kernel,
)
from .operators import (
    TRACE_KINDS,
    q_trace_affine,
    q_trace_fixed_point,
    trace_table,
    truncated_policy,
    vtrace_affine,
    vtrace_fixed_point,
)
from .solve import (
    advantage,
    expected_advantage,
    performance,
    performance_difference,
    policy_reward,
    policy_transition,
    q_value,
    surrogate,
    tv_distance,
    value,
    visitation,
)

__all__ = [
    "FiniteMDP",
    "random_mdp",
    "random_policy",
    "perturb_policy",
    "uniform_policy",
    "contextual_bandit",
    "tight_example",
    "softmax_step",
    "policy_transition",
    "policy_reward",
    "value",
    "q_value",
    "advantage",
    "performance",
    "visitation",
    "tv_distance",
    "expected_advantage",
    "surrogate",
    "performance_difference",
    "SinglePolicyTerms",
    "single_policy_terms",
    "trajectory_kernel",
    "step_kernel",
    "lift_policy",
    "augment",
    "StaticMixtureTerms",
    "static_mixture_terms",
    "DynamicMixtureTerms",
    "dynamic_mixture_terms",
    "sample_state_actions",
    "estimate_update_and_staleness",
    "FiniteHorizonMDP",
    "random_finite_horizon_mdp",
    "token_mdp",
    "finite_horizon_state_distributions",
    "finite_horizon_values",
    "finite_horizon_performance",
    "FiniteHorizonTerms",
    "finite_horizon_terms",
    "finite_horizon_tight_example",
    "tight_mixture_example",
    "CurrentAdvantageTerms",
    "current_advantage_terms",
    "TRACE_KINDS",
    "truncated_policy",
    "trace_table",
    "vtrace_affine",
    "vtrace_fixed_point",
    "q_trace_affine",
    "q_trace_fixed_point",
]
