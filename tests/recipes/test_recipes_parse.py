"""The Qwen3.5 launch recipes (recipes/qwen3_5/*.sh) are valid bash and launch configs that main_ppo accepts.

Each recipe keeps its Hydra overrides in one delimited block (`# >>> hydra overrides` ... `# <<< hydra overrides`,
an `OVERRIDES=( ... )` array, one override per line). The tests read that block statically (every key must exist
in the composed ppo_trainer tree), run the script with VERL_PRINT_OVERRIDES=1 to get the expanded overrides
exactly as they would be launched, compose them with Hydra and run the same driver-side validation main_ppo runs
before Ray starts. Nothing here needs an accelerator, CANN or Ray.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
RECIPE_DIR = REPO / "recipes" / "qwen3_5"
CONFIG_DIR = REPO / "verl" / "trainer" / "config"
RECIPES = sorted(RECIPE_DIR.glob("run_*.sh"))
BLOCK_START, BLOCK_END = "# >>> hydra overrides", "# <<< hydra overrides"

# Recipes for a backend whose config group the tree does not provide yet (none now: model_engine=veomni composes).
# strict: once the group exists the xfail turns into a failure, and the entry must be removed so the recipe is
# checked like the others.
PENDING_CONFIG: dict[str, str] = {}
# (script, extra environment) pairs whose expanded config is validated; the long-sequence recipe has two profiles.
LAUNCH_CASES = [(p, {}) for p in RECIPES] + [
    (RECIPE_DIR / "run_qwen3_5_35b_a3b_grpo_longseq.sh", {"SEQ_PROFILE": "128k"}),
]


def _param(script: Path, env: dict[str, str] | None = None):
    """A pytest param for `script` (plus `env` when given), strict-xfail while its config group is pending."""
    reason = PENDING_CONFIG.get(script.name)
    marks = pytest.mark.xfail(reason=reason, strict=True) if reason else ()
    label = script.name + "".join(f"[{k}={v}]" for k, v in (env or {}).items())
    return pytest.param(script if env is None else (script, env), id=label, marks=marks)


# ---- parsing --------------------------------------------------------------------------------------------------


def extract_override_block(text: str, source: str = "<recipe>") -> list[str]:
    """The raw overrides of the `OVERRIDES=( ... )` array between the block markers, one per non-comment line.

    Values keep their unexpanded `${VAR}` references. A line with more than one shell word is an error, so every
    override stays on its own line where the test (and a reader) can find it.
    """
    lines = text.splitlines()
    if lines.count(BLOCK_START) != 1 or lines.count(BLOCK_END) != 1:
        raise ValueError(f"{source}: needs exactly one '{BLOCK_START}' and one '{BLOCK_END}' line")
    body = lines[lines.index(BLOCK_START) + 1 : lines.index(BLOCK_END)]
    if not body or body[0].strip() != "OVERRIDES=(" or body[-1].strip() != ")":
        raise ValueError(f"{source}: the block must be an `OVERRIDES=(` ... `)` array")
    overrides = []
    for number, line in enumerate(body[1:-1], start=lines.index(BLOCK_START) + 3):
        words = shlex.split(line, comments=True)
        if len(words) > 1:
            raise ValueError(f"{source}:{number}: one override per line, got {words}")
        overrides += words
    return overrides


def split_override(override: str) -> tuple[str, str]:
    """`+a.b=1` -> ("+", "a.b"); `~a.b` -> ("~", "a.b"); `a.b=x=y` -> ("", "a.b")."""
    prefix = next((p for p in ("++", "+", "~") if override.startswith(p)), "")
    return prefix, override[len(prefix) :].split("=", 1)[0]


def is_group_override(key: str) -> bool:
    """`model_engine=veomni` selects a config group (a directory of the config tree), not a value."""
    return "." not in key and "@" not in key and (CONFIG_DIR / key).is_dir()


def key_problem(tree: dict, override: str) -> str | None:
    """Why `override` would not apply to the plain config `tree`, or None when it applies.

    Plain and `~` overrides need the key; `+` needs the key absent and its parent a mapping; `++` either.
    """
    prefix, key = split_override(override)
    *parents, leaf = key.split(".")
    node = tree
    for depth, part in enumerate(parents):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parents[:depth]) or "<root>"
            return f"{override}: no key {part!r} under {where}"
        node = node[part]
    if not isinstance(node, dict):
        return f"{override}: {'.'.join(parents)} is a value, not a mapping"
    if prefix == "+" and leaf in node:
        return f"{override}: {key} already exists; drop the '+'"
    if prefix in ("", "~") and leaf not in node:
        return f"{override}: no key {leaf!r} under {'.'.join(parents) or '<root>'}"
    return None


# ---- helpers ---------------------------------------------------------------------------------------------------


def compose_tree(overrides: list[str], config_name: str = "ppo_trainer"):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def printed_overrides(script: Path, home: Path, **env: str) -> list[str]:
    """The overrides the recipe would launch (VERL_PRINT_OVERRIDES=1), with HOME pointing at `home`."""
    # a clean environment: recipe defaults must not depend on what the test runner happens to export
    run_env = {"PATH": os.environ["PATH"], "HOME": str(home), "VERL_PRINT_OVERRIDES": "1", **env}
    done = subprocess.run(["bash", str(script)], env=run_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{script.name} failed in print mode:\n{done.stderr}"
    return done.stdout.splitlines()


def validate_like_main_ppo(config) -> None:
    """main_ppo.prepare_config without the device check (trainer.device=npu cannot be resolved on this machine)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


