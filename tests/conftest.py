"""Shared test setup: offline hub, deterministic seeds, and the path to timm's real train.py."""
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
