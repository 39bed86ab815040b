"""Ensemble verification sums (scoring.ensemble_scores) on synthetic ensembles, and their plots
(diagnostics.ensemble_plots)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from anemo_like.diagnostics.ensemble_plots import plot_rank_histograms, plot_spread_skill
from anemo_like.scoring.ensemble_scores import EnsembleScoreSums

ARRAYS = ("crps", "ensemble_mean_rmse", "spread", "spread_skill", "rank_histogram")


def synthetic(
    seed: int, *, batch: int, members: int, grid: int, variables: int, member_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """members (B, M, G, V) ~ N(mu, (member_scale sigma)^2) and target (B, G, V) ~ N(mu, sigma^2) with mu (B, G, V)
    and sigma (G, V) varying by point, area weights (G,) with mean 1, and sigma."""
    rng = np.random.default_rng(seed)
    mu = 3.0 * rng.standard_normal((batch, 1, grid, variables))
    sigma = rng.uniform(0.5, 2.0, (grid, variables))
    ensemble = mu + member_scale * sigma * rng.standard_normal((batch, members, grid, variables))
    target = mu[:, 0] + sigma * rng.standard_normal((batch, grid, variables))
    area = rng.uniform(0.2, 1.0, grid)
    return ensemble, target, area / area.mean(), sigma


def accumulate(members, target, area, *, leads: int = 1, lead: int = 0) -> EnsembleScoreSums:
    sums = EnsembleScoreSums.zeros(num_leads=leads, num_variables=target.shape[-1], num_members=members.shape[1])
    sums.add(lead, members, target, area)
    return sums


def test_calibrated_ensemble_is_flat_with_unit_spread_skill():
    """M = 4 members and the truth drawn from one distribution, 200k points per variable: the (M+1)/M corrected
    spread matches the ensemble-mean RMSE (relative standard error ~0.3%), the ranks are uniform."""
    size, points = 4, 200_000
    sums = EnsembleScoreSums.zeros(num_leads=2, num_variables=2, num_members=size)
    members, target, area, sigma = synthetic(0, batch=200, members=size, grid=1000, variables=2)
    for half in (slice(0, 100), slice(100, 200)):  # two batches of 100 x 1000 points
        sums.add(1, members[half], target[half], area)
    arrays = sums.as_arrays()
    assert np.all(np.abs(arrays["spread_skill"][1] - 1) < 0.02)
    uncorrected = arrays["spread"][1] * math.sqrt(size / (size + 1))
    assert np.all(uncorrected / arrays["ensemble_mean_rmse"][1] < 0.92)  # the correction matters at M = 4
    frequency = 1 / (size + 1)
    assert np.all(np.abs(arrays["rank_histogram"][1] - frequency) < 5 * math.sqrt(frequency * (1 - frequency) / points))
    assert sums.rank_counts[1].sum(-1).tolist() == [points, points]
    # E[CRPS] of a calibrated Gaussian is sigma / sqrt(pi) (relative standard error here ~0.3%)
    expected = (area[:, None] * sigma).mean(0) / math.sqrt(math.pi)
    np.testing.assert_allclose(arrays["crps"][1], expected, rtol=0.02)
    assert np.isnan(arrays["crps"][0]).all()  # lead 0 saw no data


def test_under_dispersed_ensemble_gives_u_shape():
    members, target, area, _ = synthetic(2, batch=20, members=8, grid=500, variables=2, member_scale=0.3)
    arrays = accumulate(members, target, area).as_arrays()
    histogram = arrays["rank_histogram"][0]  # (V, 9)
    assert np.all(histogram[:, 0] > 3 * histogram[:, 4])
    assert np.all(histogram[:, -1] > 3 * histogram[:, 4])
    assert np.all(arrays["spread_skill"][0] < 0.5)


def test_ties_are_broken_uniformly():
    members = np.zeros((10, 3, 5000, 1))
    target = np.zeros((10, 5000, 1))
    histogram = accumulate(members, target, np.ones(5000)).as_arrays()["rank_histogram"][0, 0]
    assert np.all(np.abs(histogram - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 50_000))


def test_merge_of_halves_equals_one_accumulation():
    members, target, area, _ = synthetic(3, batch=8, members=5, grid=300, variables=3)
    whole = accumulate(members, target, area, leads=2, lead=1)
    first = accumulate(members[:4], target[:4], area, leads=2, lead=1)
    first.merge(accumulate(members[4:], target[4:], area, leads=2, lead=1))
    np.testing.assert_array_equal(first.rank_counts, whole.rank_counts)
    for name in ("crps_sum", "squared_error_sum", "variance_sum", "weight_sum"):
        np.testing.assert_allclose(getattr(first, name), getattr(whole, name), rtol=1e-12)
    with pytest.raises(ValueError, match="merge"):
        first.merge(EnsembleScoreSums.zeros(num_leads=2, num_variables=3, num_members=4))


def test_nan_targets_are_skipped():
    members, target, area, _ = synthetic(4, batch=6, members=4, grid=200, variables=2)
    missing = target.copy()
    missing[:, 150:, 0] = np.nan  # variable 0 only at grid points 0..149
    arrays = accumulate(members, missing, area).as_arrays()
    subset = accumulate(members[:, :, :150], target[:, :150], area[:150]).as_arrays()
    full = accumulate(members, target, area).as_arrays()
    for name in ARRAYS:
        np.testing.assert_allclose(arrays[name][:, 0], subset[name][:, 0], rtol=1e-12)
        np.testing.assert_allclose(arrays[name][:, 1], full[name][:, 1], rtol=1e-12)
    assert accumulate(members, missing, area).rank_counts[0].sum(-1).tolist() == [6 * 150, 6 * 200]


def test_torch_inputs_match_numpy_and_records():
    members, target, area, _ = synthetic(5, batch=3, members=4, grid=50, variables=2)
    from_numpy = accumulate(members, target, area)
    from_torch = accumulate(torch.from_numpy(members).float(), torch.from_numpy(target).float(), torch.ones(50))
    np.testing.assert_array_equal(from_torch.rank_counts, from_numpy.rank_counts)  # float32 keeps the order here
    records = from_numpy.records(variables=["t2m", "z_500"], leads=["6h"])
    assert sorted(records) == sorted(
        f"{p}_{v}_6h" for p in ("crps", "ens_rmse", "spread", "ssr") for v in ("t2m", "z_500")
    )
    assert records["ssr_z_500_6h"] == pytest.approx(records["spread_z_500_6h"] / records["ens_rmse_z_500_6h"])
    with pytest.raises(ValueError, match="M=1"):
        EnsembleScoreSums.zeros(num_leads=1, num_variables=1, num_members=1)
    with pytest.raises(ValueError, match="do not match"):
        from_numpy.add(0, members[:, :3], target, area)


def test_plots_write_png_files(tmp_path):
    rng = np.random.default_rng(6)
    histogram = rng.dirichlet(np.ones(5), size=(3, 2))  # (L, V, M + 1)
    spread, rmse = rng.uniform(0.5, 1.5, (3, 2)), rng.uniform(0.5, 1.5, (3, 2))
    ranks, skill = tmp_path / "ranks.png", tmp_path / "spread_skill.png"
    plot_rank_histograms(ranks, histogram, variables=["t2m", "z_500"], lead="12h", lead_index=1)
    plot_spread_skill(skill, spread, rmse, variables=["t2m", "z_500"], leads=["6h", "12h", "18h"])
    for path in (ranks, skill):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 1000
