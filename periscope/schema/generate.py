"""Generate Python protobuf/gRPC code and typed stubs (.pyi) from protos/.

`python -m periscope.schema.generate` writes into the source tree; `generate(root, out)` can write
elsewhere, which the staleness test uses to compare a fresh generation with what is committed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (include root under protos/, output package dir relative to out root, python package prefix)
_TREES: tuple[tuple[str, str, str], ...] = (
    ("", "", ""),                      # protos/periscope/v1 -> periscope/v1 (import path matches)
    ("k8s", "periscope/k8s", "periscope.k8s"),  # protos/k8s/... -> periscope/k8s/...
)


def _protos(root: Path, sub: str) -> list[Path]:
    base = root / "protos" / sub if sub else root / "protos" / "periscope"
    return sorted(base.rglob("*.proto"))


def _fix_imports(path: Path, prefix: str) -> None:
    # grpc/mypy plugins import sibling modules by their proto path ("from podresources.v1 import
    # api_pb2"); our k8s tree lives under periscope.k8s, so qualify those imports.
    text = path.read_text()
    fixed = re.sub(r"^from ((?:podresources|deviceplugin)\.)", rf"from {prefix}.\1", text, flags=re.M)
    fixed = re.sub(r"^import ((?:podresources|deviceplugin)\.)", rf"import {prefix}.\1", fixed, flags=re.M)
    if fixed != text:
        path.write_text(fixed)


def generate(root: Path = ROOT, out: Path = ROOT) -> list[Path]:
    """Run protoc for both trees; return the generated files (relative to `out`)."""
    import grpc_tools
    from grpc_tools import protoc  # dev dependency, only needed when regenerating

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    produced: list[Path] = []
    for sub, pkg_dir, prefix in _TREES:
        include = root / "protos" / sub if sub else root / "protos"
        target = out / pkg_dir if pkg_dir else out
        target.mkdir(parents=True, exist_ok=True)
        files = [str(p.relative_to(include)) for p in _protos(root, sub)]
        plugins = Path(sys.executable).parent
        args = [
            "protoc",
            f"--plugin=protoc-gen-mypy={plugins / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={plugins / 'protoc-gen-mypy_grpc'}",
            f"-I{include}",
            f"-I{well_known}",
            f"--python_out={target}",
            f"--mypy_out={target}",
        ]
        if sub:
            args += [f"--grpc_python_out={target}", f"--mypy_grpc_out={target}"]
        rc = protoc.main([*args, *files])
        if rc != 0:
            raise SystemExit(f"protoc failed ({rc}) for protos/{sub or 'periscope'}")
        for f in files:
            stem = Path(f).with_suffix("")
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
                gen = target / f"{stem}{suffix}"
                if gen.exists():
                    if prefix:
                        _fix_imports(gen, prefix)
                    produced.append(gen.relative_to(out))
            # every generated directory is a package
            d = (target / f).parent
            while d != out and d.is_relative_to(out):
                init = d / "__init__.py"
                if not init.exists():
                    init.write_text("")
                if init.relative_to(out) not in produced:
                    produced.append(init.relative_to(out))
                if d == (out / "periscope"):
                    break
                d = d.parent
    return sorted(set(produced))


if __name__ == "__main__":
    written = generate()
    print(f"generated {len(written)} files", file=sys.stderr)
