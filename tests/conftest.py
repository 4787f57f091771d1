"""Shared test setup: the sys.path line for tests/harness.py and the checkpoint-integrity runs."""

import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

# Tests import the launch helpers in tests/harness.py by plain name.
sys.path.insert(0, str(Path(__file__).parent))

import harness  # noqa: E402
import supervised  # noqa: E402
from ckpt_cases import (  # noqa: E402
    CONFIG_CASES,
    CORRUPTIONS,
    CRASH_CASES,
    DCP_METADATA,
    JOBS,
    RANK0,
    REFERENCE,
    _config_job,
    _corruption_job,
    _crash_job,
    _fresh_start_job,
    _naive_job,
    _none_verifies_job,
    _pickle_job,
    _retention_job,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--warm-standby",
        choices=("on", "off"),
        default="on",
        help="run every supervised job (truestep launch) with resilience.warm_standby on (the default) "
        "or off: the supervised bitwise tests must pass both ways",
    )


def pytest_configure(config: pytest.Config) -> None:
    supervised.WARM_STANDBY = config.getoption("--warm-standby") == "on"
    if config.getoption("dist", default="no") == "loadgroup" and not _xdist_groups_apply():
        raise pytest.UsageError(
            "--dist loadgroup would ignore every xdist_group with this pytest and pytest-xdist (pyproject.toml "
            "pins pytest below 9.2 for this): reinstall with `make setup`"
        )


def _xdist_groups_apply() -> bool:
    """Whether pytest-xdist's way of applying a group reaches pytest: it renames each test to
    `nodeid@group` by assigning `item._nodeid`, which pytest 9.2's Node.nodeid no longer reads (pytest-xdist
    3.8). Ignored groups pass every test, but every worker makes each shared run, module run and SLURM
    cluster again, silently."""
    import inspect

    from _pytest.nodes import Node
    from xdist.remote import WorkerInteractor

    renames = "_nodeid" in inspect.getsource(WorkerInteractor.pytest_collection_modifyitems)
    return not renames or "_nodeid" in inspect.getsource(Node.nodeid.fget)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------------
# parallel runs (`make test`: pytest-xdist, --dist loadgroup)

SHARED_RUNS = (
    "reference_future",
    "supervised_reference",
    "layout_reference",
    "inprocess_reference",
    "runs",
    "slurm_cluster",
    "netns",
)
"""Session fixtures that train (or bring up a cluster) once for many tests: every test that uses one runs
in the worker that made it, instead of each worker making it again."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist every test gets a group: the SLURM tests one (one cluster at a time on this machine),
    a test of a shared session run that run's, any other test its module's (module fixtures made once)."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        path = Path(str(item.fspath))
        shared = next((name for name in SHARED_RUNS if _session_fixture(item, name)), None)
        if "slurm" in path.parts or item.get_closest_marker("slurm"):
            group = "slurm"
        elif shared is not None:
            group = f"shared-{shared}"
        else:
            group = path.stem
        item.add_marker(pytest.mark.xdist_group(group))


def _session_fixture(item: pytest.Item, name: str) -> bool:
    """`item` uses the session fixture `name` (a module's own fixture of that name is not it)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.get(name) if info is not None else None
    return bool(defs) and defs[-1].scope == "session"


# ----------------------------------------------------------------------------------------------
# shared runs


@pytest.fixture(scope="session")
def pool():
    executor = ThreadPoolExecutor(max_workers=JOBS)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)  # after -x, do not run what nobody waits for


@pytest.fixture(scope="session")
def layout_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """layout name -> its failure-free run (harness.LAYOUT_REFERENCE; the 2x2 mesh's under torchrun, the
    others' forked by the tests' server), run once per session on first use: what every resumed run of
    that layout must match bit for bit, whether the tests' fork server or the supervisor started it
    (tests/test_resume_bitwise.py, test_standby.py), and the single-process trajectory a resharded
    resume must keep (test_reshard.py)."""
    runs: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in runs:
            nproc, extra = harness.LAYOUTS[name]
            run_dir = tmp_path_factory.mktemp(f"ref-{name}")
            # The 2-D mesh's reference under real torchrun: what forked and supervised ranks must match.
            launcher = "torchrun" if name == "fsdp2xtp2" else "fork"
            harness.launch(run_dir, *harness.LAYOUT_REFERENCE, *extra, nproc=nproc, launcher=launcher)
            runs[name] = run_dir
        return runs[name]

    return get


