"""Shared pytest set-up: hypothesis profiles and the interpreter switch for Triton kernels."""
import os

# Triton must see TRITON_INTERPRET before it is first imported, so kernels run on CPU tensors in CI.
if not os.environ.get("KVREF_GPU"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings

# `ci`: quick and deterministic (the default under CI); `dev`: a little more; `soak`: long runs by hand.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("soak", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config, items):
    "`@pytest.mark.slow` tests run only with KVREF_SLOW=1 (soak runs by hand); `gpu` tests skip themselves."
    if os.environ.get("KVREF_SLOW") == "1": return
    import pytest
    skip = pytest.mark.skip(reason="slow: set KVREF_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords: item.add_marker(skip)
