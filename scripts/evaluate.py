"""Check an evaluation before any model work, then hand it to the real `lm_eval` CLI unchanged.

    python scripts/evaluate.py --model_dir runs/stage1 --tasks instella_pretrain_offline \
        [--num_fewshot N] [--limit N] [--output_path runs/eval/stage1] [-- <more lm_eval arguments>]

It runs exactly `lm_eval --model hf --model_args pretrained=<dir>,trust_remote_code=True --include_path eval/tasks
--tasks ...` (plus your extra arguments) after checking, from configs, tokenizers and the task data only:
- the model folder exists and is a model (config.json readable, tokenizer loadable);
- every task or group name is known (ours under eval/tasks, or lm-eval's own);
- the instruct suite (chat-formatted, so `--apply_chat_template` is added) is not mixed with base-model tasks, and the
  model has a chat template for it;
- no few-shot prompt (context + continuation, or context + max_gen_toks for generation) is longer than the model's
  context (lm-eval itself would silently cut the prompt from the left and score a different task).
The context check builds the requests of tasks whose data is local (the offline suites); online tasks are checked
for their names only, since building them downloads the datasets.
"""

from instella_recipes.evaluation.preflight import main

if __name__ == "__main__":
    raise SystemExit(main())
