"""The embedded Postgres: settings written before it starts take effect."""

import tempfile
from pathlib import Path

import psycopg
import pytest

from dwsearch.db.embedded import start_embedded


def test_settings_apply_to_the_embedded_server():
    data_dir = Path(tempfile.mkdtemp(prefix="dwsearch-test-settings-"))
    data_dir.chmod(0o755)  # as root the server runs as `pgserver` and must reach the dir
    name = "dw\\search's"  # a backslash and a quote survive postgresql.conf's quoting
    url = start_embedded(data_dir, delete_on_exit=True, settings={"work_mem": "7MB", "cluster_name": name})
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW work_mem").fetchone() == ("7MB",)
        assert conn.execute("SHOW cluster_name").fetchone() == (name,)
    # Joining the running server again changes nothing and returns the same server.
    assert start_embedded(data_dir, delete_on_exit=True, settings={"work_mem": "9MB"}) == url
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW work_mem").fetchone() == ("7MB",)
    conf = (data_dir / "pg" / "postgresql.conf").read_text()
    assert conf.count("include_if_exists = 'dwsearch.conf'") == 1


def test_setting_values_are_quoted_for_postgresql_conf(tmp_path):
    from dwsearch.db.embedded import write_settings

    conf = tmp_path / "postgresql.conf"
    conf.write_text("")
    write_settings(tmp_path, {"application_name": "it's a \\ path\\"})
    write_settings(tmp_path, {"application_name": "x"})  # the include line is written once
    assert (tmp_path / "dwsearch.conf").read_text() == "application_name = 'x'\n"
    write_settings(tmp_path, {"application_name": "it's a \\ path\\"})
    assert (tmp_path / "dwsearch.conf").read_text() == "application_name = 'it''s a \\\\ path\\\\'\n"
    assert conf.read_text().count("include_if_exists") == 1
    with pytest.raises(ValueError, match="span lines"):
        write_settings(tmp_path, {"application_name": "x'\nfsync = off\n#"})


@pytest.mark.parametrize("name", ["work_mem = 1; x", "", "shared buffers"])
def test_a_bad_setting_name_is_refused(tmp_path, name):
    from dwsearch.db.embedded import write_settings

    (tmp_path / "postgresql.conf").write_text("")
    with pytest.raises(ValueError, match="setting name"):
        write_settings(tmp_path, {name: "1"})
