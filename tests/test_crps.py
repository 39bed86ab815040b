"""Kernel CRPS estimators (scoring.crps) and the ensemble CRPS loss (training.ensemble_loss), against closed forms,
brute-force O(M^2) sums and Monte Carlo expectations."""

from __future__ import annotations

import math

import pytest
import torch

from anemo_like.scoring.crps import CRPS_KINDS, crps, gaussian_crps, pairwise_abs_sum
from anemo_like.training.ensemble_loss import EnsembleCRPSLoss
from anemo_like.training.loss import WeightedLoss

F64 = torch.float64


def brute_pairwise(members: torch.Tensor) -> torch.Tensor:
    """sum_{m,k} |x_m - x_k| over dim 1 by the O(M^2) double sum."""
    return (members.unsqueeze(2) - members.unsqueeze(1)).abs().sum((1, 2))


def brute_crps(members: torch.Tensor, target: torch.Tensor, kind: str, alpha: float = 0.95) -> torch.Tensor:
    """The CRPS of each kind written out over member pairs (member dim 1), almost_fair as a sum over m != k."""
    size = members.shape[1]
    skill = (members - target.unsqueeze(1)).abs()  # (B, M, ...)
    if kind == "almost_fair":
        eps = (1 - alpha) / size
        pair = skill.unsqueeze(2) + skill.unsqueeze(1) - (1 - eps) * (members.unsqueeze(2) - members.unsqueeze(1)).abs()
        off_diagonal = ~torch.eye(size, dtype=torch.bool).reshape(1, size, size, *[1] * (members.dim() - 2))
        return (pair * off_diagonal).sum((1, 2)) / (2 * size * (size - 1))
    norm = 2 * size**2 if kind == "standard" else 2 * size * (size - 1)
    return skill.mean(1) - brute_pairwise(members) / norm


