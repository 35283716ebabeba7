set -u
O=$OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
mkdir -p /tmp/pp && ln -sfn $PWD/kernels /tmp/pp/grpo_kernels && ln -sfn $PWD/presets /tmp/pp/grpo_tui_presets
export PYTHONPATH=/tmp/pp:$PWD:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 GRPO_TUI_CACHE_DIR=/tmp/grpo-cache TOKENIZERS_PARALLELISM=false
timeout 60 python3 .scratch/sweep.py > $O/sweep.log 2>&1
cut -c1-400 $O/sweep.log | tail -3
python3 -c "from grpo_tui.tasks.shapes import build_shaped_model as b; print(b('qwen3-0.6b-shape'))" > /dev/null 2>&1
timeout 150 python3 .scratch/gen_best.py --data .devdata/gsm8k/test.jsonl --backends graph@triton --batches 512 --samples 512 --budget-s 140 --out $O/generation > $O/gen.log 2>&1
tail -6 $O/gen.log
