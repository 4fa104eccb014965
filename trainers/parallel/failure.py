"""What each rank of a failed run says: the rank that failed, its error; the others, that they
stopped because of it.

When one rank fails, the others fail too, inside whatever collective they were waiting in, with
the process group's own error (gloo: "Connection closed by peer", NCCL: a watchdog timeout) that
says nothing about the cause. So the rank that fails first records its error in the run folder
(`<run>/failures/<launch>.json`, the first writer wins; the folder is shared by every rank, as
checkpoints need) before its process group closes, and a rank whose error came from the process
group looks there: it then reports `PeerFailed` ("stopped because rank N failed: ...") instead.
A launch is one torchrun start (its run id and restart count), so an earlier launch's failure is
never taken for this one's.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from slipstream.errors import PeerFailed, SlipstreamError

log = logging.getLogger(__name__)

FOLDER = "failures"
PEER_WAIT_S = 5.0
"""How long a rank whose collective failed waits for the failing rank's record."""


def launch_id() -> str | None:
    """This torchrun start (None outside torchrun: a world of one has no peers)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run:
        return None
    return f"{run}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}".replace(os.sep, "_")


def one_line(e: BaseException) -> str:
    """An error as one line: ours as its message, others as `Type: message`."""
    text = str(e) if isinstance(e, SlipstreamError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())


def from_process_group(e: BaseException) -> bool:
    """Whether `e` is the process group's own error (a peer went away, a collective timed out)."""
    import torch.distributed as dist

    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(w in text for w in ("gloo", "Gloo", "NCCL", "Connection closed",
                                                                      "Connection reset", "Broken pipe"))


def settle(e: BaseException, run_dir: Path, rank: int, world: int) -> PeerFailed | None:
    """Call with the error that ends this rank, before the process group closes. Returns the
    `PeerFailed` to raise instead when another rank failed first; else records `e` as this
    launch's failure (when it is the first) and returns None."""
    launch = launch_id()
    if world <= 1 or launch is None:
        return None
    path = run_dir / FOLDER / f"{launch}.json"
    if from_process_group(e):
        deadline = time.monotonic() + PEER_WAIT_S
        while True:
            first = _read(path)
            if first is not None and first.get("rank") != rank:
                return PeerFailed(f"stopped because rank {first.get('rank')} failed: {first.get('error')}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "x") as fh:
            json.dump({"rank": rank, "error": one_line(e)}, fh)
    except FileExistsError:
        pass
    except OSError as err:  # the run folder is unwritable: the peers keep their own errors
        log.debug("could not record rank %d's failure in %s: %s", rank, path, err)
    return None


def forget_earlier(run_dir: Path) -> None:
    """Rank 0 at start: remove the records of earlier launches of this run."""
    launch = launch_id()
    folder = run_dir / FOLDER
    if not folder.is_dir():
        return
    for p in folder.glob("*.json"):
        if p.stem != launch:
            p.unlink(missing_ok=True)


def _read(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or half written
        return None
    return data if isinstance(data, dict) else None