# ---- tests -----------------------------------------------------------------------------------------------------


def test_recipes_found():
    """The recipe set the docs promise exists: FSDP1, FSDP2, engine workers, VeOmni, long sequences, CPU smoke."""
    names = {p.name for p in RECIPES}
    for part in ("fsdp1_aime", "fsdp2_geo3k", "engine_geo3k", "veomni_aime", "longseq", "cpu_smoke", "npu_smoke"):
        assert any(part in n for n in names), f"no recipe named *{part}* in {RECIPE_DIR}"


@pytest.mark.parametrize("script", [*RECIPES, RECIPE_DIR / "common.sh"], ids=lambda p: p.name)
def test_bash_syntax(script: Path):
    """`bash -n` accepts every recipe and the shared helpers."""
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", [_param(p) for p in RECIPES])
def test_block_keys_exist_in_config(script: Path):
    """Every key of the override block exists in ppo_trainer composed with the recipe's config-group choices."""
    overrides = extract_override_block(script.read_text(), script.name)
    groups = [o for o in overrides if is_group_override(split_override(o)[1])]
    tree = OmegaConf.to_container(compose_tree(groups), resolve=False)
    problems = [p for o in overrides if o not in groups and (p := key_problem(tree, o)) is not None]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("script", RECIPES, ids=lambda p: p.name)
def test_block_is_what_is_launched(script: Path, tmp_path: Path):
    """The print-mode overrides are the block's overrides in order (nothing launched from outside the block)."""
    block = [split_override(o) for o in extract_override_block(script.read_text(), script.name)]
    printed = [split_override(o) for o in printed_overrides(script, tmp_path)]
    assert printed == block


@pytest.mark.parametrize("case", [_param(p, env) for p, env in LAUNCH_CASES])
def test_launched_config_validates(case: tuple[Path, dict], tmp_path: Path):
    """The expanded overrides compose (Hydra rejects unknown keys) and pass main_ppo's pre-Ray validation."""
    script, env = case
    config = compose_tree(printed_overrides(script, tmp_path, **env))
    validate_like_main_ppo(config)


def test_engine_recipe_configures_the_same_roles_as_the_fsdp2_recipe(tmp_path: Path):
    """Setting the fsdp_config-level entropy keys (engine recipe) or the role-level ones (FSDP2 recipe) gives equal
    typed actor, ref and rollout configs: the two recipes differ only in the worker path."""
    from verl.utils.config import validate_config

    typed = {}
    for name in ("run_qwen3_5_35b_a3b_grpo_fsdp2_geo3k.sh", "run_qwen3_5_35b_a3b_grpo_engine_geo3k.sh"):
        config = compose_tree(printed_overrides(RECIPE_DIR / name, tmp_path))
        typed[name] = validate_config(config, use_reference_policy=True, use_critic=False).actor_rollout_ref
    legacy, engine = typed.values()
    assert engine.actor.fsdp_config.entropy_from_logits_with_chunking and legacy.actor.entropy_from_logits_with_chunking
    assert (legacy.actor, legacy.ref, legacy.rollout) == (engine.actor, engine.ref, engine.rollout)


