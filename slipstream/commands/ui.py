"""`slipstream ui up|down`: the Airflow UI and its scheduler on 127.0.0.1 (`make ui`, `make ui-stop`)."""

from __future__ import annotations

import argparse

from slipstream.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("ui", help="start or stop Airflow (api-server, scheduler, dag-processor, triggerer)")
    sp = p.add_subparsers(dest="action", required=True)
    up = sp.add_parser("up", help="start the local stack and Airflow on 127.0.0.1; print URL and login")
    up.add_argument("--port", type=int, default=None, help="api-server port (default SLIPSTREAM_UI_PORT or 8080)")
    up.set_defaults(func=_up)
    sp.add_parser("down", help="stop the Airflow components by PID (the broker keeps running)").set_defaults(func=_down)


def _up(args: argparse.Namespace) -> int:
    from slipstream.dev import ui

    info = ui.up(Settings.from_env(), port=args.port)
    print(f"Airflow UI  {info.url}")
    print(f"login       {info.username} / {info.password}")
    for name, pid in info.pids.items():
        print(f"{name:22s} pid {pid}")
    print(f"logs        {info.logs}")
    print("stop with   make ui-stop  (slipstream ui down)")
    return 0


def _down(args: argparse.Namespace) -> int:
    from slipstream.dev import ui

    stopped = ui.down(Settings.from_env())
    print("stopped: " + (", ".join(stopped) if stopped else "no Airflow component was running"))
    return 0
