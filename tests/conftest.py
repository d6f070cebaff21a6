"""Every test carries the marker of its tier, taken from its folder (tests/unit -> ``unit``, ...).

So ``-m unit`` (the fast tier) selects every test under tests/unit, whether or not its
module sets ``pytestmark``, and a test can never fall outside every tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

#: Folder under tests/ -> the marker of its tier.
TIERS = {"unit": "unit", "integration": "integration", "notebooks": "notebook"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.path)).resolve().relative_to(HERE).parts
        tier = TIERS.get(parts[0]) if len(parts) > 1 else None
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in one of tests/{{{','.join(TIERS)}}}/")
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
