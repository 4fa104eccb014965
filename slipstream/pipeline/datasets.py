"""The data sets of one deployment: one per feature spec, each with tables, topics, raw zone and
registry of its own (named by `slipstream.settings`), and DAGs of its own.

`dataset_refs` is what a DAG file calls at parse time: a listing of SLIPSTREAM_SPECS_DIR (one data
set per spec file) or, without it, the one data set of SLIPSTREAM_SPEC — no spec is read, no
catalog asked. A `DatasetRef` names the data set's DAGs (`daily_retrain__criteo`), run ids
(`daily-criteo-20250104-…`) and Assets; its `settings` are the deployment's settings for it.

Before a run touches data, `check_raw_zone` and `open_dataset_table` make sure the spec and the
data belong together: a table carries the name of the data set that created it (the table
property `slipstream.dataset`), a raw zone holds one folder per source of its spec. A mismatch is
a `DatasetMismatch` whose first words say which spec does not match which table or folder.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slipstream.errors import DatasetMismatch
from slipstream.settings import DEFAULT_SPEC, Settings, dataset_name

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from slipstream.samples.spec import Spec

log = logging.getLogger(__name__)

SPEC_SUFFIXES = (".yaml", ".yml")
DATASET_PROPERTY = "slipstream.dataset"
"""Table property: the data set whose samples the table holds (set when a run first opens it)."""
SPEC_PROPERTY = "slipstream.spec"
"""Table property: `<spec name> v<version> <digest>` of the spec that last opened the table."""
BASE_COLUMNS = frozenset({"sample_id", "event_time", "label"})


@dataclass(frozen=True)
class DatasetRef:
    """A data set as a DAG file knows it at parse time: its name and where its spec is."""

    name: str
    spec: str
    """A shipped spec's name or a spec file's path: what SLIPSTREAM_SPEC would say."""
    in_ids: bool = False
    """Whether DAG ids, run ids and Assets carry the name (a deployment with a specs folder)."""

    def dag_id(self, base: str) -> str:
        return f"{base}__{self.name}" if self.in_ids else base

    def run_kind(self, kind: str) -> str:
        """The first part of the data set's run ids of `kind` (`daily` -> `daily-criteo`)."""
        return f"{kind}-{self.name}" if self.in_ids else kind

    def asset_uri(self, what: str) -> str:
        return f"slipstream://{what}/{self.name}" if self.in_ids else f"slipstream://{what}"

    @property
    def tag(self) -> str:
        """The DAG tag that groups the data set's DAGs in the UI."""
        return f"dataset:{self.name}"

    def settings(self, base: Settings | None = None) -> Settings:
        """The deployment's settings for this data set (its namespace, topics, raw zone, registry)."""
        return (base or Settings.from_env()).for_dataset(self.spec)


