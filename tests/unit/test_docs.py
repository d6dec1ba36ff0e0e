"""README's variable table is the generated one: defaults live only in sparkfleet/config.py."""

from pathlib import Path

from sparkfleet.config import GatewayConfig, SparkConfig
from sparkfleet.docs import variables_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_table_is_current() -> None:
    assert variables_table() in README.read_text(), "run `python -m sparkfleet vars` and paste it into README"


def test_every_variable_has_a_description_and_example() -> None:
    for name, field in {**SparkConfig.model_fields, **GatewayConfig.model_fields}.items():
        assert field.description and field.examples, name
