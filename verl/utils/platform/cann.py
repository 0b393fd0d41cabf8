"""CANN toolkit and Ascend driver versions, and the features that need a minimum CANN.

CANN writes ``version=<v>`` into ``<toolkit>/<arch>-linux/ascend_toolkit_install.info``; ``<toolkit>`` is
``$ASCEND_HOME_PATH`` (exported by ``source /usr/local/Ascend/ascend-toolkit/set_env.sh``), else
``$ASCEND_TOOLKIT_HOME``, else the default install ``/usr/local/Ascend/ascend-toolkit/latest``. Versions such
as ``8.5.RC1``, ``8.5.0``, ``8.5.1`` are parsed into :class:`packaging.version.Version`, in which an RC
precedes its release (``8.5.RC1 < 8.5.0 < 8.5.1``), matching CANN's own release order.
"""

from __future__ import annotations

import logging
import os
import platform as _pyplatform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)

DEFAULT_TOOLKIT_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
INSTALL_INFO_NAME = "ascend_toolkit_install.info"
SET_ENV_HINT = "source /usr/local/Ascend/ascend-toolkit/set_env.sh"


def parse_cann_version(text: str) -> Version | None:
    """``"8.5.RC1"`` → ``Version("8.5rc1")``; ``"8.5.1"`` → ``Version("8.5.1")``; unparseable → None.

    Internal builds append tags (``8.5.0.alpha003``, ``8.3.T10``); a tag packaging cannot read is dropped and
    the numeric release is kept, so the version still orders against the table of known-bad releases.
    """
    text = text.strip().strip("\"'")
    if not text:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        pass
    match = re.match(r"^(\d+(?:\.\d+)*)(?:\.?(rc)\.?(\d+))?", text, flags=re.IGNORECASE)
    if match is None:
        return None
    release, rc, rc_num = match.groups()
    try:
        return Version(f"{release}rc{rc_num}" if rc else release)
    except InvalidVersion:
        return None


def _version_from_info(path: Path) -> Version | None:
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "version":
            return parse_cann_version(value)
    return None


def toolkit_install_info_candidates() -> list[Path]:
    """Where the install-info file is looked for, in order (env overrides first)."""
    arch_dir = f"{_pyplatform.machine()}-linux"
    roots = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"), DEFAULT_TOOLKIT_HOME]
    paths: list[Path] = []
    for root in roots:
        if root:
            paths += [Path(root) / arch_dir / INSTALL_INFO_NAME, Path(root) / INSTALL_INFO_NAME]
    return paths


def get_cann_version() -> Version | None:
    """The installed CANN toolkit version, or None when no install-info file is found (e.g. no CANN)."""
    for path in toolkit_install_info_candidates():
        if path.is_file():
            version = _version_from_info(path)
            if version is None:
                logger.warning("%s has no parseable 'version=' line", path)
            return version
    return None


def parse_npu_smi_software_version(text: str) -> str | None:
    """The ``Software Version`` field of ``npu-smi info -t board -i <id>`` output (driver version), if any."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == "software version":
            return value.strip()
    return None


def get_driver_version(timeout_s: float = 10.0) -> str | None:
    """The Ascend driver ("software") version from ``npu-smi``; None without ``npu-smi`` or on failure."""
    if shutil.which("npu-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["npu-smi", "info", "-t", "board", "-i", "0"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("npu-smi failed: %s", e)
        return None
    return parse_npu_smi_software_version(out.stdout)


def get_npu_versions() -> tuple[str | None, str | None]:
    """(driver software version, CANN version) as strings, each None when unknown (upstream's name)."""
    cann = get_cann_version()
    return get_driver_version(), None if cann is None else str(cann)


def check_ipc_version_support(software_version: str | None, cann_version: str | None) -> bool:
    """CUDA-IPC-style weight sharing on NPU needs driver >= 25.3.rc1 and CANN >= 8.3.rc1 (upstream's rule)."""
    driver = parse_cann_version(software_version or "")
    cann = parse_cann_version(cann_version or "")
    if driver is None or cann is None:
        return False
    return driver >= Version("25.3rc1") and cann >= Version("8.3rc1")


@dataclass(frozen=True)
class CannRequirement:
    """A feature that is broken (or absent) below a CANN version.

    Attributes:
        feature: short key used by callers (``"conv3d-patch-embed"``).
        min_version: first good CANN version.
        symptom: what happens on older CANN.
        workaround: what to do instead (shown in the error).
    """

    feature: str
    min_version: str
    symptom: str
    workaround: str


KNOWN_CANN_REQUIREMENTS: dict[str, CannRequirement] = {
    r.feature: r
    for r in (
        CannRequirement(
            feature="conv3d-patch-embed",
            min_version="8.5.1",
            symptom="the Conv3d vision patch-embedding operator segfaults (field report item 5)",
            workaround="keep the exactly-equivalent matmul patch embedding (the default on older CANN) or upgrade "
            "CANN to >= 8.5.1",
        ),
        CannRequirement(
            feature="ipc-weight-sharing",
            min_version="8.3.rc1",
            symptom="IPC handles for rollout weight sharing are unsupported",
            workaround="use the shared-memory weight transfer or upgrade CANN to >= 8.3.RC1",
        ),
    )
}


def _unknown_cann_message(feature: str) -> str:
    looked = ", ".join(str(p) for p in toolkit_install_info_candidates())
    return (
        f"{feature} needs a known CANN version, but no {INSTALL_INFO_NAME} was found (looked in: {looked}). "
        f"Run `{SET_ENV_HINT}` (it exports ASCEND_HOME_PATH) or set ASCEND_HOME_PATH to the toolkit directory."
    )


def require_cann(min_version: str, feature: str, *, version: Version | None = None) -> Version:
    """Raise a clear RuntimeError unless the installed CANN is at least ``min_version``; return the version.

    Args:
        min_version: e.g. ``"8.5.1"`` or ``"8.3.RC1"``.
        feature: what needs it, named in the error.
        version: the CANN version to check (default: :func:`get_cann_version`).
    """
    required = parse_cann_version(min_version)
    if required is None:
        raise ValueError(f"require_cann: cannot parse min_version={min_version!r}")
    found = get_cann_version() if version is None else version
    if found is None:
        raise RuntimeError(_unknown_cann_message(feature))
    if found < required:
        raise RuntimeError(
            f"{feature} needs CANN >= {min_version}, but CANN {found} is installed. Upgrade the CANN toolkit "
            f"(and torch_npu built for it), then `{SET_ENV_HINT}`."
        )
    return found


def cann_supports(feature: str, *, version: Version | None = None) -> bool:
    """Whether ``feature`` (a key of :data:`KNOWN_CANN_REQUIREMENTS`) is safe with this CANN.

    An unknown CANN version counts as unsupported, so callers choose the safe path.
    """
    requirement = _lookup(feature)
    found = get_cann_version() if version is None else version
    return found is not None and found >= parse_cann_version(requirement.min_version)


def require_cann_feature(feature: str, *, version: Version | None = None) -> Version:
    """Like :func:`require_cann` for a feature of the known-requirements table; the error adds the workaround."""
    requirement = _lookup(feature)
    try:
        return require_cann(requirement.min_version, feature, version=version)
    except RuntimeError as e:
        raise RuntimeError(f"{e} Below that, {requirement.symptom}. Workaround: {requirement.workaround}.") from None


def _lookup(feature: str) -> CannRequirement:
    try:
        return KNOWN_CANN_REQUIREMENTS[feature]
    except KeyError:
        raise ValueError(f"unknown CANN feature {feature!r}; known: {sorted(KNOWN_CANN_REQUIREMENTS)}") from None
