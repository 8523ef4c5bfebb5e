"""Fixtures shared by the Python tests: the shared test data folder and the
CLI binary of the build under test, each skipping with a reason when absent."""
import pytest

from cli_lib import find_shared_dir, need_bin


@pytest.fixture(scope="session")
def shared_dir():
    d = find_shared_dir()
    if d is None:
        pytest.skip("../shared not found (set DEEPINFER_SHARED_DIR)")
    return d


@pytest.fixture(scope="session")
def cli():
    return need_bin()
