"""The README's configuration table documents every setting the code reads."""

import dataclasses
from pathlib import Path

from dwsearch.common import config

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
CONFIGS = [
    config.ServerConfig,
    config.EmbedderConfig,
    config.RerankerConfig,
    config.ClientConfig,
    config.ModelCheckConfig,
    config.MigrateConfig,
    config.StackConfig,
]


def test_every_setting_is_documented():
    names = {config.env_name(f.name) for cls in CONFIGS for f in dataclasses.fields(cls)}
    undocumented = sorted(n for n in names if f"`{n}`" not in README)
    assert undocumented == []


def test_quickstart_is_the_two_make_commands():
    quickstart = README.split("## Quickstart", 1)[1].split("##", 1)[0]
    assert "make demo" in quickstart and "make test" in quickstart
