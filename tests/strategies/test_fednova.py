"""FedNova against FedAvg on a problem whose optimum is known: quadratics with different local
optima, curvatures, amounts of local work and learning rates.

Node i holds f_i(x) = ½ a_i ‖x − c_i‖² with data weight p_i; the global objective
F = Σ p_i f_i has its minimum at x* = Σ p_i a_i c_i / Σ p_i a_i. Node i runs τ_i steps of
gradient descent at learning rate η_i from the global x, so with q_i = 1 − η_i a_i

    x_i − c_i = q_i^τ_i (x − c_i),    Δ_i = w_i (c_i − x),    w_i = 1 − q_i^τ_i.

Every tolerance below is derived from these formulas, never typed in:

* For 0 < s = η_i a_i < 1: τs(1 − (τ − 1)s/2) ≤ 1 − (1 − s)^τ ≤ τs (Bernoulli below; the
  alternating Taylor bound above), so w_i = τ_i η_i a_i (1 − ε_i) with
  0 ≤ ε_i ≤ ε_max = max (τ_i − 1) η_i a_i / 2.
* A server rule x ← x + Σ k_i (c_i − x) (k_i > 0) is affine with the fixed point
  Σ k_i c_i / Σ k_i and contraction |1 − Σ k_i|: after R rounds the iterate is within
  |1 − Σ k_i|^R ‖x_0 − fixed point‖ of it.
* FedAvg: k_i = p_i w_i. Its fixed point is within ε_max / (1 − ε_max) · max‖c_i − x̃‖ of
  x̃ = Σ p_i τ_i η_i a_i c_i / Σ p_i τ_i η_i a_i, the optimum of the surrogate that weights
  each node by its work: a biased point, whatever the step size.
* FedNova with work τ_i η_i: k_i = τ_eff p_i w_i / (τ_i η_i) = τ_eff p_i a_i (1 − ε_i), so
  its fixed point is within ε_max / (1 − ε_max) · max‖c_i − x*‖ of x* (the ε_i-weighted
  residual of Σ p_i a_i (c_i − x*) = 0, over a denominator ≥ (1 − ε_max) Σ p_i a_i).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from strategies import fednova
from strategies.weighted_mean import weighted_mean

C = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 6.0]])  # local optima c_i
A = np.array([1.0, 2.0, 0.5])  # curvatures a_i
P = np.array([0.5, 0.3, 0.2])  # data weights p_i
X0 = np.array([10.0, -10.0])


def global_optimum() -> np.ndarray:
    return (P * A) @ C / (P * A).sum()


def local_gd(x: np.ndarray, i: int, steps: int, lr: float) -> np.ndarray:
    """``steps`` gradient steps on f_i from x (the node's local work, run, not solved)."""
    y = x.copy()
    for _ in range(steps):
        y = y - lr * A[i] * (y - C[i])
    return y


def run(
    rule: str, steps: list[int], lrs: list[float], rounds: int, works: list[float]
) -> np.ndarray:
    x = X0.copy()
    for _ in range(rounds):
        updated = [[local_gd(x, i, steps[i], lrs[i])] for i in range(len(steps))]
        if rule == "fedavg":
            x = weighted_mean([arrays[0] for arrays in updated], list(P))
        else:
            (x,) = fednova.fednova([x], updated, list(P), works)
    return x


def eps_max(steps: list[int], lrs: list[float]) -> float:
    eps = max((t - 1) * lr * a / 2 for t, lr, a in zip(steps, lrs, A, strict=True))
    assert 0 <= eps < 1
    return eps


def contraction(k: np.ndarray) -> float:
    rho = abs(1.0 - k.sum())
    assert rho < 1, "the server rule must contract for the bound to hold"
    return rho


def w(steps: list[int], lrs: list[float]) -> np.ndarray:
    return np.array([1 - (1 - lr * a) ** t for t, lr, a in zip(steps, lrs, A, strict=True)])


def spread(x: np.ndarray) -> float:
    return float(np.max(np.linalg.norm(C - x, axis=1)))


ROUNDS = 600


@pytest.mark.parametrize(
    ("steps", "lrs"),
    [
        ([1, 5, 20], [0.005, 0.005, 0.005]),  # different local steps, one learning rate
        ([4, 4, 4], [0.01, 0.0025, 0.005]),  # one step count, different learning rates
        ([2, 10, 3], [0.004, 0.001, 0.01]),  # both differ
    ],
)
def test_fedavg_drifts_to_the_work_weighted_point_and_fednova_reaches_the_optimum(
    steps: list[int], lrs: list[float]
) -> None:
    x_star = global_optimum()
    eps = eps_max(steps, lrs)
    work = [t * lr for t, lr in zip(steps, lrs, strict=True)]
    tau_eff = float(P @ np.array(work))
    wi = w(steps, lrs)

    # FedNova: within the derived residual of x*, plus what R rounds leave of the start
    nova_bound = eps / (1 - eps) * spread(x_star)
    rho_nova = contraction(tau_eff * P * wi / np.array(work))
    x_nova = run("fednova", steps, lrs, ROUNDS, work)
    left_nova = rho_nova**ROUNDS * (np.linalg.norm(X0 - x_star) + nova_bound)
    assert np.linalg.norm(x_nova - x_star) <= nova_bound + left_nova + 1e-12

    # FedAvg: near the surrogate optimum x̃, which is far from x*
    wa = P * np.array(work) * A
    x_tilde = wa @ C / wa.sum()
    avg_bound = eps / (1 - eps) * spread(x_tilde)
    rho_avg = contraction(P * wi)
    x_avg = run("fedavg", steps, lrs, ROUNDS, work)
    left_avg = rho_avg**ROUNDS * (np.linalg.norm(X0 - x_tilde) + avg_bound)
    assert np.linalg.norm(x_avg - x_tilde) <= avg_bound + left_avg + 1e-12
    bias = np.linalg.norm(x_tilde - x_star) - avg_bound - left_avg
    assert np.linalg.norm(x_avg - x_star) >= bias
    # the drift is large against FedNova's residual: the test separates the two rules
    assert bias > 5 * (nova_bound + left_nova)


def test_normalising_by_steps_alone_drifts_when_learning_rates_differ() -> None:
    """Work is steps × learning rate: with steps alone, the node with the larger rate is
    over-weighted, and the fixed point moves to Σ p_i η_i a_i c_i / Σ p_i η_i a_i."""
    steps, lrs = [4, 4, 4], [0.01, 0.0025, 0.005]
    eps = eps_max(steps, lrs)
    x_star = global_optimum()
    wrong = run("fednova", steps, lrs, 4 * ROUNDS, [float(t) for t in steps])
    lr_weighted = P * np.array(lrs) * A
    x_lr = lr_weighted @ C / lr_weighted.sum()
    bound = eps / (1 - eps) * spread(x_lr)
    assert np.linalg.norm(wrong - x_lr) <= bound + 1e-6
    assert np.linalg.norm(wrong - x_star) >= np.linalg.norm(x_lr - x_star) - bound - 1e-6
    assert np.linalg.norm(x_lr - x_star) - bound > 5 * eps / (1 - eps) * spread(x_star)


def test_equal_work_is_fedavg() -> None:
    rng = np.random.default_rng(0)
    base: list[np.ndarray] = [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=4)]
    updated = [[b + rng.normal(size=b.shape).astype(b.dtype) for b in base] for _ in range(3)]
    nova = fednova.fednova(base, updated, [3.0, 1.0, 2.0], [0.5, 0.5, 0.5])
    avg = [weighted_mean([u[k] for u in updated], [3.0, 1.0, 2.0]) for k in range(len(base))]
    for n, a, b in zip(nova, avg, base, strict=True):
        assert n.dtype == b.dtype
        np.testing.assert_allclose(n, a, rtol=1e-6, atol=1e-6)


