"""verl.utils.py_functional: dict helpers, DynamicEnum (incl. pickling by name) and temp_env_var."""

import os
import pickle

import numpy as np
import pytest

from verl.utils.py_functional import (
    DynamicEnum,
    append_to_dict,
    convert_to_regular_types,
    flatten,
    list_of_dict_to_dict_of_list,
    rename_dict,
    temp_env_var,
    union_two_dict,
)


class Color(DynamicEnum):
    _registry = {}
    _next_value = 0


Color.register("red")
Color.register("green")


def test_union_two_dict_merges_and_rejects_conflicts():
    """Equal shared values merge (arrays compared elementwise); a conflict raises ValueError naming the key."""
    merged = union_two_dict({"a": 1, "arr": np.array([1, 2])}, {"b": 2, "arr": np.array([1, 2])})
    assert sorted(merged) == ["a", "arr", "b"]
    with pytest.raises(ValueError, match="'a'"):
        union_two_dict({"a": 1}, {"a": 2})
    with pytest.raises(ValueError, match="'arr'"):
        union_two_dict({"arr": np.array([1, 2])}, {"arr": np.array([1, 2, 3])})


def test_append_to_dict_and_list_of_dict_to_dict_of_list():
    """append_to_dict builds lists per key; list_of_dict_to_dict_of_list transposes and checks keys."""
    data = {}
    append_to_dict(data, {"loss": 1.0})
    append_to_dict(data, {"loss": 2.0, "acc": 0.5})
    assert data == {"loss": [1.0, 2.0], "acc": [0.5]}
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    assert list_of_dict_to_dict_of_list([]) == {}
    with pytest.raises(ValueError, match="element 1.*extra: \\['c'\\].*missing: \\['b'\\]"):
        list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "c": 4}])


def test_small_helpers():
    """rename_dict prefixes keys; flatten concatenates; convert_to_regular_types unwraps OmegaConf containers."""
    from omegaconf import OmegaConf

    assert rename_dict({"a": 1}, "val/") == {"val/a": 1}
    assert flatten([[1, 2], [3]]) == [1, 2, 3]
    cfg = OmegaConf.create({"a": [1, {"b": 2}], "c": (3,)})
    out = convert_to_regular_types(cfg)
    assert out == {"a": [1, {"b": 2}], "c": [3]}
    assert type(out) is dict and type(out["a"]) is list


def test_dynamic_enum_registry_and_pickle_identity():
    """Members are reachable by attribute, name and iteration; pickling returns the identical member;
    registering a name twice raises ValueError."""
    assert Color.RED.value == 0 and Color.GREEN.value == 1
    assert Color["green"] is Color.GREEN and Color.from_name("Red") is Color.RED
    assert "RED" in Color and Color.RED in Color and list(Color) == [Color.RED, Color.GREEN]
    assert Color.names() == ["RED", "GREEN"]
    assert pickle.loads(pickle.dumps(Color.GREEN)) is Color.GREEN
    with pytest.raises(ValueError, match="already registered"):
        Color.register("red")
    blue = Color.register("blue")
    assert Color.remove("blue") is blue and Color.from_name("blue") is None


def test_temp_env_var_restores_previous_state(monkeypatch):
    """The variable is set inside the block and restored (or removed) afterwards, even on error."""
    monkeypatch.delenv("VERL_TEST_TMP", raising=False)
    with temp_env_var("VERL_TEST_TMP", "1"):
        assert os.environ["VERL_TEST_TMP"] == "1"
    assert "VERL_TEST_TMP" not in os.environ
    monkeypatch.setenv("VERL_TEST_TMP", "old")
    with pytest.raises(RuntimeError), temp_env_var("VERL_TEST_TMP", "new"):
        raise RuntimeError
    assert os.environ["VERL_TEST_TMP"] == "old"
