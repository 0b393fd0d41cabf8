"""Device platforms behind ``verl.utils.device`` (the only package allowed to name device families)."""

from verl.utils.platform.base import Platform
from verl.utils.platform.cann import (
    KNOWN_CANN_REQUIREMENTS,
    cann_supports,
    get_cann_version,
    get_npu_versions,
    parse_cann_version,
    require_cann,
    require_cann_feature,
)
from verl.utils.platform.registry import (
    PlatformRegistry,
    detect_platform_name,
    get_platform,
    normalize_platform_name,
    platform_of_device_type,
    reset_platform,
    set_platform,
    use_platform,
    validate_platform,
)

__all__ = [
    "KNOWN_CANN_REQUIREMENTS",
    "Platform",
    "PlatformRegistry",
    "cann_supports",
    "detect_platform_name",
    "get_cann_version",
    "get_npu_versions",
    "get_platform",
    "normalize_platform_name",
    "parse_cann_version",
    "platform_of_device_type",
    "require_cann",
    "require_cann_feature",
    "reset_platform",
    "set_platform",
    "use_platform",
    "validate_platform",
]
