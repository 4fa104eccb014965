"""What the trainer's resumable pieces share: `state_dict()` / `load_state_dict(state)`.

The sources (Iceberg cursor, Kafka positions), the stream shuffle buffer, the replay reservoir, the
drift gauge and the run's counters each save and restore their own state, as torch's `Stateful`
objects do. A state is plain data (numbers, lists, numpy arrays) with a `version`; a piece refuses
a state it cannot honour (another version, another world size mid-epoch, other data) with a
`ResumeError` that says what to do, rather than resuming into lost or repeated samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from slipstream.errors import ResumeError


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def check_version(what: str, state: Mapping[str, Any], version: int) -> None:
    """Refuse a state of another version. States from before versioning count as version 1."""
    if not isinstance(state, Mapping):
        raise ResumeError(f"the checkpoint's {what} state is {type(state).__name__}, not a mapping: it is damaged")
    got = state.get("version", 1)
    if got != version:
        raise ResumeError(
            f"the checkpoint's {what} state is version {got!r}; this trainer reads version {version}: resume "
            "with the trainer that wrote it, or start a new run.run_id"
        )
