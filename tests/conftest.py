"""Fixtures: real devices only (helpers live in tests/support/). RPC devices come from real
ggml RPC servers on loopback, each in its own process, started once per session by the first
test that asks for them (fixture rpc_servers), so a run that needs none starts none. The
markers each folder gives its tests are set here (tests/README.md)."""
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS.parent))  # build_ggml / ggml_build for the build tests
sys.path.insert(1, str(TESTS))         # `support`, whatever pytest's import mode

import ggml_py as gg  # noqa: E402
from support import LOCAL_NAMES, N_RPC, RPC_IDS, device_of  # noqa: E402

# the marker every test of a folder gets (pyproject.toml registers them)
FOLDER_MARKS = {"rpc": "rpc", "accel": "gpu", "builds": "build"}


def pytest_collection_modifyitems(config, items):
    """Mark each test by its folder, and `rpc` every test that starts the session's RPC
    servers (asks for rpc_servers, or takes an RPC device of the `dev` fixture: its param
    carries the mark). tests/core/ runs without them: a test there that asks is an error."""
    for item in items:
        folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        if folder in FOLDER_MARKS:
            item.add_marker(FOLDER_MARKS[folder])
        if "rpc_servers" in getattr(item, "fixturenames", ()):
            if folder == "core":
                raise pytest.UsageError(f"{item.nodeid} asks for the RPC servers, which "
                                        "tests/core/ runs without: move it to tests/rpc/")
            item.add_marker("rpc")


@pytest.fixture(scope="session")
def rpc_servers():
    """Two ggml RPC servers for the session, started by the first test that asks for them
    (directly, through rpc_devs, or as an RPC device of `dev`)."""
    servers = [gg.rpc.serve() for _ in range(N_RPC)]
    for s in servers:
        # each server's device, found by its endpoint: other tests may have registered
        # servers of their own first, so the names RPC0/RPC1 are not ours to assume
        s.device = gg.rpc.connect(s.endpoint).devices[0]
    yield servers
    for s in servers:
        s.close()


@pytest.fixture(params=LOCAL_NAMES + [pytest.param(n, marks=pytest.mark.rpc) for n in RPC_IDS])
def dev(request):
    """Every available device: the local ones (CPU, and CUDA/Metal/Vulkan where built) and
    two RPC devices (those of the session's servers, named RPC0 and RPC1 in the test ids;
    ggml 0.9.x names them "RPC[host:port]"). Only the RPC ones start the servers."""
    if request.param in RPC_IDS:
        return device_of(request.param, request.getfixturevalue("rpc_servers"))
    return gg.device(request.param)


@pytest.fixture
def cpu():
    return gg.device("CPU")


@pytest.fixture
def rpc_devs(rpc_servers):
    return [s.device for s in rpc_servers]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def small_model(cpu):
    """A one-layer model's tensors on a one-thread CPU backend: (backend, context, x of batch 16
    and 2 features, unset; W of 3 x 2, all 0.5)."""
    with cpu.backend(n_threads=1) as be, gg.Context() as ctx:
        x = ctx.tensor(gg.f32, (16, 2), "x")
        W = ctx.tensor(gg.f32, (3, 2), "W")
        ctx.alloc(be)
        W.set(np.full((3, 2), 0.5, np.float32))
        yield be, ctx, x, W