def test_fednova_scales_each_update_by_effective_over_own_work() -> None:
    base = [np.zeros(2)]
    updated = [[np.array([1.0, 0.0])], [np.array([0.0, 4.0])]]
    # p = (1/4, 3/4), work (1, 4): τ_eff = 3.25; x = 3.25 (¼·Δ_1/1 + ¾·Δ_2/4)
    (x,) = fednova.fednova(base, updated, [1.0, 3.0], [1.0, 4.0])
    np.testing.assert_allclose(x, 3.25 * np.array([0.25 * 1.0, 0.75 * 4.0 / 4.0]))


@pytest.mark.parametrize("momentum", [0.5, 0.9])
@pytest.mark.parametrize("steps", [1, 7, 30])
def test_momentum_work_is_the_displacement_of_torch_sgd_under_a_constant_gradient(
    momentum: float, steps: int
) -> None:
    """Under a constant gradient g, τ steps of heavy-ball SGD move x by −η‖a‖₁ g."""
    g, lr = torch.tensor([0.3, -1.2]), 0.01
    x = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([x], lr=lr, momentum=momentum)
    for _ in range(steps):
        opt.zero_grad()
        (x * g).sum().backward()
        opt.step()
    moved = -x.detach().numpy() / g.numpy()
    np.testing.assert_allclose(moved, fednova.work(steps, lr, momentum), rtol=1e-5)
    assert fednova.work(steps, lr, momentum) <= steps * lr / (1 - momentum)


@pytest.mark.parametrize("steps", [1, 7, 30])
def test_adam_work_is_steps_times_lr_under_a_constant_gradient(steps: int) -> None:
    """Adam's bias-corrected first moment weighs τ gradients with weights summing to τ: under
    a constant gradient each coordinate moves η per step (up to ε), so ‖a‖₁ = τ·η."""
    g, lr = torch.tensor([0.3, -1.2]), 0.01
    x = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([x], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        (x * g).sum().backward()
        opt.step()
    moved = np.abs(x.detach().numpy())
    eps = 1e-8 / float(g.abs().min())  # Adam's ε against the smallest |g|
    np.testing.assert_allclose(moved, fednova.work(steps, lr), rtol=eps + 1e-6)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ((-1.0, 0.1), "local-steps"),
        ((3.0, 0.0), "local-lr"),
        ((3.0, math.nan), "local-lr"),
        ((3.0, 0.1, 1.0), "momentum"),
    ],
)
def test_work_refuses_bad_values_naming_them(args: tuple[float, ...], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        fednova.work(*args)


def test_fednova_refuses_a_node_without_work() -> None:
    with pytest.raises(ValueError, match="works"):
        fednova.fednova([np.zeros(1)], [[np.ones(1)], [np.ones(1)]], [1.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="weights"):
        fednova.fednova([np.zeros(1)], [[np.ones(1)]], [1.0, 2.0], [1.0])
