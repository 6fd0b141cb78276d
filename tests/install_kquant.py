"""Install mlx-kquant for the tests from the prebuilt wheel in ../shared/wheels/, when it is
there and fits this Python and platform; otherwise do nothing (the kquant tests then skip, and
say why). PyPI has only mlx-kquant's sdist, whose build fetches a C library with git, which a
machine without access to git hosts cannot do; ../shared/wheels/README.md says how the wheel
was built. Exits 0 unless an install that was attempted failed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename


def main() -> int:
    if importlib.util.find_spec("mlx_kquant") is not None:
        return 0
    wheels = Path(__file__).resolve().parents[2] / "shared" / "wheels"
    supported = set(sys_tags())
    for whl in sorted(wheels.glob("mlx_kquant-*.whl")) if wheels.is_dir() else []:
        if set(parse_wheel_filename(whl.name)[3]) & supported:
            print(f"install_kquant: installing {whl.name}", flush=True)
            return subprocess.call([sys.executable, "-m", "pip", "install", "-q", str(whl)])
    print("install_kquant: no mlx-kquant wheel for this machine; the kquant tests will skip", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
