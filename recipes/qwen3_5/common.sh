# Shared helpers of the Qwen3.5 recipes; sourced, never run. Each recipe keeps its own Hydra overrides in a
# delimited `OVERRIDES=( ... )` block (tests/recipes/test_recipes_parse.py checks every key against the config
# tree), so the only things shared here are the environment and the launcher.
#
# Environment variables understood by every recipe (defaults in brackets):
#   PYTHON                     interpreter [python3]
#   VERL_PRINT_OVERRIDES=1     print the expanded Hydra overrides, one per line, and exit (used by the tests)
#   VERL_SKIP_DATA_CHECK=1     do not check that the parquet files exist before launching
#   ASCEND_HOME                CANN install root whose set_env.sh files are sourced [/usr/local/Ascend]
#   HCCL_CONNECT_TIMEOUT       seconds HCCL waits to set up a link [1500; HCCL's own default, 120, is too short
#                              when a 35B model is still loading on some ranks]
#   HCCL_EXEC_TIMEOUT          seconds a collective may wait for its peers [1800]
#   VERL_NIC                   network interface of the cluster network (e.g. enp189s0f0); when set,
#                              HCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME default to it

PYTHON=${PYTHON:-python3}

# Load the CANN toolkit (and NNAL/ATB) environment when it is installed and not loaded yet. Without it torch_npu
# fails with "libhccl.so: cannot open shared object file" and vllm-ascend with "libatb.so ...".
# Sourced from an interactive shell as well as from the recipes: the caller's shell options (set -u, -e, ...) are
# the same afterwards (`local -` restores them when the function returns).
verl_source_cann_env() {
    local -
    local root=${ASCEND_HOME:-/usr/local/Ascend}
    local script
    for script in "${root}/ascend-toolkit/set_env.sh" "${root}/cann/set_env.sh" "${root}/nnal/atb/set_env.sh"; do
        if [[ -f "${script}" ]]; then
            # CANN's scripts read unset variables (LD_LIBRARY_PATH, PYTHONPATH): relax nounset while sourcing.
            set +u
            # shellcheck disable=SC1090
            source "${script}"
        fi
    done
}

# HCCL and Ray settings for Ascend clusters; values the user exported already are kept.
verl_export_ascend_env() {
    verl_source_cann_env
    export HCCL_CONNECT_TIMEOUT=${HCCL_CONNECT_TIMEOUT:-1500}
    export HCCL_EXEC_TIMEOUT=${HCCL_EXEC_TIMEOUT:-1800}
    # Which NIC HCCL's host side and gloo (CPU collectives) use: the first interface is often a management or
    # docker bridge that the other node cannot reach, and the first collective then hangs until the timeout.
    if [[ -n "${VERL_NIC:-}" ]]; then
        export HCCL_SOCKET_IFNAME=${HCCL_SOCKET_IFNAME:-${VERL_NIC}}
        export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-${VERL_NIC}}
    fi
    # Fixed port ranges keep multi-node HCCL behind firewalls predictable (one range for host, one for device).
    export HCCL_HOST_SOCKET_PORT_RANGE=${HCCL_HOST_SOCKET_PORT_RANGE:-60000-60050}
    export HCCL_NPU_SOCKET_PORT_RANGE=${HCCL_NPU_SOCKET_PORT_RANGE:-61000-61050}
    # Ray must not rewrite ASCEND_RT_VISIBLE_DEVICES per actor: workers pick their NPU from the local rank.
    export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1
}

# verl_check_files VAR... : every named variable must hold an existing local file (remote URLs are not checked).
verl_check_files() {
    [[ "${VERL_SKIP_DATA_CHECK:-0}" == 1 || "${VERL_PRINT_OVERRIDES:-0}" == 1 ]] && return 0
    local name path
    for name in "$@"; do
        path=${!name}
        if [[ "${path}" != *://* && ! -e "${path}" ]]; then
            echo "error: ${name}=${path} does not exist. Prepare it with examples/data_preprocess/*.py" \
                "(see docs/recipes.md), or export ${name}=<path>." >&2
            exit 2
        fi
    done
}

# verl_launch MODULE ARG... : run `python -m MODULE ARG...`, or, with VERL_PRINT_OVERRIDES=1, print the Hydra
# overrides among ARG (everything not starting with `--`) one per line instead.
verl_launch() {
    local module=$1
    shift
    if [[ "${VERL_PRINT_OVERRIDES:-0}" == 1 ]]; then
        local arg
        for arg in "$@"; do
            [[ "${arg}" == --* ]] || printf '%s\n' "${arg}"
        done
        return 0
    fi
    echo "+ ${PYTHON} -m ${module} $*" >&2
    exec "${PYTHON}" -m "${module}" "$@"
}