def dataset_refs(env: Mapping[str, str] | None = None) -> tuple[DatasetRef, ...]:
    """The deployment's data sets, cheaply enough for DAG parsing: the spec files of
    SLIPSTREAM_SPECS_DIR (sorted; names starting with `.` or `_` skipped), else SLIPSTREAM_SPEC's."""
    env = os.environ if env is None else env
    folder = env.get("SLIPSTREAM_SPECS_DIR", "")
    if not folder:
        spec = env.get("SLIPSTREAM_SPEC") or DEFAULT_SPEC
        return (DatasetRef(dataset_name(spec), spec),)
    path = Path(folder)
    if not path.is_dir():
        raise DatasetMismatch(f"SLIPSTREAM_SPECS_DIR={folder} is not a folder: point it at a folder of spec files "
                              "(one data set per file), or unset it for the one data set of SLIPSTREAM_SPEC")
    files = sorted(p for p in path.iterdir()
                   if p.suffix in SPEC_SUFFIXES and p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise DatasetMismatch(f"SLIPSTREAM_SPECS_DIR={folder} holds no spec file (*.yaml): add one per data set")
    refs = tuple(DatasetRef(dataset_name(str(p)), str(p), in_ids=True) for p in files)
    names = [r.name for r in refs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DatasetMismatch(f"SLIPSTREAM_SPECS_DIR={folder}: two spec files name data set(s) {', '.join(twice)} "
                              "(a .yaml and a .yml?): keep one file per data set")
    return refs


def spec_label(spec: Spec) -> str:
    return f"{spec.name} v{spec.version} {spec.digest}"


def check_raw_zone(settings: Settings, spec: Spec) -> None:
    """Refuse a raw zone that holds another data set's sources: its folders (names starting with
    `_` or `.` aside) must include a source of the spec. An empty or missing zone passes (nothing
    landed yet: the sensor waits)."""
    from pyarrow import fs as pafs

    from slipstream.lake.raw_zone import filesystem

    fs, root = filesystem(settings.raw_dir, settings.s3_io_properties())
    infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    have = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and not i.base_name.startswith(("_", ".")))
    wanted = sorted(s.name for s in spec.sources)
    if not have or set(have) & set(wanted):
        return
    raise DatasetMismatch(
        f"spec {spec.name} (data set {settings.dataset}) does not match the raw zone {settings.raw_dir}: it holds "
        f"{', '.join(h + '/' for h in have)} but the spec reads {', '.join(w + '/' for w in wanted)}; point "
        f"{_override(settings, 'raw_dir')} at this data set's raw zone"
    )


def _override(settings: Settings, field: str) -> str:
    return f"SLIPSTREAM_DATASET__{settings.dataset.upper().replace('-', '_')}__{field.upper()}"


def check_table(table: Table, settings: Settings, spec: Spec) -> None:
    """Refuse a table that holds another data set: its `slipstream.dataset` property names another,
    or (a table from before the property) it has fewer than half of the spec's features (a spec
    that added a feature or two is the same data set, evolving; one that shares only ids is not)."""
    ident = ".".join(table.name())
    owner = table.properties.get(DATASET_PROPERTY)
    fix = f"give this data set its own namespace ({_override(settings, 'namespace')}), or run the table's own spec"
    if owner and owner != settings.dataset:
        raise DatasetMismatch(
            f"spec {spec.name} (data set {settings.dataset}) does not match table {ident}: it holds data set {owner} "
            f"(spec {table.properties.get(SPEC_PROPERTY, '?')}); {fix}")
    if owner:
        return
    columns = {f.name for f in table.schema().fields} - BASE_COLUMNS
    features = {f.name for f in spec.features}
    if columns and 2 * len(columns & features) < len(features):
        missing = sorted(features - columns)
        shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        raise DatasetMismatch(
            f"spec {spec.name} (data set {settings.dataset}) does not match table {ident}: it has "
            f"{len(columns & features)} of the spec's {len(features)} features (not {shown}); {fix}")


def open_dataset_table(settings: Settings, spec: Spec) -> Table:
    """The data set's `samples` table (created from the spec when missing, evolved by it when the
    spec added features), once `check_table` passed; the table is marked as the data set's."""
    from pyiceberg.exceptions import CommitFailedException

    from slipstream.lake.iceberg import get_catalog, samples_table

    catalog = get_catalog(settings)
    if catalog.table_exists(settings.table):
        check_table(catalog.load_table(settings.table), settings, spec)
    table = samples_table(catalog, settings.namespace, spec)
    marks = {DATASET_PROPERTY: settings.dataset, SPEC_PROPERTY: spec_label(spec)}
    if any(table.properties.get(k) != v for k, v in marks.items()):
        try:
            with table.transaction() as tx:
                tx.set_properties(marks)
        except CommitFailedException:  # another run of the data set marked it at the same moment
            log.info("table %s was marked concurrently", settings.table)
        table = table.refresh()
        check_table(table, settings, spec)
    return table


def deployment_datasets(settings: Settings) -> list[Settings]:
    """The settings of every data set of the deployment: `settings`' own, then each of its specs
    folder's (SLIPSTREAM_SPECS_DIR), each once."""
    out = {settings.dataset: settings}
    if settings.specs_dir:
        for ref in dataset_refs({"SLIPSTREAM_SPECS_DIR": settings.specs_dir}):
            out.setdefault(ref.name, settings.for_dataset(ref.spec))
    return list(out.values())