@pytest.mark.parametrize("script", [p for p in RECIPES if "cpu_smoke" not in p.name], ids=lambda p: p.name)
def test_ascend_recipes_target_npu_and_read_paths_from_env(script: Path, tmp_path: Path):
    """Ascend recipes launch trainer.device=npu with the vLLM rollout, and take model/data/cluster from env vars."""
    text = script.read_text()
    assert "# Targets:" in text and "Atlas" in text, "the header must state the hardware the recipe targets"
    defaults = dict(o.split("=", 1) for o in printed_overrides(script, tmp_path))
    assert defaults["trainer.device"] == "npu"
    assert defaults["actor_rollout_ref.rollout.name"] == "vllm"
    assert defaults["data.train_files"].startswith(f"{tmp_path}/data/"), "DATA_DIR defaults to $HOME/data"
    env = {"MODEL_PATH": "/models/q", "DATA_DIR": "/d", "NNODES": "4", "NPUS_PER_NODE": "16"}
    custom = dict(o.split("=", 1) for o in printed_overrides(script, tmp_path, **env))
    assert custom["actor_rollout_ref.model.path"] == "/models/q"
    assert custom["data.train_files"].startswith("/d/") and custom["data.val_files"].startswith("/d/")
    assert (custom["trainer.nnodes"], custom["trainer.n_gpus_per_node"]) == ("4", "16")


def test_npu_smoke_fits_one_npu_and_runs_a_few_steps(tmp_path: Path):
    """The Ascend smoke recipe: a small Qwen3.5 on one NPU with FSDP2, GSM8K, a handful of steps ending in a
    checkpoint and a validation, metrics written to a file (for metrics.png)."""
    script = RECIPE_DIR / "run_qwen3_5_2b_grpo_fsdp2_gsm8k_npu_smoke.sh"
    printed = dict(o.split("=", 1) for o in printed_overrides(script, tmp_path))
    assert (printed["trainer.nnodes"], printed["trainer.n_gpus_per_node"]) == ("1", "1")
    assert (
        printed["actor_rollout_ref.actor.strategy"] == "fsdp2"
        and "Qwen3.5-2B" in printed["actor_rollout_ref.model.path"]
    )
    assert printed["data.train_files"].endswith("/gsm8k/train.parquet")
    steps = int(printed["trainer.total_training_steps"])
    assert steps <= 10 and printed["trainer.save_freq"] == printed["trainer.test_freq"] == str(steps)
    assert "file" in printed["trainer.logger"]


def test_cpu_smoke_validates_against_the_quickstart_config(tmp_path: Path):
    """The smoke overrides also validate on top of quickstart_cpu, the config the quickstart actually launches."""
    script = RECIPE_DIR / "run_qwen3_5_tiny_grpo_cpu_smoke.sh"
    config = compose_tree(printed_overrides(script, tmp_path), config_name="quickstart_cpu")
    assert (config.trainer.device, config.actor_rollout_ref.rollout.name) == ("cpu", "hf")
    validate_like_main_ppo(config)


def test_cpu_smoke_targets_cpu_through_quickstart(tmp_path: Path):
    """The smoke recipe runs the quickstart entry on the CPU with the HF rollout, not vLLM."""
    script = RECIPE_DIR / "run_qwen3_5_tiny_grpo_cpu_smoke.sh"
    assert "verl_launch verl.trainer.quickstart" in script.read_text()
    printed = dict(o.split("=", 1) for o in printed_overrides(script, tmp_path))
    assert (printed["trainer.device"], printed["actor_rollout_ref.rollout.name"]) == ("cpu", "hf")


# ---- the checker itself can fail -------------------------------------------------------------------------------

_FAKE_RECIPE = f"""
{BLOCK_START}
OVERRIDES=(
    # a comment line
    actor_rollout_ref.actor.strategy=fsdp2
    "data.train_files=${{DATA_DIR}}/x.parquet"
    actor_rollout_ref.actor.ppo_mini_batchsize=8
    +actor_rollout_ref.rollout.engine_kwargs.vllm.mm_processor_cache_gb=0
    +actor_rollout_ref.actor.strategy=fsdp
    trainer.device.name=npu
)
{BLOCK_END}
"""


def test_checker_reports_bad_keys():
    """A misspelt key, a `+` on an existing key and a key below a value are reported; valid ones are not."""
    overrides = extract_override_block(_FAKE_RECIPE)
    assert overrides[1] == "data.train_files=${DATA_DIR}/x.parquet"  # quotes removed, ${...} kept unexpanded
    tree = OmegaConf.to_container(compose_tree([]), resolve=False)
    problems = {o: key_problem(tree, o) for o in overrides}
    assert problems["actor_rollout_ref.actor.strategy=fsdp2"] is None
    assert problems["data.train_files=${DATA_DIR}/x.parquet"] is None
    assert problems["+actor_rollout_ref.rollout.engine_kwargs.vllm.mm_processor_cache_gb=0"] is None
    assert "no key 'ppo_mini_batchsize'" in problems["actor_rollout_ref.actor.ppo_mini_batchsize=8"]
    assert "already exists" in problems["+actor_rollout_ref.actor.strategy=fsdp"]
    assert "is a value" in problems["trainer.device.name=npu"]


