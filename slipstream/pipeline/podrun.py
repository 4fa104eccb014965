"""Entry point of the training container: run torchrun, then hand its lineage to Airflow.

`python -m slipstream.pipeline.podrun --run-dir D --xcom /airflow/xcom/return.json -- torchrun ...`

The KubernetesPodOperator's XCom sidecar returns whatever the main container leaves in
`/airflow/xcom/return.json`; this wrapper writes the run's small lineage dict there once the
trainer exits 0. It forwards SIGTERM/SIGINT to torchrun (which stops its workers), so deleting
the pod stops training cleanly and the last checkpoint stays resumable.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from slipstream.pipeline.runlayout import read_metrics, training_lineage, write_json_atomic

log = logging.getLogger(__name__)


def run(command: list[str], run_dir: Path, xcom_path: Path | None) -> int:
    proc = subprocess.Popen(command)

    def forward(signum: int, _frame: FrameType | None) -> None:
        log.warning("podrun: forwarding signal %d to %s (pid %d)", signum, command[0], proc.pid)
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    rc = proc.wait()
    if rc != 0:
        log.error("podrun: %s exited with %d; run folder %s", command[0], rc, run_dir)
        return rc
    if xcom_path is not None:
        write_json_atomic(xcom_path, training_lineage(run_dir, read_metrics(run_dir)))
        log.info("podrun: lineage of %s written to %s", run_dir.name, xcom_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slipstream.pipeline.podrun", description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path, help="the run folder the trainer writes")
    parser.add_argument("--xcom", type=Path, default=None, help="where to write the lineage JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- torchrun ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the training command after --")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(command, args.run_dir, args.xcom)


if __name__ == "__main__":
    sys.exit(main())
