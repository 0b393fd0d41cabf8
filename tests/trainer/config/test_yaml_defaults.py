"""The YAML tree and the config dataclasses hold the same keys and the same defaults (one home per default).

The only exceptions are upstream's own class/YAML splits of a "not configured" sentinel, mirrored as upstream has
them and listed in tests/upstream_config_defaults.py (YAML_SPLIT_LEAVES; optional sub-configs such as
AlgoConfig.pf_ppo are None in the class and written out with their class's defaults in the YAML)."""

import ast
import dataclasses
import re
import typing
from pathlib import Path

from omegaconf import OmegaConf

import verl
from verl.base_config import BaseConfig, field_default
from verl.trainer.config.legacy_reward import LEGACY_REWARD_KEYS, LEGACY_SECTIONS, migrate_legacy_reward_impl
from verl.trainer.config.ppo_trainer import PPOTrainerConfig
from verl.utils.config import _import_target, omega_conf_to_dataclass
from verl.workers.config import FSDPEngineConfig

PACKAGE = Path(verl.__file__).parent
CONFIG_DIR = PACKAGE / "trainer" / "config"


def _optional_config_class(cls, name):
    """The config class of a field annotated ``Optional[SomeConfig]`` (None for any other field)."""
    hint = typing.get_type_hints(cls).get(name)
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(options) == 1 and isinstance(options[0], type) and issubclass(options[0], BaseConfig):
        return options[0]
    return None


def _subtree(owner_cls, name, value):
    """A field's default as a tree: nested configs recurse; an optional sub-config that is None by default
    (upstream's "not given", e.g. AlgoConfig.pf_ppo) is written out in the YAML with its class's defaults, so its
    YAML leaves are compared with that class's defaults."""
    if isinstance(value, BaseConfig):
        return _default_tree_of_instance(value)
    optional = _optional_config_class(owner_cls, name) if value is None else None
    return _default_tree(optional) if optional is not None else value


def _default_tree(cls):
    """{field: default} of `cls` without running any parent's __post_init__ links (nested configs recurse)."""
    return {
        f.name: _subtree(cls, f.name, field_default(cls, f.name))
        for f in dataclasses.fields(cls)
        if f.name != "_target_"
    }


def _default_tree_of_instance(obj):
    return {
        f.name: _subtree(type(obj), f.name, getattr(obj, f.name))
        for f in dataclasses.fields(obj)
        if f.name != "_target_"
    }


def _without_targets(node):
    if isinstance(node, dict):
        return {k: _without_targets(v) for k, v in node.items() if k != "_target_"}
    return node


def _leaves(tree, prefix=""):
    """Dotted key -> leaf value; a dict-typed field (engine_kwargs, override_config) is one leaf."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and not _is_free_dict(path):
            out.update(_leaves(value, path))
        else:
            out[path] = value
    return out


# Fields typed as free-form dicts: their content is a value, not a subtree of config keys.
_FREE_DICTS = {
    "override_config",
    "engine_kwargs",
    "wrap_policy",
    "ray_init",
    "reward_kwargs",
    "mbridge_config",
    "apply_chat_template_kwargs",
    "mixed_precision",
}


def _is_free_dict(path):
    return path.rsplit(".", 1)[-1] in _FREE_DICTS


def _composed_tree(compose_config):
    cfg = compose_config()
    legacy = {s: OmegaConf.to_container(cfg[s], resolve=True) for s in LEGACY_SECTIONS}
    tree = OmegaConf.to_container(migrate_legacy_reward_impl(cfg), resolve=True, throw_on_missing=False)
    return tree, legacy


def test_yaml_keys_equal_dataclass_fields(compose_config):
    """Every YAML key is a dataclass field and every dataclass field is a YAML key (no default lives in one only)."""
    tree, _ = _composed_tree(compose_config)
    yaml_keys = set(_leaves(_without_targets(tree)))
    dataclass_keys = set(_leaves(_default_tree(PPOTrainerConfig)))
    assert sorted(yaml_keys - dataclass_keys) == []
    assert sorted(dataclass_keys - yaml_keys) == []


# Leaves the dataclasses derive in __post_init__ from another key, so the default instance differs from the YAML:
# each engine's strategy is null in YAML ("follow the role") and filled from the role's strategy when built.
_DERIVED_LEAVES = {
    "actor_rollout_ref.actor.fsdp_config.strategy": None,
    "actor_rollout_ref.ref.fsdp_config.strategy": None,
    "critic.model.fsdp_config.strategy": None,
}


def test_yaml_defaults_equal_dataclass_defaults(compose_config, upstream_defaults):
    """Each resolved YAML leaf equals the default of its dataclass field (YAML 1 == dataclass 1.0 is ok).

    The defaults are read from PPOTrainerConfig(), i.e. after __post_init__; the only leaves that differ are
    the derived ones listed in _DERIVED_LEAVES, whose YAML value is pinned there and whose class default is
    checked to be the same null.
    """
    tree, _ = _composed_tree(compose_config)
    yaml_leaves = _leaves(_without_targets(tree))
    defaults = _leaves(_default_tree(PPOTrainerConfig))
    mismatches = {
        k: (yaml_leaves[k], defaults[k])
        for k in yaml_leaves
        if yaml_leaves[k] != defaults.get(k)
        and k not in _DERIVED_LEAVES
        and k not in upstream_defaults.YAML_SPLIT_LEAVES
    }
    assert mismatches == {}
    for (
        key,
        yaml_value,
    ) in upstream_defaults.YAML_SPLIT_LEAVES.items():  # upstream's own class/YAML split, mirrored as upstream has it
        assert (yaml_leaves[key], defaults[key]) == (yaml_value, None), key
    for key, yaml_value in _DERIVED_LEAVES.items():
        assert yaml_leaves[key] == yaml_value == FSDPEngineConfig().strategy, key
        assert defaults[key] == "fsdp"  # derived from actor_rollout_ref.actor.strategy (default fsdp)


def test_built_from_yaml_equals_built_from_defaults(compose_config, upstream_defaults):
    """Converting the composed YAML gives exactly PPOTrainerConfig() (so __post_init__ links agree too), up to
    upstream's "not configured" sentinels: the YAML side of each split leaf, and AlgoConfig.pf_ppo written out."""
    cfg = compose_config()
    built = omega_conf_to_dataclass(migrate_legacy_reward_impl(cfg), PPOTrainerConfig)
    assert built == upstream_defaults.with_yaml_side(PPOTrainerConfig())
    assert built != PPOTrainerConfig()  # the sentinels really differ (the class side is upstream's None)


