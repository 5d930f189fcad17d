#!/usr/bin/env bash
# The nvml measurement path on a real NVIDIA GPU, MEASURE ONLY: it never locks clocks, never
# changes the power limit or any mode of the GPU. About 4-6 minutes in all.
#
#   OUT=/some/folder benchmarks/gpu_check.sh
#
# Writes under $OUT:
#   env.txt                  GPU, driver, Python, torch (nvidia-smi, versions)
#   devices.json/.txt        `powerfl devices --backend nvml`: clocks, power limit now, its
#                            range and default (read-only NVML calls; a fresh state folder,
#                            so no leftover is restored). Alone, in seconds:
#                            ONLY_DEVICES=1 OUT=/some/folder benchmarks/gpu_check.sh
#   nvml-trace.json/.log     a raw NVML trace of ResNet18 training (../shared/tools/gpu/
#                            nvml_trace.py, when found: $NVML_TRACE, ../shared or shared/)
#   check.json / check.txt   `powerfl devices --backend nvml --check`
#   lut.json, profile.log    `powerfl profile --backend nvml --lock-clocks false --model
#                            resnet18 --batch-sizes 4,32,128,256 --no-cache`
#   state/, cache/           the run's GPU state folder (stays empty: nothing is changed) and
#                            LUT cache
#
# Needs: Python 3.10+ with CUDA torch, and numpy, torchvision (matching the torch build) and
# nvidia-ml-py (pynvml). The powerfl package itself need not be installed: it runs from this
# checkout (PYTHONPATH). flwr and the other run-time dependencies are not needed here.
set -u
: "${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export POWERFL_STATE_DIR="$OUT/state"
# `powerfl` from this checkout, as an array so that `timeout` can run it
powerfl=("$PY" -c 'import sys; from simulations.cli import main; sys.exit(main())')

{
    date -u
    nvidia-smi || true
    nvidia-smi -q -d CLOCK,POWER || true
    "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__,
torch.version.cuda, torch.cuda.get_device_name(0))'
    "$PY" -c 'import pynvml; pynvml.nvmlInit(); print("driver", pynvml.nvmlSystemGetDriverVersion())'
} > "$OUT/env.txt" 2>&1

status=0
echo "== powerfl devices --backend nvml (read only: clocks, power limit and its range)"
timeout 60 "${powerfl[@]}" devices --backend nvml --json > "$OUT/devices.json" 2> "$OUT/devices.err" ||
    { echo "devices failed (see devices.err)"; status=1; }
timeout 60 "${powerfl[@]}" devices --backend nvml > "$OUT/devices.txt" 2>&1 || status=1
grep -E "mode|knob|power-limit" "$OUT/devices.txt"
if [ -n "${ONLY_DEVICES:-}" ]; then
    exit $status
fi

trace=""
for candidate in "${NVML_TRACE:-}" ../shared/tools/gpu/nvml_trace.py shared/tools/gpu/nvml_trace.py; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then trace=$candidate; break; fi
done
if [ -n "$trace" ]; then
    echo "== raw NVML trace ($trace), ~45 s"
    timeout 150 "$PY" "$trace" "$OUT/nvml-trace.json" resnet18 > "$OUT/nvml-trace.log" 2>&1 ||
        { echo "nvml_trace.py failed (see nvml-trace.log)"; status=1; }
else
    echo "== raw NVML trace: skipped (nvml_trace.py not found; set NVML_TRACE)" |
        tee "$OUT/nvml-trace.log"
fi

echo "== powerfl devices --backend nvml --check"
timeout 120 "${powerfl[@]}" devices --backend nvml --check --json > "$OUT/check.json" 2> "$OUT/check.err" ||
    { echo "devices --check failed (see check.err)"; status=1; }
timeout 120 "${powerfl[@]}" devices --backend nvml --check --check-seconds 3 > "$OUT/check.txt" 2>&1 ||
    status=1

echo "== powerfl profile --backend nvml --lock-clocks false (cells up to 30 s each)"
timeout 330 "${powerfl[@]}" profile --backend nvml --lock-clocks false --model resnet18 \
    --batch-sizes 4,32,128,256 --no-cache --cache-dir "$OUT/cache" --out "$OUT/lut.json" \
    > "$OUT/profile.log" 2>&1 || { echo "profile failed (see profile.log)"; status=1; }

ls -la "$OUT"
exit $status
