"""`slipstream stack up|down|status`: the embedded local stack on 127.0.0.1."""

from __future__ import annotations

import argparse
import json

from slipstream.dev import stack
from slipstream.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stack", help="start, stop or inspect the local stack (Kafka broker, catalog, Airflow home)")
    sp = p.add_subparsers(dest="action", required=True)
    up = sp.add_parser("up", help="start the broker, prepare the catalog and AIRFLOW_HOME")
    up.add_argument("--no-airflow", action="store_true", help="skip `airflow db migrate`")
    up.add_argument("--spark-workers", type=int, default=0, metavar="N",
                    help="also start a Spark standalone master and N workers (1 core, 1g each) on 127.0.0.1; "
                         "preprocessing then runs on it")
    up.add_argument("--profile", choices=stack.PROFILES, default="local",
                    help="local: broker + SQLite catalog (+ S3 when the warehouse is on s3://); cluster: broker, "
                         "S3, the Iceberg REST catalog over it and a Spark cluster (2 workers unless --spark-workers)")
    up.add_argument("--spark-connect", action="store_true",
                    help="also start a warm Spark (a Spark Connect server on 127.0.0.1) that preprocessing runs submit to")
    up.add_argument("--joiner", action="store_true",
                    help="also start the sample joiner (raw impressions + clicks topics -> the sample topic)")
    up.set_defaults(func=_up)
    sp.add_parser("down", help="stop what `up` started, by PID").set_defaults(func=_down)
    sp.add_parser("status", help="what is running and where").set_defaults(func=_status)


def _up(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    state = stack.up(settings, airflow=not args.no_airflow, spark_workers=args.spark_workers, profile=args.profile,
                     joiner=args.joiner, spark_connect=args.spark_connect)
    for name, svc in state.services.items():
        print(f"{name:14s} pid {svc.pid:<7d} {svc.address}  (log: {svc.log})")
    settings = stack.effective_settings(settings)
    where = settings.catalog_uri or settings.home / "catalog.db"
    print(f"catalog  {settings.catalog} -> {where}, warehouse {settings.warehouse}")
    if not args.no_airflow:
        print(f"airflow  AIRFLOW_HOME={settings.home / 'airflow'} (SQLite)")
    return 0


def _down(args: argparse.Namespace) -> int:
    stopped = stack.down(Settings.from_env())
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def _status(args: argparse.Namespace) -> int:
    print(json.dumps(stack.status(Settings.from_env()), indent=2))
    return 0
