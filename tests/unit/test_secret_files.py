"""Files that hold secrets are owner-only from their first byte (issue 23, item 14): no moment in
which a key sits in a file with the default permissions, as `write_text` then `chmod` left."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from slipstream.settings import Settings, write_settings_file


@pytest.fixture
def modes_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The permission bits of every file under tmp_path at each moment it could be read: before any
    chmod is applied to it, and right after a rename puts it in place."""
    seen: list[tuple[str, int]] = []
    real_chmod, real_replace = Path.chmod, os.replace

    def chmod(self: Path, mode: int, **kw: Any) -> None:
        if self.exists() and tmp_path in self.parents:
            seen.append((self.name, stat.S_IMODE(self.stat().st_mode)))
        real_chmod(self, mode, **kw)

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        real_replace(src, dst, **kw)
        if tmp_path in Path(dst).parents:
            seen.append((Path(dst).name, stat.S_IMODE(os.stat(dst).st_mode)))

    monkeypatch.setattr(Path, "chmod", chmod)
    monkeypatch.setattr(os, "replace", replace)
    old_umask = os.umask(0o022)  # the usual default: new files 0644
    yield seen
    os.umask(old_umask)


def _owner_only(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_ui_secrets_and_passwords_are_never_readable_by_others(tmp_path: Path, modes_seen: list) -> None:  # type: ignore[type-arg]
    from slipstream.dev import ui

    home = Path(ui.airflow_env(Settings(home=tmp_path))["AIRFLOW_HOME"])
    env = ui.ui_env(Settings(home=tmp_path), 8099, "pw-1")
    written = [home / ".jwt_secret", home / ".api_secret_key", Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])]
    for path in written:
        assert path.exists() and _owner_only(path), path
    assert modes_seen and all(mode & 0o077 == 0 for _, mode in modes_seen), modes_seen


def test_settings_and_s3_keys_are_owner_only(tmp_path: Path, modes_seen: list) -> None:  # type: ignore[type-arg]
    from slipstream.dev.s3server import S3Server

    path = write_settings_file(tmp_path, {"SLIPSTREAM_S3_SECRET_ACCESS_KEY": "k"})
    server = S3Server(tmp_path)
    server._credentials()
    for p in (path, server.config_path):
        assert _owner_only(p), p
    assert all(mode & 0o077 == 0 for _, mode in modes_seen), modes_seen