def test_every_target_names_the_dataclass_of_its_node(compose_config):
    """A node's `_target_` is the class its parent field is annotated with, or a subclass of it."""
    import typing

    def walk(node, cls, path):
        target = node.get("_target_")
        if target:
            resolved = _import_target(target, path)
            assert issubclass(resolved, cls), f"{path}._target_ {target} is not a {cls.__name__}"
            cls = resolved
        hints = typing.get_type_hints(cls)
        for key, value in node.items():
            if isinstance(value, dict) and dataclasses.is_dataclass(hints.get(key)):
                walk(value, hints[key], f"{path}.{key}" if path else key)

    tree, _ = _composed_tree(compose_config)
    walk(tree, PPOTrainerConfig, "")


def test_legacy_placeholders_are_null_and_all_mapped(compose_config):
    """The legacy reward sections are all-null placeholders, and each key has a migration entry or is rejected."""
    _, legacy = _composed_tree(compose_config)

    def leaves(node, prefix):
        for key, value in node.items():
            path = f"{prefix}.{key}"
            if isinstance(value, dict):
                yield from leaves(value, path)
            else:
                yield path, value

    for section, node in legacy.items():
        for path, value in leaves(node, section):
            assert value is None, path
            mapped_or_rejected = (
                path in LEGACY_REWARD_KEYS
                or path.startswith("reward_model.rollout.")
                or path
                in (
                    "reward_model.model.external_lib",
                    "reward_model.model.trust_remote_code",
                )
            )
            assert mapped_or_rejected, path


def _field_docs_missing(path):
    """Dataclass fields in `path` that are not followed by a docstring (the field documentation rule)."""
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if "ClassVar" in ast.unparse(stmt.annotation) or node.name.startswith("_"):
                    continue
                nxt = body[i + 1] if i + 1 < len(body) else None
                documented = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                if not documented and node.name != "PPOBatchConfig":
                    missing.append(f"{path.name}:{node.name}.{stmt.target.id}")
    return missing


def test_every_config_field_is_documented():
    """Each field of every config dataclass has a docstring right after it."""
    files = sorted((PACKAGE / "workers" / "config").glob("*.py")) + sorted(CONFIG_DIR.glob("*.py"))
    missing = [m for f in files for m in _field_docs_missing(f)]
    assert missing == []


_KEY_LINE = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):")


def test_every_yaml_key_has_a_comment_above():
    """YAML style of upstream: a comment line directly above every key of the ppo_trainer tree."""
    undocumented = []
    for path in sorted(CONFIG_DIR.rglob("*.yaml")):
        lines = path.read_text().splitlines()
        if "  - ppo_trainer" in lines or "  - quickstart_cpu" in lines:
            continue  # an overlay of ppo_trainer (the quickstart configs), not part of the tree
        for i, line in enumerate(lines):
            if _KEY_LINE.match(line) and line.strip() != "defaults:":
                previous = lines[i - 1].strip() if i else ""
                if not previous.startswith("#"):
                    undocumented.append(f"{path.relative_to(CONFIG_DIR)}:{i + 1}: {line.strip()}")
    assert undocumented == []


ALLOWED_KEYS_FILE = Path(__file__).parent / "allowed_keys.txt"


def test_config_surface_is_the_reviewed_list(compose_config):
    """Every key of the composed tree (legacy placeholders included) is listed in allowed_keys.txt and vice versa,
    so a new knob or a dropped upstream key is a reviewed decision. After an intended change regenerate with
    `cd tests/trainer/config && python -c "import test_yaml_defaults as t; t.write_allowed_keys()"`."""
    assert _surface(compose_config) == ALLOWED_KEYS_FILE.read_text().split()


def _surface(compose_config):
    tree, legacy = _composed_tree(compose_config)
    keys = set(_leaves(tree)) | {f"{s}.{k}" for s, node in legacy.items() for k in _leaves(node)}
    return sorted(keys)


def write_allowed_keys():  # pragma: no cover - maintenance helper
    """Rewrite allowed_keys.txt from the current tree (run by hand after a reviewed key change)."""
    from conftest import compose_ppo

    ALLOWED_KEYS_FILE.write_text("\n".join(_surface(compose_ppo)) + "\n")
