"""A trial's checkpoints as the storage holds them (Ray Tune's layout: <storage>/<sweep>/<trial>/checkpoint_NNNNNN/,
a fused trial's with a directory per member), for the driver, which never imports the training loop.

``latest`` finds checkpoints of earlier sweeps that died before their trials ended, by trial key under the same run
key (same data, settings and code), so a rerun continues them instead of starting over. ``tuning.DropFinished``
deletes a trial's checkpoints once it has ended with its verdict recorded (unless ``sweep.runs.keep_checkpoints``): a
finished run is reused from MLflow by later sweeps, never resumed, and a checkpoint holds three floats a parameter
(weights and AdamW's two moments), so at paper scale the finished trials' checkpoints would fill the storage (two of
a width-1024, depth-5 model: about 1.5 GB). A trial writes its ``META`` beside each checkpoint (``write_meta``).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.data.storage import filesystem, location_of

META = "meta.json"  # trial key, run key, step: how a later sweep finds it


def write_meta(directory: Path, trial_key: str, run_key: str, step: int) -> None:
    (directory / META).write_text(json.dumps({"trial_key": trial_key, "run_key": run_key, "step": step}))


def latest(storage: str, run_key: str) -> dict[str, dict]:
    """trial key -> {"path", "step"} of the newest checkpoint under ``storage`` (a path or a pyarrow URI) left
    by trials with this run key. Layout (Ray Tune's): <storage>/<sweep>/<trial>/checkpoint_NNNNNN/."""
    fs, root = filesystem(storage)
    found: dict[str, dict] = {}
    selector = pafs.FileSelector(root, allow_not_found=True)
    for sweep_dir in fs.get_file_info(selector):
        if sweep_dir.type != pafs.FileType.Directory or sweep_dir.base_name == "datasets":
            continue
        for trial_dir in fs.get_file_info(pafs.FileSelector(sweep_dir.path)):
            if trial_dir.type != pafs.FileType.Directory:
                continue
            for ckpt in checkpoint_dirs(fs, trial_dir.path):
                for saved in (ckpt, *member_dirs(fs, ckpt)):
                    try:
                        with fs.open_input_stream(f"{saved}/{META}") as f:
                            meta = json.loads(f.read())
                    except (OSError, ValueError):
                        continue  # a checkpoint still being copied, a fused trial's (its members'), or not ours
                    key, step = meta.get("trial_key"), meta.get("step", -1)
                    if meta.get("run_key") == run_key and step > found.get(key, {}).get("step", -1):
                        found[key] = {"path": location_of(saved, storage), "step": step}
    return found


def member_dirs(fs: pafs.FileSystem, checkpoint: str) -> list[str]:
    """The member directories of a fused trial's checkpoint (one per member, each a separate trial's checkpoint)."""
    return [e.path for e in fs.get_file_info(pafs.FileSelector(checkpoint)) if e.type == pafs.FileType.Directory]


def checkpoint_dirs(fs: pafs.FileSystem, trial_dir: str) -> list[str]:
    """The checkpoint_NNNNNN/ directories directly under ``trial_dir`` (paths of ``fs``; none if it is gone)."""
    return [
        e.path
        for e in fs.get_file_info(pafs.FileSelector(trial_dir, allow_not_found=True))
        if e.type == pafs.FileType.Directory and e.base_name.startswith("checkpoint_")
    ]


def drop_checkpoints(fs: pafs.FileSystem, trial_dir: str) -> None:
    for path in checkpoint_dirs(fs, trial_dir):
        fs.delete_dir(path)


def drop_trial(checkpoint: str) -> None:
    """Deletes every checkpoint of the trial that saved ``checkpoint`` (a location under the storage path): a
    trial's checkpoint_NNNNNN, or a member's directory in a fused trial's, whose other members' are left in place
    (a checkpoint left with none is deleted)."""
    fs, path = filesystem(checkpoint)
    parent, name = path.rstrip("/").rsplit("/", 1)
    if name.startswith("checkpoint_"):
        drop_checkpoints(fs, parent)
        return
    for ckpt in checkpoint_dirs(fs, parent.rsplit("/", 1)[0]):  # <trial>/checkpoint_NNNNNN/<member>
        drop_member(fs, ckpt, name)


def drop_member(fs: pafs.FileSystem, checkpoint: str, member: str) -> None:
    """Deletes one member's directory of a fused trial's checkpoint, and the checkpoint once no member is left."""
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(f"{checkpoint}/{member}")
    if not member_dirs(fs, checkpoint):
        fs.delete_dir(checkpoint)
