"""The embedded Postgres: settings written before it starts take effect."""

import tempfile
from pathlib import Path

import psycopg
import pytest

from dwsearch.db.embedded import start_embedded


def test_settings_apply_to_the_embedded_server():
    data_dir = Path(tempfile.mkdtemp(prefix="dwsearch-test-settings-"))
    data_dir.chmod(0o755)  # as root the server runs as `pgserver` and must reach the dir
    url = start_embedded(data_dir, delete_on_exit=True, settings={"work_mem": "7MB", "application_name": "it's"})
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW work_mem").fetchone() == ("7MB",)
    conf = (data_dir / "pg" / "postgresql.conf").read_text()
    assert conf.count("include_if_exists = 'dwsearch.conf'") == 1


@pytest.mark.parametrize("name", ["work_mem = 1; x", "", "shared buffers"])
def test_a_bad_setting_name_is_refused(tmp_path, name):
    from dwsearch.db.embedded import _write_settings

    (tmp_path / "postgresql.conf").write_text("")
    with pytest.raises(ValueError, match="setting name"):
        _write_settings(tmp_path, {name: "1"})
