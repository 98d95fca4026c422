"""The learning-rate runs a trial trains, as its config names them and its reports list them: one, or a fused trial's
members (``sweep.resources.fuse``, ``pipeline.training.fused_trial``). Plain dicts, without torch or Ray: the searcher
(run by the forecast and the replay, which import neither) and the Tune worker read them alike.

A fused trial's config lists its ``members`` (each with ``lr``, ``trial_key``, ``resume``, ``resume_step``) beside
the settings they share (``train``, without ``lr``); its reports list ``members`` (each with its ``trial_key`` and
what a separate trial of it reports) beside what they share (the node, the system metrics, ``final``). Tune passes
lists through its results as they are.
"""

from __future__ import annotations

RUN = ("trial_key", "resume", "resume_step")  # what names a learning-rate run and where it continues from


def members(config: dict) -> list[dict]:
    """The learning-rate runs a trial's config trains: a fused trial's ``members``, else the trial itself; each
    with ``lr``, ``trial_key``, ``resume`` and ``resume_step``."""
    if "members" in config:
        return config["members"]
    return [{"lr": config["train"]["lr"]} | {k: config.get(k) for k in RUN}]


def member_results(result: dict) -> list[dict]:
    """A trial's report as one per learning-rate run: a fused trial's ``members``, each with what the report says of
    all of them (its node, system metrics, whether final), else the report itself."""
    if "members" not in result:
        return [result]
    shared = {k: v for k, v in result.items() if k != "members"}
    return [shared | member for member in result["members"]]
