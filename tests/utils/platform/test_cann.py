"""CANN version detection from the toolkit install-info file, ordering of CANN versions, and feature gates."""

import platform

import pytest
from packaging.version import Version

from verl.utils.platform import cann


def _write_info(root, text):
    arch_dir = root / f"{platform.machine()}-linux"
    arch_dir.mkdir(parents=True)
    (arch_dir / cann.INSTALL_INFO_NAME).write_text(text)


@pytest.fixture
def toolkit(tmp_path, monkeypatch):
    """A fake toolkit root exported as ASCEND_HOME_PATH (what set_env.sh does); no other toolkit is visible."""
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setattr(cann, "DEFAULT_TOOLKIT_HOME", str(tmp_path / "absent"))
    return tmp_path


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8.5.RC1", "8.5rc1"),
        ("8.5.1", "8.5.1"),
        ("8.0.rc3", "8.0rc3"),
        ("9.1.0", "9.1.0"),
        ("8.3.T10", "8.3"),  # internal build tag dropped, release kept
        ("8.5.0.alpha003", "8.5.0a3"),
        ("", None),
        ("unknown", None),
    ],
)
def test_parse_cann_version(text, expected):
    """CANN strings parse into packaging Versions (RC → pre-release); garbage gives None."""
    parsed = cann.parse_cann_version(text)
    assert parsed == (None if expected is None else Version(expected))


def test_rc_orders_before_release():
    """CANN's release order: 8.5.RC1 < 8.5.0 < 8.5.1 < 9.0.0."""
    order = [cann.parse_cann_version(v) for v in ("8.5.RC1", "8.5.0", "8.5.1", "9.0.0")]
    assert order == sorted(order)


def test_get_cann_version_reads_version_line(toolkit):
    """The `version=` line of <ASCEND_HOME_PATH>/<arch>-linux/ascend_toolkit_install.info is the version."""
    _write_info(toolkit, "package_name=Ascend-cann-toolkit\nversion=8.5.RC1\ninnerversion=V100R001C25\n")
    assert cann.get_cann_version() == Version("8.5rc1")
    assert cann.get_npu_versions()[1] == "8.5rc1"


def test_no_toolkit_means_unknown(toolkit):
    """Without any install-info file the version is None (a CPU machine)."""
    assert cann.get_cann_version() is None


def test_require_cann_old_version_fails_with_feature_and_fix(toolkit):
    """A feature that needs a newer CANN fails with one message naming the feature, both versions and set_env.sh."""
    _write_info(toolkit, "version=8.5.0\n")
    with pytest.raises(RuntimeError) as info:
        cann.require_cann_feature("conv3d-patch-embed")
    msg = str(info.value)
    assert "conv3d-patch-embed needs CANN >= 8.5.1" in msg and "CANN 8.5.0 is installed" in msg
    assert "segfaults" in msg and "matmul patch embedding" in msg
    assert not cann.cann_supports("conv3d-patch-embed")


def test_require_cann_new_enough_passes(toolkit):
    """CANN 8.5.1 satisfies the Conv3d patch-embedding requirement; the version is returned."""
    _write_info(toolkit, "version=8.5.1\n")
    assert cann.require_cann("8.5.1", "conv3d") == Version("8.5.1")
    assert cann.cann_supports("conv3d-patch-embed")


def test_require_cann_unknown_version_names_search_paths(toolkit):
    """With no detectable CANN the error lists where it looked and how to export ASCEND_HOME_PATH."""
    with pytest.raises(RuntimeError, match="ASCEND_HOME_PATH") as info:
        cann.require_cann("8.5.1", "vision tower")
    assert str(toolkit) in str(info.value)
    assert not cann.cann_supports("conv3d-patch-embed")  # unknown counts as unsupported: take the safe path


def test_unknown_feature_and_bad_min_version():
    """Programming errors name the known features / the unparseable version."""
    with pytest.raises(ValueError, match="known"):
        cann.cann_supports("warp-drive")
    with pytest.raises(ValueError, match="min_version"):
        cann.require_cann("latest", "x", version=Version("8.5.1"))


def test_npu_smi_software_version_and_ipc_rule():
    """npu-smi's 'Software Version' line is the driver version; IPC needs driver>=25.3.rc1 and CANN>=8.3.rc1."""
    text = "        NPU ID                         : 0\n        Software Version               : 25.3.rc1\n"
    assert cann.parse_npu_smi_software_version(text) == "25.3.rc1"
    assert cann.check_ipc_version_support("25.3.rc1", "8.3.RC1")
    assert not cann.check_ipc_version_support("25.2.0", "8.5.0")
    assert not cann.check_ipc_version_support("25.3.rc1", "8.2.RC1")
    assert not cann.check_ipc_version_support(None, "8.5.0")
