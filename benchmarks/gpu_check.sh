#!/usr/bin/env bash
# The GPU check of issue #44 in one call of at most 10 minutes (docs/benchmarks.md#gpu):
# make run on the GPU, the performance benchmark with the GPU's peak, and the published
# IMDB study at the paper's settings, each table written to the output folder as it ends.
#
#   bash benchmarks/gpu_check.sh [--out DIR] [--dry-run] [other options of python -m benchmarks gpu]
#
# Output folder: --out, else $OUT (what the device tool returns), else outputs/gpu_check.
# Where the working tree carries .gpu-carry/ (python -m benchmarks gpu_pack, run before on
# a machine with the package registry), the machine's own python3 is used: the carried
# packages, model and data are unpacked under $GPU_CHECK_ROOT (default /tmp/saleval-gpu)
# and put on PYTHONPATH and SALEVAL_DATA_ROOT. Elsewhere .venv/bin/python (make setup).
# The script keeps going past a failing step; it exits 0 only when every step ran.
set -uo pipefail
export GPU_CHECK_START="${GPU_CHECK_START:-$(date +%s)}"
cd "$(dirname "$0")/.." || exit 2

out="${OUT:-outputs/gpu_check}"
prev=""
for arg in "$@"; do
    [ "$prev" = "--out" ] && out="$arg"
    case "$arg" in --out=*) out="${arg#--out=}" ;; esac
    prev="$arg"
done
mkdir -p "$out"
log="$out/setup.log"
: > "$log"
say() { echo "[gpu-check] $*" | tee -a "$log"; }

if [ -d .gpu-carry ]; then
    root="${GPU_CHECK_ROOT:-/tmp/saleval-gpu}"
    py="${GPU_CHECK_PYTHON:-python3}"  # the machine's own; another only to rehearse elsewhere
    say "carried set-up: $(grep -E '"(packed|commit|code_digest|python|total_bytes)"' .gpu-carry/manifest.json 2>/dev/null | tr -d ' \n')"
    rm -rf "$root"
    if ! "$py" -m benchmarks.gpu_pack unpack --carry .gpu-carry --to "$root" >>"$log" 2>&1; then
        say "unpacking .gpu-carry failed (see $log); the steps run with what is there"
    fi
    export PYTHONPATH="$root/site:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export SALEVAL_DATA_ROOT="$root/data"
elif [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=python3
    export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

say "python: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])' 2>&1)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$log" 2>&1
fi
# opt-in (~20 s): a missing package also shows in the failing step's log tail in summary.md
if [ "${GPU_CHECK_IMPORTS:-0}" = 1 ] && ! "$py" -m benchmarks.gpu_pack check >>"$log" 2>&1; then
    say "some imports fail (see $log); the steps that need them will fail and say so"
fi
say "set-up took $(( $(date +%s) - GPU_CHECK_START )) s"

"$py" -m benchmarks gpu --out "$out" "$@"
code=$?
say "exit status $code; tables in $out"
exit $code