@pytest.fixture(scope="session")
def layout_references(layout_reference: Callable[[str], Path]) -> dict[str, Path]:
    """Every layout's reference run (`layout_reference`)."""
    return {name: layout_reference(name) for name in harness.LAYOUTS}


@pytest.fixture(scope="session")
def inprocess_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A failure-free single-process run of harness.INPROCESS_JOB, run in the test process (the fast
    tier's reference: tests/test_rank_inprocess.py)."""
    run = tmp_path_factory.mktemp("inprocess-ref")
    assert harness.run_in_process(run, *harness.INPROCESS_JOB) == 0
    return run


@pytest.fixture(scope="session")
def reference_future(pool, tmp_path_factory) -> Future:
    run = tmp_path_factory.mktemp("reference") / "run"

    def job() -> Path:
        harness.launch(run, *REFERENCE)
        return run

    return pool.submit(job)


@pytest.fixture(scope="session")
def reference(reference_future) -> Path:
    return reference_future.result()


@pytest.fixture(scope="session")
def independent_runs(pool, reference_future, tmp_path_factory) -> dict[str, Future]:
    """Runs that need nothing but a fresh directory (queued behind the reference run)."""
    base = tmp_path_factory.mktemp("independent")
    jobs: dict[str, Future] = {}
    for point, mode in CRASH_CASES:
        name = f"{point.replace(':', '_')}-{mode}"
        jobs[f"crash/{point}/{mode}"] = pool.submit(_crash_job, base / name, point, mode)
    jobs["naive"] = pool.submit(_naive_job, base / "naive")
    jobs["retention"] = pool.submit(_retention_job, base / "retention")
    return jobs


@pytest.fixture(scope="session")
def derived_runs(pool, independent_runs, reference, tmp_path_factory) -> dict[str, Future]:
    """Destructive cases, each on its own copy of the reference run directory (requesting
    independent_runs first queues those runs too, whichever test file runs first)."""
    base = tmp_path_factory.mktemp("derived")
    jobs: dict[str, Future] = {}
    (base / "none-verifies").mkdir()
    jobs["none-verifies"] = pool.submit(_none_verifies_job, reference, base / "none-verifies")
    jobs["fresh-start"] = pool.submit(_fresh_start_job, reference, base / "fresh-start")
    for name, corrupt in CORRUPTIONS.items():
        jobs[f"corrupt/{name}"] = pool.submit(_corruption_job, reference, base / name, corrupt)
    for target in (DCP_METADATA, RANK0):
        (base / f"pickle{target}").mkdir()
        jobs[f"pickle/{target}"] = pool.submit(
            _pickle_job, reference, base / f"pickle{target}" / "run", target
        )
    for name, overrides in CONFIG_CASES.items():
        jobs[f"config/{name}"] = pool.submit(_config_job, reference, base / f"config-{name}", *overrides)
    return jobs


# ---------------------------------------------------------------------------------------------- supervised


@pytest.fixture(scope="session")
def supervised_reference(tmp_path_factory) -> Path:
    """A failure-free run of the supervised test job (tests/supervised.py): the reference every faulted
    supervised run must match bit for bit."""
    from supervised import finish, supervise

    run = tmp_path_factory.mktemp("supervised-ref")
    proc = supervise(run)
    assert finish(proc) == 0, finish.last_output  # type: ignore[attr-defined]
    return run


# ---------------------------------------------------------------------------------------------- interop
# Shared by tests/test_interop_hf.py and tests/test_interop_import.py (constants in interop_cases.py).


@pytest.fixture(scope="module")
def offline():
    """Never reach the network: every model here is local. Used per module via pytestmark."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict[str, Path]:
    """layout name -> the final checkpoint directory of a short real run at that layout."""
    from harness import launch
    from interop_cases import COMMON, LAYOUTS, STEPS
    from truestep.checkpoint.catalog import step_dir_name

    found = {}
    with pytest.MonkeyPatch.context() as mp:  # the runs were launched offline before the split too
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        for name, (nproc, extra) in LAYOUTS.items():
            run = tmp_path_factory.mktemp(f"interop-{name}")
            launch(run, *COMMON, *extra, nproc=nproc)
            found[name] = run / "checkpoints" / step_dir_name(STEPS)
    return found


@pytest.fixture(scope="session")
def ckpt(runs) -> Path:
    return runs["single"]
