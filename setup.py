"""Package discovery (the rest of the metadata is in pyproject.toml).

Discovery, not a list: every package under ``heatinv/`` ships, and so does every folder under
the top-level ``configs/`` (each a config group), as ``heatinv.configs.<group>`` with its YAML
files. A list of names in pyproject.toml once left ``heatinv.doctor`` out of the wheel.
"""

from setuptools import find_namespace_packages, find_packages, setup

CONFIGS = ["heatinv.configs"] + [f"heatinv.configs.{group}" for group in find_namespace_packages("configs")]

setup(
    packages=find_packages(include=["heatinv", "heatinv.*"]) + CONFIGS,
    package_dir={"heatinv.configs": "configs"},
    package_data={package: ["*.yaml"] for package in CONFIGS},
)
