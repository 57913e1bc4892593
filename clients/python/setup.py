"""cuty-client's build: the generated protobuf modules are made from the repository's protos when
the package is built (build_protos.py), so they always match the contracts of the same commit."""
import pathlib
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import build_protos  # noqa: E402


class BuildWithProtos(build_py):
    def run(self):
        super().run()
        build_protos.generate(pathlib.Path(self.build_lib))


setup(cmdclass={"build_py": BuildWithProtos})
