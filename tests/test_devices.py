"""Sharding over devices never changes a bit of the output."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rpwjax import cli

SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, jax, rpwjax
    secret = rpwjax.Secret.from_file(sys.argv[2]).for_release('d3' * 16, test='devices')  # one release, two runs
    y = np.random.default_rng(0).beta(2, 5, 200_003)
    # the private histogram and the release both draw from the key file's secret
    fit = rpwjax.fit("{mechanism}", y, range=(0, 1), epsilon=1.0, secret=secret.child("fit"))
    out = rpwjax.release(fit.params, secret.child("release"), y[7:], start=7)
    np.save(sys.argv[1], out)
    print(jax.device_count())
    """
)


def _run(tmp_path, devices, mechanism):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    target = tmp_path / f"{mechanism}-{devices}.npy"
    key = tmp_path / "key"
    if not key.exists():
        assert cli.main(["keygen", "-o", str(key)]) == 0
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(mechanism=mechanism), str(target), str(key)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(devices)
    return np.load(target)


@pytest.mark.long
@pytest.mark.slow
def test_one_and_four_devices_give_identical_output(tmp_path):
    for mechanism in ("rpwithprior", "staircase"):
        one = _run(tmp_path, 1, mechanism)
        four = _run(tmp_path, 4, mechanism)
        assert one.shape == (200_003 - 7,)
        np.testing.assert_array_equal(one, four)
