"""Shared fixtures: a fresh random generator per test, its seed printed so a failure can be
replayed (HETMEM_TEST_SEED=...)."""

import os
import secrets

import numpy as np
import pytest


@pytest.fixture
def rng():
    seed = int(os.environ.get("HETMEM_TEST_SEED", secrets.randbits(32)))
    print(f"seed {seed} (HETMEM_TEST_SEED={seed} replays it)")
    return np.random.default_rng(seed)
