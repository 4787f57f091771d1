"""Whose logs these are, and what shaped the trajectory beyond the config: checked like the config.

**Ownership.** Every run directory has an identity, the `run_id` of its lease (resilience/lease.py,
kept across jobs and requeues; checkpoint/ownership.py), and every attempt logs it in its `run_start`.
Logs that name another run than the directory they are read from (another run's metrics and events
copied in), or name one where the directory has no lease, are refused (exit 3): a verdict about a
directory is about the run that made it. Logs that name none (runs made before it was logged) are
accepted as unknown.

**Provenance.** Every attempt's `run_start` records the package version and a digest of the installed
source, the torch version, the content digest of the token shards it reads and of the `init_from`
checkpoint (train/provenance.py). Reference, floor repeats and the run under test must agree on all of
it, every attempt of each (the init source: the attempt that started fresh); what differs, or was not
recorded, is named and refused (exit 3) unless the caller compares anyway
(`--allow-provenance-mismatch`), and then every verdict and floor label says so.

**Same run.** Two directories with the same run id, or whose attempts started at the same instants,
hold one run (a copy, or a copy continued): a floor counts it once, and a run under test that is the
reference, or a copy of it, is refused (analysis/summary.py).
"""

from __future__ import annotations

from typing import Any

from truestep.analysis.runlog import RunLog, RunLogError
from truestep.checkpoint.ownership import current_run_id

KEYS = {
    "truestep_version": "truestep version",
    "source_sha256": "code (digest of the installed source)",
    "torch_version": "torch version",
    "data_sha256": "data (digest of the token shards)",
    "init_from_sha256": "init source (checkpoint.init_from)",
}
"""Provenance fields and how a difference in each is named."""
INIT = "init_from_sha256"
FLAG = "--allow-provenance-mismatch"


def recorded(run: RunLog) -> dict[int, dict[str, Any] | None]:
    """attempt -> the provenance its first run_start logged (None: it logged none)."""
    found: dict[int, dict[str, Any] | None] = {}
    for e in run.named("run_start"):
        prov = e.get("provenance")
        found.setdefault(int(e.get("attempt") or 0), prov if isinstance(prov, dict) else None)
    return found


def _short(value: Any) -> str:
    text = str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text[:80]


def differences(run: RunLog, ref: RunLog) -> list[str]:
    """What `run`'s provenance says that the reference's does not, one phrase each (empty: the same).
    Every attempt of `run` is compared with the reference's first; the init source only for each run's
    first attempt (a resumed attempt does not read it). Not recorded is a difference, never agreement."""
    theirs = recorded(ref)
    want = theirs[min(theirs)] if theirs else None
    if want is None:
        return [f"the reference {ref.path} recorded no provenance (made before truestep recorded it?)"]
    ours = recorded(run)
    if not ours:
        return [f"{run.path} logged no run_start (no provenance)"]
    first = min(ours)
    found = []
    for attempt, prov in sorted(ours.items()):
        where = f"{run.path.name} attempt {attempt}"
        if prov is None:
            found.append(f"{where} recorded no provenance")
            continue
        for key, name in KEYS.items():
            if key == INIT and attempt != first:
                continue
            if prov.get(key) != want.get(key):
                found.append(
                    f"{name}: {_short(prov.get(key))} ({where}) vs {_short(want.get(key))} (reference)"
                )
    return list(dict.fromkeys(found))


def check_provenance(run: RunLog, ref: RunLog, role: str) -> None:
    """Refuse (exit 3) a `role` run whose provenance is not the reference's."""
    found = differences(run, ref)
    if found:
        raise RunLogError(
            f"{role} {run.path} did not run what the reference ran: {'; '.join(found)}. Its trajectory "
            f"is not comparable (give {FLAG} to compare anyway; the verdict is then labelled)"
        )


def logged_run_ids(run: RunLog) -> list[str]:
    """The distinct run ids the run's run_start events name (runs made before they were logged: none)."""
    ids = [e.get("run_id") for e in run.named("run_start")]
    return list(dict.fromkeys(i for i in ids if isinstance(i, str) and i))


def ownership_problem(run: RunLog) -> str | None:
    """Why the logs in `run.path` are not that directory's own run, or None."""
    logged = logged_run_ids(run)
    if not logged:
        return None
    lease = current_run_id(run.path)
    foreign = [i for i in logged if i != lease]
    if not foreign:
        return None
    if not lease:
        return f"its logs are run {', '.join(logged)}'s but the directory has no lease naming a run"
    return f"its logs are run {', '.join(foreign)}'s, the directory's lease is run {lease}'s"


def check_owned(run: RunLog, role: str) -> None:
    """Refuse (exit 3) logs that belong to another run directory than the one they are read from."""
    problem = ownership_problem(run)
    if problem:
        raise RunLogError(
            f"{role} {run.path} holds another run's logs ({problem}): a verdict about a directory must "
            "come from its own run"
        )


def same_run(a: RunLog, b: RunLog) -> bool:
    """`a` and `b` hold one run (a copy, or a copy continued): the same run id, an attempt that started
    at the same instant in both, or the same directory."""
    if a.path.resolve() == b.path.resolve():
        return True
    if set(logged_run_ids(a)) & set(logged_run_ids(b)):
        return True
    starts = set(a.identity)
    return bool(starts) and any(s in starts for s in b.identity)
