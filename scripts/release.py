"""Turn any stage output into a Hub-ready folder (shards + index, remote code, tokenizer with chat template,
generation config, model card with the resolved hyperparameters and the eval table); the work is in
`instella_recipes.checkpoint.release`.

    python scripts/release.py --model_dir runs/demo/dpo --output_dir runs/demo/release \
        [--eval_results runs/demo/eval_dpo ...] [--push_to_hub --repo_id org/name]
"""

from instella_recipes.checkpoint.release import main

if __name__ == "__main__":
    raise SystemExit(main())
