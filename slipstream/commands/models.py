"""`slipstream models list|show RUN_ID|promote RUN_ID --reason R`: what the model registry holds and which model is champion."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from slipstream.commands import dataset_settings

if TYPE_CHECKING:
    from slipstream.pipeline.registry import ModelRegistry


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("models", help="list or show model packages in the registry")
    p.add_argument("--registry", default=None, help="registry folder or s3:// URI (default: the data set's, SLIPSTREAM_REGISTRY)")
    p.add_argument("--spec", default=None,
                   help="the data set whose registry to use: a spec name or file (default SLIPSTREAM_SPEC)")
    msub = p.add_subparsers(dest="models_command", required=True)
    ls = msub.add_parser("list", help="one line per model package, champion marked with *")
    ls.add_argument("--json", action="store_true", help="print the packages as JSON")
    ls.set_defaults(func=list_models)
    show = msub.add_parser("show", help="print one package (lineage, metrics, files, decision)")
    show.add_argument("run_id", help="the training run id of the package ('champion' for the champion)")
    show.set_defaults(func=show_model)
    promote = msub.add_parser("promote", help="make a published package the champion by hand (rollback or override)")
    promote.add_argument("run_id", help="the run id of a published package")
    promote.add_argument("--reason", required=True, help="why (kept in champion.json)")
    promote.set_defaults(func=promote_model)


def _registry(args: argparse.Namespace) -> ModelRegistry:
    from slipstream.pipeline.registry import ModelRegistry, RegistryConfig

    settings = dataset_settings(args.spec)
    location = args.registry or RegistryConfig.from_env(settings).location
    return ModelRegistry(location)


def list_models(args: argparse.Namespace) -> int:
    registry = _registry(args)
    packages = registry.list_packages()
    if args.json:
        print(json.dumps(packages, indent=2))
        return 0
    if not packages:
        print(f"no model packages in {registry.location}")
        return 0
    champ = (registry.champion() or {}).get("run_id")
    print(f"{'':1} {'run_id':28} {'created_at':26} {'auc':>7} {'logloss':>8} {'snapshot_id':>20}  decision")
    for pkg in packages:
        m, lin, dec = pkg.get("metrics", {}), pkg.get("lineage", {}), pkg.get("decision", {})
        print(
            f"{'*' if pkg['run_id'] == champ else ' ':1} {pkg['run_id']:28} {pkg.get('created_at', '')[:26]:26} "
            f"{_num(m.get('auc')):>7} {_num(m.get('logloss')):>8} {str(lin.get('snapshot_id', '-')):>20}  "
            f"{'promoted' if dec.get('promoted') else 'not promoted'}: {dec.get('reason', '')}"
        )
    print(f"registry: {registry.location}  (* = champion)")
    return 0


def show_model(args: argparse.Namespace) -> int:
    registry = _registry(args)
    run_id = args.run_id
    if run_id == "champion":
        champ = registry.champion()
        if champ is None:
            print(f"no champion in {registry.location} yet")
            return 1
        run_id = champ["run_id"]
    pkg = registry.package(run_id)
    if pkg is None:
        print(f"no package {run_id!r} in {registry.location}; `slipstream models list` shows what is there")
        return 1
    print(json.dumps(pkg, indent=2))
    return 0


def promote_model(args: argparse.Namespace) -> int:
    registry = _registry(args)
    champion = registry.promote(args.run_id, args.reason)
    print(f"{champion['run_id']} is the champion of {registry.location} (by hand: {champion['manual']})")
    return 0


def _num(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"