def test_block_parser_rejects_two_overrides_on_a_line():
    """Two shell words on one line would hide an override from a reader; the parser refuses them."""
    text = f"{BLOCK_START}\nOVERRIDES=(\n    a=1 b=2\n)\n{BLOCK_END}\n"
    with pytest.raises(ValueError, match="one override per line"):
        extract_override_block(text)


# ---- the rest of the launch material: image pins and the Ascend guide stay in step ------------------------------

DOCKER_DIR = REPO / "docker"
ASCEND_GUIDE = REPO / "docs" / "ascend.md"


def dockerfile_args(path: Path) -> dict[str, str]:
    """`ARG NAME=value` defaults of a Dockerfile."""
    args = {}
    for line in path.read_text().splitlines():
        words = line.split(maxsplit=1)
        if len(words) == 2 and words[0] == "ARG" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            args[name] = value
    return args


def image_row_pins(path: Path) -> dict[str, str]:
    """`name==version` lines of an image's requirements.in (its own lines, not the files it includes with -r)."""
    pins = {}
    for line in path.read_text().splitlines():
        requirement = line.partition("#")[0].strip()
        if "==" in requirement and not requirement.startswith("-"):
            name, version = requirement.split("==", 1)
            pins[name.strip()] = version.strip()
    return pins


def test_ascend_image_pins_are_the_guide_matrix_row():
    """Every version of the Ascend image's row (requirements.in, the vLLM tag, CANN) is in the guide's matrix and
    in docker/README.md; the vLLM requirements the lock is compiled with are those of the vLLM tag the image builds."""
    pinned = image_row_pins(DOCKER_DIR / "ascend" / "requirements.in")
    assert {"torch", "torch-npu", "vllm-ascend", "transformers"} <= set(pinned)
    args = dockerfile_args(DOCKER_DIR / "ascend" / "Dockerfile")
    pinned["vllm"] = args["VLLM_VERSION"]
    included = (DOCKER_DIR / "ascend" / "requirements.in").read_text()
    assert f"-r vllm-{args['VLLM_VERSION']}-requirements-common.txt" in included
    cann = args["CANN_IMAGE"].rsplit(":", 1)[1].split("-")[0]  # quay.io/ascend/cann:8.5.1-910b-... -> 8.5.1
    guide = ASCEND_GUIDE.read_text()
    matrix = [line for line in guide.splitlines() if line.startswith("| ")]
    readme = (DOCKER_DIR / "README.md").read_text()
    for name, version in [*pinned.items(), ("CANN", cann)]:
        assert any(version in row for row in matrix), f"{name}=={version} is not in the docs/ascend.md matrix"
        assert version in readme, f"{name}=={version} is not in docker/README.md"


def test_verify_pins_flags_wrong_and_missing_versions():
    """docker/verify_pins.py passes installed pins (local labels ignored) and exits 1 on a wrong or absent one."""
    import torch

    script = DOCKER_DIR / "verify_pins.py"
    public = torch.__version__.split("+")[0]  # e.g. 2.13.0+cpu installed, pinned as 2.13.0
    ok = subprocess.run([sys.executable, str(script), f"torch=={public}"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run(
        [sys.executable, str(script), f"torch=={public}", "torch<1", "surely-not-installed-pkg==1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert "WRONG    torch" in bad.stdout and "MISSING  surely-not-installed-pkg" in bad.stdout


def test_every_registered_model_patch_is_in_the_ascend_guide():
    """The start-up report's patch names are all explained in docs/ascend.md (report lines must be readable)."""
    from verl.models.transformers.patch_registry import PATCH_REGISTRY, _load_builtin_patches

    _load_builtin_patches()
    names = set(PATCH_REGISTRY.patches)
    assert "qwen3_5-varlen-gdn" in names
    guide = ASCEND_GUIDE.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in guide)
    assert not missing, f"patches not documented in docs/ascend.md: {missing}"


@pytest.mark.slow
@pytest.mark.e2e
def test_cpu_smoke_recipe_trains_one_step(tmp_path: Path):
    """The smoke recipe, run as a user runs it, finishes one GRPO step on the CPU and logs its metrics."""
    import json

    from verl.utils.tracking import METRICS_FILE

    script = RECIPE_DIR / "run_qwen3_5_tiny_grpo_cpu_smoke.sh"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "QUICKSTART_DIR": str(tmp_path / "qs"),
        "STEPS": "1",
        "OMP_NUM_THREADS": "1",
        "RAY_AUTH_MODE": "disabled",
    }
    done = subprocess.run(
        ["bash", str(script), "trainer.logger=['console','file']"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "qs" / "logs" / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [1]
    assert any(key.startswith("actor/") for key in records[0]["data"]), sorted(records[0]["data"])
