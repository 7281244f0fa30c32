"""The run's history page by page (`GET /history`): its episodes and evaluations after the ones a
client has, so that a dashboard polling a long run fetches only what is new.

The rows live in two places: the run folder's tables (a3c_http/store/runstore.py) hold those saved,
the ledger those reported since the last save. A page is read under the persister's mutex, so no
save moves rows from one to the other and no new run archives the folder while it is read: the two
parts are disjoint and belong to the same run, whose id the page names (a client that sees another
run id starts again from 0).
"""

from __future__ import annotations

from typing import Any

from a3c_http.store.runstore import EPISODE_FIELDS, EVALUATION_FIELDS
from master.state import ClusterState

MAX_LIMIT = 10_000


def history_page(
    state: ClusterState, since: int, limit: int, evaluations_since: int
) -> dict[str, Any]:
    """The episodes numbered above `since` and the evaluations numbered above
    `evaluations_since`, at most `limit` of each, in order; `next` and `evaluations_next` are
    what to ask for next, `more` whether rows beyond this page exist already."""
    ledger, store = state.ledger, state.store
    with state.persister.mutex:
        with ledger.lock:
            run_id, run_state = ledger.run_id, ledger.run_state
            total, evaluation_total = ledger.stats.global_episode, ledger.evals.count
            unsaved = [r for r in ledger.unsaved_rows if r[0] > since]
            unsaved_evaluations = [r for r in ledger.evals.unsaved if r[0] > evaluations_since]
        episodes, evaluations = [], []
        if state.persister.holds_current_run:  # not the rows of a run not taken up, or before
            episodes = store.read_episodes(since, limit)
            evaluations = store.read_evaluations(evaluations_since, limit)
    episodes += [dict(zip(EPISODE_FIELDS, r, strict=True)) for r in unsaved]
    evaluations += [dict(zip(EVALUATION_FIELDS, r, strict=True)) for r in unsaved_evaluations]
    episodes, evaluations = episodes[:limit], evaluations[:limit]
    next_episode = episodes[-1]["global_episode"] if episodes else since
    next_evaluation = evaluations[-1]["evaluation"] if evaluations else evaluations_since
    return {
        "run_id": run_id,
        "state": run_state,
        "global_episode": total,
        "evaluations_total": evaluation_total,
        "episodes": episodes,
        "evaluations": evaluations,
        "next": next_episode,
        "evaluations_next": next_evaluation,
        "more": next_episode < total or next_evaluation < evaluation_total,
    }
