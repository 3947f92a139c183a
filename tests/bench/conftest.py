"""Shared fixtures: one export cache for the whole session, so each tiny model is exported
once however many tests use it."""

import pytest


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo-cache")
