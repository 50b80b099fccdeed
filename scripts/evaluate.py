"""Check an evaluation before any model work, then hand it to the real `lm_eval` CLI unchanged.

    python scripts/evaluate.py --model_dir runs/stage1 --tasks instella_pretrain_offline \
        [--num_fewshot N] [--limit N] [--output_path runs/eval/stage1] [-- <more lm_eval arguments>]

What is checked (model folder, task names, chat suites, every few-shot prompt against the model's context) and the
exact `lm_eval` command: `instella_recipes/evaluation/preflight.py`.
"""

from instella_recipes.evaluation.preflight import main

if __name__ == "__main__":
    raise SystemExit(main())