def test_sorted_pairwise_sum_equals_double_sum():
    generator = torch.Generator().manual_seed(0)
    members = torch.randn(3, 7, 5, 2, generator=generator, dtype=F64)
    members[0, 3] = members[0, 1]  # ties
    torch.testing.assert_close(pairwise_abs_sum(members, dim=1), brute_pairwise(members), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pairwise_abs_sum(members[:, :1], dim=1), torch.zeros(3, 5, 2, dtype=F64))
    moved = members.movedim(1, -1)
    torch.testing.assert_close(pairwise_abs_sum(moved, dim=-1), brute_pairwise(members), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", CRPS_KINDS)
def test_kinds_match_brute_force_any_dim(kind):
    generator = torch.Generator().manual_seed(1)
    members = torch.randn(2, 6, 4, 3, generator=generator, dtype=F64)
    target = torch.randn(2, 4, 3, generator=generator, dtype=F64)
    expected = brute_crps(members, target, kind, alpha=0.9)
    torch.testing.assert_close(crps(members, target, kind=kind, alpha=0.9), expected, rtol=1e-12, atol=1e-12)
    moved = crps(members.movedim(1, 0), target, kind=kind, alpha=0.9, dim=0)
    torch.testing.assert_close(moved, expected, rtol=1e-12, atol=1e-12)


def test_almost_fair_identity():
    """afCRPS_alpha = alpha fair + (1 - alpha) standard = the m != k sum with eps = (1 - alpha) / M."""
    generator = torch.Generator().manual_seed(2)
    members = torch.randn(4, 5, 8, generator=generator, dtype=F64)
    target = torch.randn(4, 8, generator=generator, dtype=F64)
    for alpha in (0.95, 0.5, 1.0):
        almost = crps(members, target, kind="almost_fair", alpha=alpha)
        mix = alpha * crps(members, target, kind="fair") + (1 - alpha) * crps(members, target, kind="standard")
        torch.testing.assert_close(almost, mix, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(almost, brute_crps(members, target, "almost_fair", alpha), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(crps(members, target, kind="almost_fair", alpha=1.0), crps(members, target))


def test_two_members_closed_form():
    members = torch.tensor([[0.25, 1.5], [-2.0, 3.0], [1.0, 1.0]], dtype=F64)
    target = torch.tensor([2.0, 0.5, -1.0], dtype=F64)
    x1, x2 = members.unbind(1)
    expected = ((x1 - target).abs() + (x2 - target).abs()) / 2 - (x1 - x2).abs() / 2
    assert torch.equal(crps(members, target, kind="fair"), expected)  # dyadic values: exact
    assert torch.equal(expected, torch.tensor([0.5, 0.0, 2.0], dtype=F64))


@pytest.mark.parametrize("kind", CRPS_KINDS)
def test_equal_members_give_mae_exactly(kind):
    generator = torch.Generator().manual_seed(3)
    field = 280.0 + torch.randn(2, 1, 30, 2, generator=generator)  # float32, offset like temperatures in K
    members = field.expand(2, 5, 30, 2)
    target = 280.0 + torch.randn(2, 30, 2, generator=generator)
    score = crps(members, target, kind=kind)
    assert score.dtype == torch.float32
    assert torch.equal(score, (members - target[:, None]).abs().mean(1))
    torch.testing.assert_close(score, (field[:, 0] - target).abs())


def test_float32_offset_fields_stay_accurate():
    generator = torch.Generator().manual_seed(4)
    members = 280.0 + 0.1 * torch.randn(2, 64, 50, generator=generator, dtype=F64)
    target = 280.0 + 0.1 * torch.randn(2, 50, generator=generator, dtype=F64)
    reference = crps(members, target, kind="fair")
    single = crps(members.float(), target.float(), kind="fair")
    torch.testing.assert_close(single.double(), reference, rtol=0, atol=2e-4)  # ~ float32 spacing at 280 (3e-5)


@pytest.mark.parametrize(("mu", "sigma", "y"), [(0.0, 1.0, 0.3), (2.0, 0.5, 1.0), (-1.0, 2.0, 3.0), (5.0, 3.0, -4.0)])
def test_large_gaussian_ensemble_matches_closed_form(mu, sigma, y):
    """Fair CRPS of 4000 members ~ N(mu, sigma^2) against the closed form, within 4 standard errors of the
    U-statistic: var ~ Var(g(X)) / M with g(x) = |x - y| - E|x - X'| and
    E|x - X'| = gaussian_crps(mu, sigma, x) + sigma / sqrt(pi)."""
    size = 4000
    generator = torch.Generator().manual_seed(5)
    members = mu + sigma * torch.randn(1, size, generator=generator, dtype=F64)
    mu_t, sigma_t, y_t = (torch.tensor(v, dtype=F64) for v in (mu, sigma, y))
    estimate = crps(members, y_t.reshape(1), kind="fair")[0]
    exact = gaussian_crps(mu_t, sigma_t, y_t)
    projection = (members - y_t).abs() - gaussian_crps(mu_t, sigma_t, members) - sigma / math.sqrt(math.pi)
    standard_error = projection.std() / math.sqrt(size)
    assert abs(float(estimate - exact)) < 4 * float(standard_error)
    assert float(standard_error) < 0.02 * sigma  # the check is informative


@pytest.mark.parametrize("size", [2, 4, 8])
def test_fair_is_unbiased_and_standard_biased_by_spread_over_2m(size):
    """Mean over many small ensembles from N(0, 1): fair -> CRPS, standard -> CRPS + E|X - X'| / (2M), E|X - X'| =
    2 / sqrt(pi), each within 3 standard errors of the mean."""
    count, y = 200_000, 0.7
    generator = torch.Generator().manual_seed(6 + size)
    members = torch.randn(count, size, generator=generator, dtype=F64)
    target = torch.full((count,), y, dtype=F64)
    exact = float(gaussian_crps(torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64), torch.tensor(y)))
    bias = 2 / math.sqrt(math.pi) / (2 * size)
    for kind, expected in (("fair", exact), ("standard", exact + bias)):
        score = crps(members, target, kind=kind)
        standard_error = float(score.std()) / math.sqrt(count)
        assert abs(float(score.mean()) - expected) < 3 * standard_error, kind
    assert bias > 10 * standard_error  # the bias is resolved


@pytest.mark.parametrize("kind", CRPS_KINDS)
def test_gradients_match_brute_force(kind):
    generator = torch.Generator().manual_seed(7)
    members = torch.randn(3, 6, 5, 2, generator=generator, dtype=F64)
    target = torch.randn(3, 5, 2, generator=generator, dtype=F64)
    weight = torch.rand(3, 5, 2, generator=generator, dtype=F64)
    grads = []
    for function in (lambda x, t: crps(x, t, kind=kind), lambda x, t: brute_crps(x, t, kind)):
        x, t = members.clone().requires_grad_(), target.clone().requires_grad_()
        (function(x, t) * weight).sum().backward()
        grads.append((x.grad, t.grad))
    for ours, brute in zip(*grads, strict=True):
        assert ours.isfinite().all()
        torch.testing.assert_close(ours, brute, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["fair", "almost_fair"])
def test_fair_kinds_need_two_members(kind):
    with pytest.raises(ValueError, match="M=1"):
        crps(torch.zeros(2, 1, 3), torch.zeros(2, 3), kind=kind)
    torch.testing.assert_close(crps(torch.ones(2, 1, 3), torch.zeros(2, 3), kind="standard"), torch.ones(2, 3))


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown CRPS kind"):
        crps(torch.zeros(2, 3), torch.zeros(2), kind="energy")
    with pytest.raises(ValueError, match="alpha"):
        crps(torch.zeros(2, 3), torch.zeros(2), kind="almost_fair", alpha=0.0)
    with pytest.raises(ValueError, match="target shape"):
        crps(torch.zeros(2, 3), torch.zeros(3))


def tiny_example() -> tuple[torch.Tensor, torch.Tensor]:
    """members (B=1, M=2, G=2, V=2) and target (1, 2, 2) with fair CRPS 0, 2 (v0) and 1, 2 (v1) at g0, g1."""
    pairs = {(0, 0): (0.0, 2.0, 1.0), (1, 0): (1.0, 1.0, 3.0), (0, 1): (1.0, 3.0, 0.0), (1, 1): (2.0, 4.0, 0.0)}
    members, target = torch.zeros(1, 2, 2, 2), torch.zeros(1, 2, 2)
    for (g, v), (x1, x2, y) in pairs.items():
        members[0, :, g, v] = torch.tensor([x1, x2])
        target[0, g, v] = y
    return members, target


def test_loss_weights_hand_computed():
    members, target = tiny_example()
    loss = EnsembleCRPSLoss(area_weight=torch.tensor([1.0, 3.0]), variable_weight=torch.tensor([1.0, 3.0]), kind="fair")
    # area weights -> (0.5, 1.5), variable weights -> (0.25, 0.75)
    v0, v1 = (0.5 * 0 + 1.5 * 2) / 2, (0.5 * 1 + 1.5 * 2) / 2
    assert float(loss(members, target)) == pytest.approx(0.25 * v0 + 0.75 * v1)  # 1.6875
    assert loss.describe() == "fair CRPS"
    assert EnsembleCRPSLoss(area_weight=torch.ones(2), variable_weight=torch.ones(2)).describe() == "afCRPS(alpha 0.95)"


def test_loss_skips_nan_targets_with_finite_gradient():
    members, target = tiny_example()
    target[0, 1, 0] = float("nan")  # v0 keeps only g0 (CRPS 0)
    members.requires_grad_()
    loss = EnsembleCRPSLoss(area_weight=torch.tensor([1.0, 3.0]), variable_weight=torch.tensor([1.0, 3.0]), kind="fair")
    value = loss(members, target)
    assert float(value.detach()) == pytest.approx(0.25 * 0 + 0.75 * (0.5 * 1 + 1.5 * 2) / 2)  # 1.3125
    value.backward()
    assert members.grad.isfinite().all()
    assert (members.grad[0, :, 1, 0] == 0).all()


@pytest.mark.parametrize("kind", CRPS_KINDS)
def test_loss_of_equal_members_is_weighted_mae(kind):
    generator = torch.Generator().manual_seed(8)
    prediction = torch.randn(2, 40, 3, generator=generator)
    target = torch.randn(2, 40, 3, generator=generator)
    target[0, :5, 1] = float("nan")
    area, variables = torch.rand(40, generator=generator) + 0.5, torch.tensor([1.0, 2.0, 0.5])
    mae = WeightedLoss(area_weight=area, variable_weight=variables, terms=[("mae", 1.0)])(prediction, target)
    ensemble = EnsembleCRPSLoss(area_weight=area, variable_weight=variables, kind=kind)
    torch.testing.assert_close(ensemble(prediction[:, None].expand(2, 4, 40, 3), target), mae)
