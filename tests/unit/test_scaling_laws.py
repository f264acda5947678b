"""Amdahl's and Gustafson's fits recover the serial fraction of exact data, and project as the laws say."""

from __future__ import annotations

import pytest

from lab import scaling_laws
from lab.measure.bench.train import scaling


@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.25, 0.9, 1.0])
def test_amdahl_fit_recovers_the_serial_fraction_of_exact_data(fraction):
    speedups = {n: scaling_laws.amdahl_speedup(fraction, n) for n in (1, 2, 4, 8)}
    fit = scaling_laws.fit_amdahl(speedups)
    assert fit.serial_fraction == pytest.approx(fraction, abs=1e-9)
    assert fit.residual_rms < 1e-9
    projection = fit.as_dict()["projection"]
    assert list(projection) == ["8", "64", "512"]
    assert projection["512"]["speedup"] == pytest.approx(1 / (fraction + (1 - fraction) / 512))
    assert projection["64"]["efficiency"] == pytest.approx(projection["64"]["speedup"] / 64)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.6])
def test_gustafson_fit_recovers_the_serial_fraction_of_exact_data(fraction):
    fit = scaling_laws.fit_gustafson({n: n - fraction * (n - 1) for n in (1, 2, 4, 8)})
    assert fit.serial_fraction == pytest.approx(fraction, abs=1e-12) and fit.residual_rms < 1e-9


def test_noisy_speedups_fit_near_the_truth_and_say_how_far_off_they_are():
    truth = 0.1
    noise = {1: 0.0, 2: 0.03, 4: -0.05, 8: 0.04}
    fit = scaling_laws.fit_amdahl({n: scaling_laws.amdahl_speedup(truth, n) + e for n, e in noise.items()})
    assert fit.serial_fraction == pytest.approx(truth, abs=0.01)
    assert 0.01 < fit.residual_rms < 0.05


def test_superlinear_speedups_clamp_the_fraction_at_zero():
    assert scaling_laws.fit_amdahl({1: 1.0, 2: 2.2, 4: 4.5}).serial_fraction == 0.0


def test_the_fit_leaves_out_world_sizes_past_the_cores_and_needs_two_points():
    rows = scaling.derive(
        [{"world_size": n, "samples_per_second": 100.0 * s} for n, s in ((1, 1.0), (2, 1.8), (4, 1.2))]
    )
    rows[2]["oversubscribed"] = True
    fitted = scaling.fit(rows, "strong")
    assert fitted["points"] == 2 and fitted["serial_fraction"] == pytest.approx(1 / 1.8 * 2 - 1)
    assert scaling.fit(rows[:1], "strong") is None


def test_a_step_splits_into_parts_that_add_up_to_it():
    parts = scaling.breakdown({"step_seconds": 0.10, "no_sync_step_seconds": 0.07, "compute_step_seconds": 0.08})
    assert parts["compute_seconds"] == 0.07 and parts["other_seconds"] == 0.0  # noise: compute clamped to the step
    assert sum(parts.values()) == pytest.approx(0.10)
    assert scaling.breakdown({"step_seconds": 0.1}) is None  # results written before the compute blocks existed
