# The device image's environment for this repository, sourced from its root by benchmarks/gpu_e2e.sh and by
# one-off device scripts (`source benchmarks/gpu_env.sh || exit 1`): the packages the image lacks, installed
# from the wheels in .whl/ into /tmp/site; the project's packages from their folders without installing it
# (each folder carries its import name: grpo_tui/, kernels/grpo_kernels/, presets/grpo_tui_presets/); offline
# Hugging Face; one model cache for every run.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export GRPO_TUI_CACHE_DIR=/tmp/grpo-cache
# Once per machine: a second script sourcing this while the first runs must not reinstall under it.
if [ -d .whl ] && [ ! -e /tmp/site/.grpo-tui-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  touch /tmp/site/.grpo-tui-wheels
fi
export PYTHONPATH=$PWD:$PWD/kernels:$PWD/presets:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
