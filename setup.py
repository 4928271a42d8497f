"""Map the fixed top-level folders into the one ``tidelog`` package.

The map (``model/`` -> ``tidelog.model``, ``backends/`` -> ``tidelog.backends``, ...) is
pyproject.toml's ``[tool.tidelog.package-folders]``, its one source. find_packages runs
under each root so a new subpackage is never forgotten
(a folder without ``__init__.py`` is not a package: tests/packaging/ fails if a .py file is left
out of the wheel). Wheel, sdist and editable (PEP 660) installs all honour this mapping.
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

with open(Path(__file__).resolve().parent / "pyproject.toml", "rb") as f:
    ROOTS: dict[str, str] = tomllib.load(f)["tool"]["tidelog"]["package-folders"]

packages: list[str] = []
package_dir: dict[str, str] = {}
for pkg, folder in ROOTS.items():
    package_dir[pkg] = folder
    packages.append(pkg)
    packages += [f"{pkg}.{sub}" for sub in find_packages(folder)]

setup(
    packages=sorted(set(packages)),
    package_dir=package_dir,
    # PEP 561 marker (shipped once tidelog/py.typed exists); bench's README documents its figures
    package_data={"tidelog": ["py.typed"], "tidelog.bench": ["README.md"]},
)
