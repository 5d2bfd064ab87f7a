"""Sweep configurations (docs/design/sweeps.md#sweeps): YAML/JSON parsing, normalisation, and 400s that name the
field."""

import pytest

from mado.errors import ValidationFailed
from sweeps.config import grid_size, sweep_config_parse
from tests.sweeps.sweep_helpers import GRID, RANDOM

YAML = """
name: digits-lr
method: bayes
metric: {name: val_loss}
parameters:
  lr: {min: 1e-4, max: 1e-1, distribution: log_uniform_values}
  hidden: {min: 16, max: 128}
  dropout: {min: 0, max: 0.5, distribution: uniform}
  optimizer: {values: [adam, sgd]}
  epochs: {value: 5}
program: python examples/sweep_training.py --data "my dir"
run_cap: 12
"""


def test_a_yaml_config_is_normalised():
    config = sweep_config_parse(config=YAML)
    assert (config.name, config.method, config.metric_name, config.metric_goal) == (
        "digits-lr",
        "bayes",
        "val_loss",
        "minimize",
    )
    assert config.parameters == {
        "lr": {"min": 0.0001, "max": 0.1, "distribution": "log_uniform_values"},
        "hidden": {"min": 16, "max": 128, "distribution": "int_uniform"},
        "dropout": {"min": 0, "max": 0.5, "distribution": "uniform"},
        "optimizer": {"values": ["adam", "sgd"]},
        "epochs": {"value": 5},
    }
    assert config.program == ["python", "examples/sweep_training.py", "--data", "my dir"]
    assert config.run_cap == 12
    assert config.config["run_cap"] == 12


def test_json_text_and_a_dict_give_the_same_config():
    import json

    assert sweep_config_parse(config=json.dumps(GRID)) == sweep_config_parse(config=GRID)


def test_a_grid_run_cap_defaults_to_and_is_capped_by_the_grid_size():
    assert grid_size(sweep_config_parse(config=GRID).parameters) == 4
    assert sweep_config_parse(config=GRID).run_cap == 4
    assert sweep_config_parse(config={**GRID, "run_cap": 100}).run_cap == 4
    assert sweep_config_parse(config={**GRID, "run_cap": 3}).run_cap == 3


def test_random_without_run_cap_has_no_limit():
    assert sweep_config_parse(config=RANDOM).run_cap is None


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"parameters": {}}, "parameters", "non-empty"),
        ({"parameters": None}, "parameters", "non-empty"),
        ({"method": "hyperband"}, "method", "grid, random, bayes"),
        ({"method": None}, "method", "grid, random, bayes"),
        ({"metric": None}, "metric", "name and goal"),
        ({"metric": {"goal": "minimize"}}, "metric.name", "metric.name"),
        ({"metric": {"name": "loss", "goal": "lowest"}}, "metric.goal", "minimize, maximize"),
        ({"program": ""}, "program", "command"),
        ({"program": ["python", ""]}, "program", "non-empty strings"),
        ({"program": 'python "train.py'}, "program", "cannot be split"),
        ({"program": None}, "program", "command line"),
        ({"run_cap": 0}, "run_cap", ">= 1"),
        ({"run_cap": "3"}, "run_cap", ">= 1"),
        ({"run_cap": True}, "run_cap", ">= 1"),
        ({"parameters": {"lr": {"values": []}}}, "parameters.lr.values", "non-empty list"),
        ({"parameters": {"lr": {"values": [0.1, 0.1]}}}, "parameters.lr.values", "repeat"),
        ({"parameters": {"lr": {"values": [{"a": 1}]}}}, "parameters.lr.values", "string, number"),
        ({"parameters": {"lr": {"min": 0.1, "max": 1}}}, "parameters.lr", "grid sweep needs values"),
        ({"parameters": {"lr": 0.1}}, "parameters.lr", "mapping"),
        ({"parameters": {"lr": {"values": [1], "value": 1}}}, "parameters.lr", "exactly one"),
        ({"parameters": {"lr": {"values": [1], "step": 2}}}, "parameters.lr.step", "unknown key"),
        ({"parameters": {"--lr": {"values": [1]}}}, "parameters.--lr", "parameter name"),
        ({"paramters": {"lr": {"values": [1]}}}, "paramters", "unknown key"),
    ],
)
def test_a_bad_grid_config_names_the_field(changes, field, words):
    with pytest.raises(ValidationFailed) as caught:
        sweep_config_parse(config={**GRID, **changes})
    assert caught.value.field == field
    assert words in caught.value.detail


@pytest.mark.parametrize(
    ("parameter", "field", "words"),
    [
        ({"min": 1, "max": 1}, "parameters.p.max", "greater than min"),
        ({"min": "a", "max": 2}, "parameters.p", "finite numbers"),
        ({"min": 0, "max": 1, "distribution": "log_uniform_values"}, "parameters.p.min", "min > 0"),
        ({"min": 0.5, "max": 2, "distribution": "int_uniform"}, "parameters.p.distribution", "integer"),
        ({"min": 0, "max": 2, "distribution": "normal"}, "parameters.p.distribution", "uniform, int_uniform"),
    ],
)
def test_a_bad_range_names_the_parameter(parameter, field, words):
    with pytest.raises(ValidationFailed) as caught:
        sweep_config_parse(config={**RANDOM, "parameters": {"p": parameter}})
    assert (caught.value.field, words in caught.value.detail) == (field, True)


@pytest.mark.parametrize("text", ["method: [grid", "just text", "- a list", "method: grid\ndescription: 2024-01-01"])
def test_unreadable_yaml_names_the_config(text):
    with pytest.raises(ValidationFailed) as caught:
        sweep_config_parse(config=text)
    assert caught.value.field == "config"


def test_w_and_b_description_project_and_entity_keys_are_accepted():
    config = sweep_config_parse(config={**GRID, "description": "lr scan", "project": "vision", "entity": "me"})
    assert config.config["description"] == "lr scan"
