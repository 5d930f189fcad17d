"""FedNova: normalised averaging for nodes that ran different amounts of local work.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020. Pure NumPy: arrays in, arrays out (no
Flower, no torch); ``strategies.aggregation`` applies it to a round's Flower replies.

**Notation.** The round starts from the global model x. Node i has data weight p_i (its
share of the round's samples, Σ p_i = 1) and returns x_i; its update is Δ_i = x_i − x. Any
local optimiser whose step is a linear combination of the gradients seen so far writes it
as Δ_i = −η G_i a_i: G_i holds the node's τ_i stochastic gradients as columns, a_i ≥ 0 their
accumulated weights, η a common reference step. The node's **work** is ‖a_i‖₁, its local
progress in reference steps; ``work`` below takes η = 1, so the work of plain steps at
learning rate η_i is τ_i·η_i (the update does not depend on the choice of η: it cancels).

**FedAvg** sets x ← x + Σ p_i Δ_i. With unequal work this is the stationary point of the
surrogate Σ p_i ‖a_i‖₁ f_i / Σ p_i ‖a_i‖₁, not of F = Σ p_i f_i: a node that did more work
pulls the model toward its own optimum (Theorem 1 of the paper; ``tests/strategies/
test_fednova.py`` shows it on quadratics). **FedNova** averages the normalised updates
d_i = Δ_i / ‖a_i‖₁ (the node's mean direction per unit of work) and scales by the fleet's
effective work τ_eff = Σ p_i ‖a_i‖₁:

    x ← x + τ_eff · Σ p_i Δ_i / ‖a_i‖₁

With equal work it is FedAvg exactly. As the local step shrinks, its fixed point tends to
F's stationary point whatever the τ_i (a residual of order η·τ remains from local drift:
the quadratic test bounds it).

**Work per optimiser** (what ``work`` computes; the node reports its steps and learning
rate in ``local-steps`` and ``local-lr``):

* plain SGD at lr η_i: ‖a_i‖₁ = τ_i·η_i;
* heavy-ball SGD with momentum ρ (PyTorch's ``SGD(momentum=ρ)``, no dampening, no
  Nesterov): gradient j of τ is applied with weight 1 + ρ + … + ρ^(τ−1−j), so
  ‖a_i‖₁ = η_i·[τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)]/(1 − ρ) (the paper's eq. for momentum); a
  node that counted only τ_i·η_i would be over-weighted by up to 1/(1 − ρ);
* **Adam** (powerfl's local optimiser, ``fl_client.task.make_optimizer``, fresh each
  round, no momentum carried in): its bias-corrected first moment m̂_t = Σ_k w_tk g_k has
  weights that sum to 1 at every step, so the gradient weights of τ_i steps sum to τ_i
  exactly and ‖a_i‖₁ = τ_i·η_i, as for plain SGD (``momentum = 0`` here). The second
  moment divides each coordinate by √v̂ + ε, which differs per node and per step; the
  paper's analysis does not cover such preconditioning. powerfl takes the preconditioned
  direction as the node's gradient: the normalisation is exact for the first moment and
  leaves the per-coordinate scale to Adam. (Near convergence, Adam's steps are about η_i
  per coordinate whatever the gradient's size, so Δ_i grows with τ_i·η_i as the
  normalisation assumes.)

**Capped weights** (``capped_weights``, ``aggregation = "fedavg-capped"``). FedNova's rule
extrapolates: a node whose work is below τ_eff has its update scaled up by τ_eff/‖a_i‖₁.
That is right when Δ_i grows in proportion to the work; with Adam on non-IID data it does
not. On a generated fleet (4 Nanos at 6 W, 2 AGX Orins at 55 W, ``balance = "steps"``,
``benchmarks/bench_update_norms.py``) the Orins ran 5.75× the smallest work and their
updates were only 1.6–2.3× as long (‖Δ‖ ∝ work^0.27–0.48), so FedNova scaled the shortest
updates 2.5-fold, took steps 1.4–1.6× FedAvg's, and the accuracy swung by up to 14 points
between rounds (docs/method.md, "Aggregation"). The capped rule is FedAvg with node i's
weight p_i·min(1, τ_eff/‖a_i‖₁), normalised to sum 1: the new model is a weighted mean of
the nodes' models (weights ≥ 0 that sum to 1: no update is extrapolated); a node that did
more than the fleet's mean work counts as if it had done τ_eff, so extra work cannot pull
the model toward its own optimum; equal work is FedAvg exactly.

Arrays that are not iterates of the optimiser (BatchNorm's running statistics and step
counter, integer arrays) have no gradient-step update to normalise: ``aggregation``
averages them as FedAvg does (``strategies.weighted_mean``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from strategies.weighted_mean import check_weights

Arrays = Sequence[npt.NDArray[Any]]


def work(local_steps: float, local_lr: float, momentum: float = 0.0) -> float:
    """A node's local work ‖a_i‖₁ in units of a step at learning rate 1 (see the module
    docstring): ``local_steps``·``local_lr`` for plain SGD and Adam (``momentum = 0``);
    heavy-ball SGD's sum of gradient weights for ``momentum`` in (0, 1).

    Raises ValueError for steps < 0, a learning rate ≤ 0 or a momentum outside [0, 1).
    """
    if not (math.isfinite(local_steps) and local_steps >= 0):
        raise ValueError(f"local-steps: expected a finite number ≥ 0, got {local_steps!r}")
    if not (math.isfinite(local_lr) and local_lr > 0):
        raise ValueError(f"local-lr: expected a finite number > 0, got {local_lr!r}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum: expected a number in [0, 1), got {momentum!r}")
    if momentum == 0.0:
        return float(local_steps) * float(local_lr)
    rho, tau = float(momentum), float(local_steps)
    return float(local_lr) * (tau - rho * (1.0 - rho**tau) / (1.0 - rho)) / (1.0 - rho)


def _weights(weights: Sequence[float], n: int) -> npt.NDArray[np.float64]:
    """Data weights p_i (``weighted_mean.check_weights``), normalised to sum 1."""
    p = np.asarray(check_weights(weights, n), dtype=np.float64)
    return p / p.sum()


def capped_weights(weights: Sequence[float], works: Sequence[float]) -> list[float]:
    """FedAvg's weights with the work capped at the fleet's mean (``aggregation =
    "fedavg-capped"``, see the module docstring): p_i·min(1, τ_eff/‖a_i‖₁), normalised to
    sum 1, where τ_eff = Σ p_i ‖a_i‖₁.

    Raises ValueError for a work that is not a finite number > 0.
    """
    p = _weights(weights, len(works))
    a = np.asarray(works, dtype=np.float64)
    if not (np.all(np.isfinite(a)) and np.all(a > 0)):
        raise ValueError(f"works: every node's work must be a finite number > 0, got {a}")
    tau_eff = float(np.dot(p, a))
    w = p * np.minimum(1.0, tau_eff / a)
    return (w / w.sum()).tolist()


def fednova(
    base: Arrays,
    updated: Sequence[Arrays],
    weights: Sequence[float],
    works: Sequence[float],
) -> list[npt.NDArray[Any]]:
    """x + τ_eff · Σ p_i (x_i − x) / ‖a_i‖₁, array by array.

    Parameters
    ----------
    base : arrays
        The global model x the nodes started from.
    updated : list of arrays
        Each node's model x_i after its local work, arrays aligned with ``base``.
    weights : floats
        Data weights (e.g. local samples), normalised here to p_i.
    works : floats
        Each node's work ‖a_i‖₁ > 0 (``work``).

    Returns
    -------
    list of arrays
        The new global arrays, each in its ``base`` dtype (computed in float64).
    """
    n = len(updated)
    p = _weights(weights, n)
    a = np.asarray(works, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"works: expected {n} values, got {len(works)}")
    if not (np.all(np.isfinite(a)) and np.all(a > 0)):
        raise ValueError(f"works: every node's work must be a finite number > 0, got {a}")
    for i, arrays in enumerate(updated):
        if len(arrays) != len(base):
            raise ValueError(f"node {i}: {len(arrays)} arrays, the global model has {len(base)}")
    tau_eff = float(np.dot(p, a))
    coef = tau_eff * p / a  # the weight of each node's update
    out = []
    for k, x in enumerate(base):
        x64 = np.asarray(x, dtype=np.float64)
        step = np.zeros_like(x64)
        for c, arrays in zip(coef, updated, strict=True):
            step += c * (np.asarray(arrays[k], dtype=np.float64) - x64)
        out.append((x64 + step).astype(x.dtype, copy=False))
    return out
